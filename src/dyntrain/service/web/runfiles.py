"""Reading an elastic job's run folder: metrics.jsonl in pieces, its tail, its checkpoints."""

from __future__ import annotations

import json

# imports torch, so the app loads it at start. Loaded lazily instead, torch would first load when
# the controller launches an elastic job, under the service's lock: API calls waited for the import
# (a 10 s client timeout ran out in make demo on a loaded machine).
from dyntrain.elastic.ckptstore import CheckpointInfo, describe_checkpoints
from dyntrain.elastic.linelog import read_bytes, size
from dyntrain.elastic.storage import RunStore, StorageError

METRICS_FILE = "metrics.jsonl"
# the per-step fields the dashboard plots (a row may carry more: validation, gradient norm, ...)
SERIES_FIELDS = ("step", "time", "world_size", "loss", "samples_per_s", "b_simple")
MAX_CHUNK_BYTES = 2 << 20


def read_rows(files: RunStore, offset: int, max_bytes: int = MAX_CHUNK_BYTES,
              name: str = METRICS_FILE) -> tuple[list[dict], int]:
    """Whole JSON lines of a run's metrics from byte ``offset`` on (at most about
    ``max_bytes``), and the offset after the last whole line read; a line still being written
    is left for the next call. A run folder that cannot be read now has no new rows."""
    try:
        data = read_bytes(files, name, offset, max_bytes)
    except (OSError, StorageError):
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


def tail_rows(files: RunStore, n: int, window: int = 64 << 10,
              name: str = METRICS_FILE) -> list[dict]:
    """The last ``n`` whole JSON lines of a run's metrics (fewer when short or absent)."""
    try:
        total = size(files, name)
    except (OSError, StorageError):
        return []
    start = max(0, total - window)
    rows, _ = read_rows(files, start, window, name)
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


def checkpoints(files: RunStore) -> list[CheckpointInfo]:
    """The checkpoints in the run folder now, newest first (older ones are pruned as it runs)."""
    try:
        return describe_checkpoints(files)
    except StorageError:
        return []
