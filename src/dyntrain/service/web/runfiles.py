"""Reading an elastic job's run folder: metrics.jsonl in pieces, its tail, its checkpoints."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# imports torch, so the app loads it at start. Loaded lazily instead, torch would first load when
# the controller launches an elastic job, under the service's lock: API calls waited for the import
# (a 10 s client timeout ran out in make demo on a loaded machine).
from dyntrain.elastic.checkpoint import list_checkpoints

METRICS_FILE = "metrics.jsonl"
# the per-step fields the dashboard plots (a row may carry more: validation, gradient norm, ...)
SERIES_FIELDS = ("step", "time", "world_size", "loss", "samples_per_s", "b_simple")
MAX_CHUNK_BYTES = 2 << 20


def read_rows(path: Path, offset: int, max_bytes: int = MAX_CHUNK_BYTES) -> tuple[list[dict], int]:
    """Whole JSON lines from byte ``offset`` on (at most about ``max_bytes``), and the offset
    after the last whole line read; a line still being written is left for the next call."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(max_bytes)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    rows = []
    for line in data[:end].splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn line from a killed writer: skipped, not fatal
        if isinstance(row, dict):
            rows.append(row)
    return rows, offset + end


def tail_rows(path: Path, n: int, window: int = 64 << 10) -> list[dict]:
    """The last ``n`` whole JSON lines of ``path`` (fewer when the file is short or absent)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return []
    start = max(0, size - window)
    rows, _ = read_rows(path, start, window)
    if start > 0 and rows:
        rows = rows[1:]  # the first line read may have begun before the window
    return rows[-n:]


def series(rows: list[dict]) -> dict[str, list]:
    """Column arrays of the plotted fields; steps computed again after a failure are left out
    (the row that counts for a step is the one whose world applied it)."""
    kept = [r for r in rows if not r.get("recomputed") and "step" in r]
    return {name: [r.get(name) for r in kept] for name in SERIES_FIELDS}


def steps_per_second(rows: list[dict]) -> float | None:
    """Applied steps per second over ``rows`` (None with fewer than two timed rows)."""
    timed = [r for r in rows if not r.get("recomputed") and "time" in r and "step" in r]
    if len(timed) < 2:
        return None
    first, last = timed[0], timed[-1]
    seconds = last["time"] - first["time"]
    return (last["step"] - first["step"]) / seconds if seconds > 0 else None


@dataclass(frozen=True)
class CheckpointFile:
    step: int
    name: str
    size_bytes: int
    written_at: float


def checkpoints(run_dir: Path) -> list[CheckpointFile]:
    """The checkpoints in the run folder now, newest first (older ones are pruned as it runs)."""
    out = []
    for step, path in list_checkpoints(run_dir / "checkpoints"):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue  # pruned between the listing and the stat
        out.append(CheckpointFile(step, path.name, st.st_size, st.st_mtime))
    return sorted(out, key=lambda c: c.step, reverse=True)
