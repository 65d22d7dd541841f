"""The lab page: batch-size sweeps this service ran (``dyntrain lab sweep`` on a service).

A sweep submits its pending trials as one array job running ``python -m dyntrain.lab.sweep
ROOT/.plans/plan-*.json``, so the sweep's folder is found from the job's command, and its report
is the lab's own analysis (``dyntrain.lab.report``) of what that folder holds now: a sweep still
running shows the batch sizes it has finished. The lab is imported lazily: it sits above the
service, and only this page reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyntrain.errors import DyntrainError
from dyntrain.service.engine.service import Service
from dyntrain.service.store import Job

SWEEP_MODULE = "dyntrain.lab.sweep"
PLANS_DIR = ".plans"  # dyntrain.lab.sweep.PLANS_DIR, named here to keep the lab unimported
MAX_SWEEP_JOBS = 500


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


def sweeps(service: Service) -> list[SweepRun]:
    """Every sweep the service ran, newest first; a resumed sweep's jobs share one entry."""
    found: dict[Path, list[Job]] = {}
    jobs, _ = service.store.search_jobs(text="sweep-", limit=MAX_SWEEP_JOBS)
    for job in jobs:
        root = sweep_root(job)
        if root is not None:
            found.setdefault(root, []).append(job)
    return [SweepRun(root, tuple(js)) for root, js in found.items()]


def report(run: SweepRun) -> dict[str, Any]:
    """The lab's report of the sweep folder as JSON (``{"error": ...}`` when it has none yet)."""
    from dyntrain.lab.report import analyse, to_json
    from dyntrain.lab.results import read_studies

    try:
        return to_json(analyse(read_studies(run.root)))
    except DyntrainError as e:
        return {"error": str(e).splitlines()[0], "workloads": []}
