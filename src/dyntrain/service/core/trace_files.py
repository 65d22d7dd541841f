"""Capacity trace files in either format: the project's CSV, or the public JSON spot traces.

Pure apart from reading the file. The JSON format is that of the public AWS spot traces
(skypilot-org/spot-traces, the data of *Can't Be Late: Optimizing Spot Instance Savings under
Deadlines*, Wu et al., NSDI 2024; copies with their attribution in ``traces/spot/``)::

    {"metadata": {"gap_seconds": 300}, "data": [0, 0, 5, 16, 16, ...]}

one whole number of slots per tick of ``gap_seconds``: tick ``i`` holds from ``i * gap`` to
``(i + 1) * gap``. It becomes a ``CapacityTrace`` with one row per change and a last row at
``len(data) * gap`` (the end of one period when it loops), priced at ``price`` per slot-hour
when given (the public traces carry no price).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from dyntrain.service.core.capacity import CapacityTrace, TraceRow, parse_trace
from dyntrain.service.core.model import ValidationError


def parse_json_trace(text: str, source: str = "<trace>", *, price: float | None = None,
                     loop: bool = False) -> CapacityTrace:
    """A trace from the public JSON format (module doc); errors name ``source``."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValidationError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValidationError(f"{source}: expected an object with \"data\": [slots per tick] "
                              "and \"metadata\": {\"gap_seconds\": N}")
    gap = (doc.get("metadata") or {}).get("gap_seconds") if isinstance(doc.get("metadata"),
                                                                        dict) else None
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) \
            or gap <= 0:
        raise ValidationError(f"{source}: metadata.gap_seconds must be a number > 0, "
                              f"got {gap!r}")
    data = doc["data"]
    if not data:
        raise ValidationError(f"{source}: empty trace: \"data\" has no ticks")
    rows: list[TraceRow] = []
    for i, slots in enumerate(data):
        if isinstance(slots, bool) or not isinstance(slots, (int, float)) \
                or not math.isfinite(slots) or slots < 0 or slots != int(slots):
            raise ValidationError(f"{source}: tick {i}: slots must be a whole number >= 0, "
                                  f"got {slots!r}")
        if not rows or rows[-1].slots != int(slots):
            rows.append(TraceRow(float(i * gap), int(slots), price))
    rows.append(TraceRow(float(len(data) * gap), int(data[-1]), price))
    return CapacityTrace(tuple(rows), loop=loop, source=source)


def load_capacity(path: str | Path, *, price: float | None = None,
                  loop: bool = False) -> CapacityTrace:
    """Read a capacity trace file: JSON (the public format) when it starts with ``{``, else
    the project's CSV. ``price`` prices a JSON trace; a CSV trace keeps its own prices."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValidationError(f"cannot read capacity trace {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValidationError(f"cannot read capacity trace {path}: not a text file") from None
    if text.lstrip().startswith("{"):
        return parse_json_trace(text, str(path), price=price, loop=loop)
    return parse_trace(text, source=str(path), loop=loop)


def scale_time(trace: CapacityTrace, factor: float) -> CapacityTrace:
    """The same trace played ``factor`` times faster (offsets divided by ``factor``)."""
    if not factor > 0:
        raise ValidationError(f"time factor must be > 0, got {factor!r}")
    return CapacityTrace(tuple(replace(r, offset_s=r.offset_s / factor) for r in trace.rows),
                         loop=trace.loop, source=trace.source)


def to_csv(trace: CapacityTrace) -> str:
    """The trace as the project's CSV text (what ``dyntrain ce trace`` sends the service)."""
    priced = trace.has_price
    lines = ["offset_s,slots,price" if priced else "offset_s,slots"]
    for r in trace.rows:
        lines.append(f"{r.offset_s:g},{r.slots},{r.price:g}" if priced
                     else f"{r.offset_s:g},{r.slots}")
    return "\n".join(lines) + "\n"

