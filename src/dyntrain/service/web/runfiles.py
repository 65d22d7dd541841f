"""The dashboard's reads of an elastic job's run folder: metrics.jsonl in pieces, its tail, its
checkpoints."""

from __future__ import annotations

# imports torch, so the app loads it at start. Loaded lazily instead, torch would first load when
# the controller launches an elastic job, under the service's lock: API calls waited for the import
# (a 10 s client timeout ran out in make demo on a loaded machine).
from dyntrain.elastic.runs.checkpoints import CheckpointInfo, describe_checkpoints
from dyntrain.elastic.runs.log import (
    METRICS_FILE,
    TAIL_BYTES,
    RunLogError,
    read_records,
    tail_records,
)
from dyntrain.elastic.runs.storage import RunStore, StorageError

# the per-step fields the dashboard plots (a row may carry more: validation, gradient norm, ...)
SERIES_FIELDS = ("step", "time", "world_size", "loss", "samples_per_s", "b_simple")
MAX_CHUNK_BYTES = 2 << 20


def _skip(_: RunLogError) -> None:
    """The dashboard shows whatever a run wrote: a line that is not a JSON object is passed
    over."""


def read_rows(files: RunStore, offset: int, max_bytes: int = MAX_CHUNK_BYTES,
              name: str = METRICS_FILE) -> tuple[list[dict], int]:
    """Whole JSON lines of a run's metrics from byte ``offset`` on (at most about
    ``max_bytes``), and the offset after the last whole line read, read as
    :mod:`dyntrain.elastic.runs.log` reads (a line still being written is left for the next call;
    one that is not a JSON object is skipped). A run folder that cannot be read now has no new
    rows."""
    try:
        found = read_records(files, name, offset=offset, max_bytes=max_bytes, on_bad=_skip)
    except (OSError, StorageError):
        return [], offset
    return [r.data for r in found.records], found.end


def tail_rows(files: RunStore, n: int, window: int = TAIL_BYTES,
              name: str = METRICS_FILE) -> list[dict]:
    """The last ``n`` JSON lines of a run's metrics (fewer when short or absent), read as
    ``read_rows`` reads."""
    try:
        return [r.data for r in tail_records(files, n, name, window, on_bad=_skip)]
    except (OSError, StorageError):
        return []


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
