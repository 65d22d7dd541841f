"""The job page's speed-up chart: samples/s measured at each world size, and the fitted model."""

from __future__ import annotations

from typing import Any

from dyntrain.elastic.runs.storage import RunStore
from dyntrain.service.core.speedup import profile_from_rows
from dyntrain.service.web import runfiles

ROWS = 1000  # the latest metrics rows the points are measured over
WINDOW_BYTES = 256 << 10


def speedup_chart(files: RunStore, max_workers: int) -> dict[str, Any] | None:
    """The points (world size, median samples/s) of the job's latest steps and the model the
    service fits to them (``dyntrain.service.core.speedup``) from 1 to the job's max workers; None
    before any world size has two consecutive steps."""
    profile = profile_from_rows(runfiles.tail_rows(files, ROWS, WINDOW_BYTES))
    if profile is None:
        return None
    most = max(max_workers, max(p.world_size for p in profile.points))
    sizes = list(range(1, most + 1))
    return {"points": {"w": [p.world_size for p in profile.points],
                       "samples_per_s": [p.samples_per_s for p in profile.points]},
            "model": {"w": sizes, "samples_per_s": [profile.model.throughput(w) for w in sizes]}}
