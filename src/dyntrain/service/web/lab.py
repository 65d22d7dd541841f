"""The lab page: batch-size sweeps this service ran (``dyntrain lab sweep`` on a service).

A sweep submits its pending trials as one array job running ``python -m dyntrain.lab.sweep
ROOT/.plans/plan-*.json``, so the sweep's folder is found from the job's command, and its report
is the lab's own analysis (``dyntrain.lab.analysis``) of what that folder holds now: a sweep still
running shows the batch sizes it has finished. The dashboard does not import the lab (it sits
above the service): the report is made by a ``LabReport`` handed to it when the application is
assembled (``dyntrain.service.server.lab_report``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyntrain.service.core.records import Job
from dyntrain.service.operations import Operations

SWEEP_MODULE = "dyntrain.lab.sweep"
PLANS_DIR = ".plans"  # dyntrain.lab.sweep_files.PLANS_DIR, named here to keep the lab unimported
MAX_SWEEP_JOBS = 500

# a sweep folder -> the lab's report of it as JSON ({"error": ..., "workloads": []} without one)
LabReport = Callable[[Path], dict[str, Any]]


@dataclass(frozen=True)
class SweepRun:
    """One sweep folder and the service jobs that ran its trials, newest first."""

    root: Path
    jobs: tuple[Job, ...]

    @property
    def key(self) -> str:
        return self.jobs[0].id


def sweep_root(job: Job) -> Path | None:
    """The sweep folder of a job that runs ``python -m dyntrain.lab.sweep PLAN`` (else None)."""
    cmd = list(job.command)
    for i in range(len(cmd) - 2):
        if cmd[i] == "-m" and cmd[i + 1] == SWEEP_MODULE:
            plan = Path(cmd[i + 2])
            return plan.parent.parent if plan.parent.name == PLANS_DIR else plan.parent
    return None


def sweeps(ops: Operations) -> list[SweepRun]:
    """Every sweep the service ran, newest first; a resumed sweep's jobs share one entry."""
    found: dict[Path, list[Job]] = {}
    jobs, _ = ops.jobs.search(text="sweep-", limit=MAX_SWEEP_JOBS)
    for job in jobs:
        root = sweep_root(job)
        if root is not None:
            found.setdefault(root, []).append(job)
    return [SweepRun(root, tuple(js)) for root, js in found.items()]


def no_report(root: Path) -> dict[str, Any]:
    """The lab page's report when the application was assembled without the lab's."""
    return {"error": "the lab's reports are not available on this service", "workloads": []}
