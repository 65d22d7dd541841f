"""Capacity over time: spot traces, reserved pools, and the slots that appear or are taken back.

Pure: nothing here starts, signals or sleeps. A controller asks ``at(elapsed)`` what an
environment offers now, ``next_change_after(elapsed)`` when to look again, and ``diff_capacity``
what changed, and turns slots that were taken back into graceful preemptions.

Trace format (CSV text, ``#`` starts a comment, blank lines are ignored)::

    # spot capacity granted by the provider
    offset_s,slots,price
    0,2,0.32
    20,4,0.34
    60,1,0.41

``offset_s`` is seconds since the start (>= 0, never going backwards), ``slots`` a whole number
>= 0 and ``price`` (an optional column) the price per slot-hour, >= 0. The trace is a step
function: at ``elapsed`` the last row whose offset is <= ``elapsed`` holds; before the first row,
the first row's values hold. Of several rows with the same offset, the last one wins.

``duration`` is the last row's offset. Without ``loop`` the last row holds forever. With
``loop`` the trace repeats with a period of ``duration``: the last row marks the end of one
period, and at ``duration`` the trace starts again with its first row (so the last row's values
are only used by a trace that does not loop; give it the values the trace ends with).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dyntrain.service.core.model import CapacityType, ValidationError

HEADER = ("offset_s", "slots", "price")


@dataclass(frozen=True)
class TracePoint:
    """What a trace offers at one moment; ``price`` is None when the trace has no price column."""

    slots: int
    price: float | None = None


@dataclass(frozen=True)
class TraceRow:
    offset_s: float
    slots: int
    price: float | None = None

    @property
    def point(self) -> TracePoint:
        return TracePoint(self.slots, self.price)


def _check_row(row: TraceRow, where: str) -> None:
    if not (isinstance(row.offset_s, (int, float)) and math.isfinite(row.offset_s)
            and row.offset_s >= 0):
        raise ValidationError(f"{where}: offset_s must be a finite number >= 0, "
                              f"got {row.offset_s!r}")
    if isinstance(row.slots, bool) or not isinstance(row.slots, int) or row.slots < 0:
        raise ValidationError(f"{where}: slots must be a whole number >= 0, got {row.slots!r}")
    if row.price is not None and not (isinstance(row.price, (int, float))
                                      and math.isfinite(row.price) and row.price >= 0):
        raise ValidationError(f"{where}: price must be a finite number >= 0, got {row.price!r}")


@dataclass(frozen=True)
class CapacityTrace:
    """Slots (and optionally a price) over elapsed seconds; see the module doc for the model."""

    rows: tuple[TraceRow, ...]
    loop: bool = False
    source: str = "<trace>"
    _offsets: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _points: tuple[TracePoint, ...] = field(init=False, repr=False, compare=False)
    _changes: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rows = tuple(self.rows)
        object.__setattr__(self, "rows", rows)
        if not rows:
            raise ValidationError(f"{self.source}: empty trace: it needs at least one row")
        priced = rows[0].price is not None
        for i, row in enumerate(rows):
            where = f"{self.source}: row {i + 1}"
            _check_row(row, where)
            if (row.price is not None) != priced:
                raise ValidationError(f"{where}: either every row has a price or none does")
            if i and row.offset_s < rows[i - 1].offset_s:
                raise ValidationError(f"{where}: offset_s {row.offset_s:g} goes backwards (the "
                                      f"previous row is at {rows[i - 1].offset_s:g})")
        # One entry per distinct offset; the last row of an offset wins.
        offsets: list[float] = []
        points: list[TracePoint] = []
        for row in rows:
            if offsets and offsets[-1] == row.offset_s:
                points[-1] = row.point
            else:
                offsets.append(float(row.offset_s))
                points.append(row.point)
        object.__setattr__(self, "_offsets", tuple(offsets))
        object.__setattr__(self, "_points", tuple(points))
        period = offsets[-1]
        if self.loop and len(offsets) > 1:
            # Within one period [0, P): the rows before P; the wrap at P goes back to the first.
            inner = [i for i, o in enumerate(offsets) if o < period]
            changes = [offsets[i] for i in inner[1:] if points[i] != points[i - 1]]
            if points[inner[-1]] != points[0]:
                changes.append(period)
        else:
            changes = [offsets[i] for i in range(1, len(offsets)) if points[i] != points[i - 1]]
        object.__setattr__(self, "_changes", tuple(changes))

    @property
    def duration(self) -> float:
        """The last row's offset: the length of one period when the trace loops."""
        return self._offsets[-1]

    @property
    def has_price(self) -> bool:
        return self._points[0].price is not None

    @property
    def max_slots(self) -> int:
        return max(p.slots for p in self._points)

    def _looping(self) -> bool:
        return self.loop and self.duration > 0

    def at(self, elapsed_s: float) -> TracePoint:
        """Slots and price at ``elapsed_s`` seconds since the start."""
        t = float(elapsed_s)
        if self._looping() and t >= self.duration:
            t = math.fmod(t, self.duration)
        i = bisect.bisect_right(self._offsets, t) - 1
        return self._points[max(i, 0)]

    def slots_at(self, elapsed_s: float) -> int:
        return self.at(elapsed_s).slots

    def next_change_after(self, elapsed_s: float) -> float | None:
        """The first time strictly after ``elapsed_s`` at which ``at()`` gives something else;
        None when nothing changes any more (a trace that does not loop, past its last change)."""
        t = float(elapsed_s)
        changes = self._changes
        if not changes:
            return None
        if not self._looping():
            i = bisect.bisect_right(changes, t)
            return changes[i] if i < len(changes) else None
        period = self.duration
        base = max(0.0, math.floor(t / period) * period)
        i = bisect.bisect_right(changes, t - base)
        if i < len(changes):
            return base + changes[i]
        return base + period + changes[0]

    def changes_until(self, end_s: float, start_s: float = 0.0) -> list[tuple[float, TracePoint]]:
        """``(time, point)`` for the start and for every change in ``(start_s, end_s]``."""
        out = [(float(start_s), self.at(start_s))]
        t = self.next_change_after(start_s)
        while t is not None and t <= end_s:
            out.append((t, self.at(t)))
            t = self.next_change_after(t)
        return out


def _number(text: str, name: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"{where}: {name} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValidationError(f"{where}: {name} {text!r} is not a finite number")
    if value < 0:
        raise ValidationError(f"{where}: {name} must be >= 0, got {text}")
    return value


def parse_trace(text: str, source: str = "<trace>", *, loop: bool = False) -> CapacityTrace:
    """Parse a capacity trace from CSV text; ``source`` names it in error messages."""
    header: tuple[str, ...] | None = None
    rows: list[TraceRow] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        cells = [c.strip() for c in line.split(",")]
        if header is None:
            names = tuple(c.lower() for c in cells)
            if names not in (HEADER[:2], HEADER):
                raise ValidationError(f"{where}: bad header {line!r}: expected "
                                      "'offset_s,slots' or 'offset_s,slots,price'")
            header = names
            continue
        if len(cells) != len(header):
            raise ValidationError(f"{where}: expected {len(header)} values "
                                  f"({','.join(header)}), got {len(cells)}")
        offset = _number(cells[0], "offset_s", where)
        slots_f = _number(cells[1], "slots", where)
        if slots_f != int(slots_f):
            raise ValidationError(f"{where}: slots must be a whole number, got {cells[1]}")
        price = _number(cells[2], "price", where) if len(header) == 3 else None
        if rows and offset < rows[-1].offset_s:
            raise ValidationError(f"{where}: offset_s {cells[0]} goes backwards (the previous "
                                  f"row is at {rows[-1].offset_s:g})")
        rows.append(TraceRow(offset, int(slots_f), price))
    if header is None:
        raise ValidationError(f"{source}: empty trace: no header and no rows")
    if not rows:
        raise ValidationError(f"{source}: empty trace: a header but no rows")
    return CapacityTrace(tuple(rows), loop=loop, source=source)


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise ValidationError(f"cannot read capacity trace {path}: "
                              f"{e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValidationError(f"cannot read capacity trace {path}: not a text file") from None


def load_trace(path: str | Path, *, loop: bool = False) -> CapacityTrace:
    """Read and parse a trace file; errors name the file and line."""
    return parse_trace(_read(path), source=str(path), loop=loop)


@dataclass(frozen=True)
class CapacityChange:
    """How an environment's slots moved: ``added`` appeared, ``removed`` must be taken back
    (the controller turns those into graceful preemptions)."""

    previous: int
    current: int

    @property
    def added(self) -> int:
        return max(0, self.current - self.previous)

    @property
    def removed(self) -> int:
        return max(0, self.previous - self.current)

    @property
    def delta(self) -> int:
        return self.current - self.previous

    def __bool__(self) -> bool:
        return self.current != self.previous


def diff_capacity(previous_slots: int, new_slots: int) -> CapacityChange:
    for name, v in (("previous_slots", previous_slots), ("new_slots", new_slots)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValidationError(f"{name} must be a whole number >= 0, got {v!r}")
    return CapacityChange(previous_slots, new_slots)


@dataclass(frozen=True)
class ReservedPool:
    """``total_slots`` RESERVED slots, of which other (non-training) work claims some over time;
    elastic jobs may borrow the rest: ``lendable(t) = total_slots - claimed(t)``.

    ``lendable_trace`` is a ``CapacityTrace`` whose slots are the slots free to lend (its price,
    if any, the internal price per slot-hour), so a controller can treat the pool like any other
    trace. Build one from claims with ``from_claims`` or from a lendable trace with
    ``from_lendable``.
    """

    total_slots: int
    lendable_trace: CapacityTrace
    capacity_type: CapacityType = field(default=CapacityType.RESERVED, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.total_slots, bool) or not isinstance(self.total_slots, int) \
                or self.total_slots < 0:
            raise ValidationError(f"reserved pool: total_slots must be a whole number >= 0, "
                                  f"got {self.total_slots!r}")
        for row in self.lendable_trace.rows:
            if row.slots > self.total_slots:
                raise ValidationError(
                    f"{self.lendable_trace.source}: {row.slots} slots to lend at "
                    f"{row.offset_s:g} s but the pool has only {self.total_slots}")

    @classmethod
    def from_lendable(cls, trace: CapacityTrace, total_slots: int | None = None) -> ReservedPool:
        """``trace`` gives the slots free to lend; the pool's size defaults to its maximum."""
        return cls(trace.max_slots if total_slots is None else total_slots, trace)

    @classmethod
    def from_claims(cls, total_slots: int, claims: CapacityTrace) -> ReservedPool:
        """``claims`` gives the slots other work needs; more than the pool is an error."""
        rows = []
        for row in claims.rows:
            if row.slots > total_slots:
                raise ValidationError(
                    f"{claims.source}: other work claims {row.slots} slots at {row.offset_s:g} s "
                    f"but the pool has only {total_slots}")
            rows.append(TraceRow(row.offset_s, total_slots - row.slots, row.price))
        return cls(total_slots, CapacityTrace(tuple(rows), loop=claims.loop,
                                              source=claims.source))

    def lendable(self, elapsed_s: float) -> int:
        return self.lendable_trace.at(elapsed_s).slots

    def claimed(self, elapsed_s: float) -> int:
        return self.total_slots - self.lendable(elapsed_s)

    def at(self, elapsed_s: float) -> TracePoint:
        """The lendable slots (and price) at ``elapsed_s``."""
        return self.lendable_trace.at(elapsed_s)

    def next_change_after(self, elapsed_s: float) -> float | None:
        return self.lendable_trace.next_change_after(elapsed_s)


def parse_reserved_pool(text: str, source: str = "<reserved pool>", *,
                        total_slots: int | None = None, loop: bool = False) -> ReservedPool:
    """A pool from a trace whose ``slots`` are the slots available to lend."""
    return ReservedPool.from_lendable(parse_trace(text, source, loop=loop), total_slots)


def load_reserved_pool(path: str | Path, *, total_slots: int | None = None,
                       loop: bool = False) -> ReservedPool:
    return parse_reserved_pool(_read(path), str(path), total_slots=total_slots, loop=loop)


def trace_from_points(points: Iterable[tuple[float, int] | tuple[float, int, float]], *,
                      loop: bool = False, source: str = "<trace>") -> CapacityTrace:
    """A trace from ``(offset_s, slots)`` or ``(offset_s, slots, price)`` tuples."""
    return CapacityTrace(tuple(TraceRow(*p) for p in points), loop=loop, source=source)
