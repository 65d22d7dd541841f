"""Running a sweep's trials on a dyntrain service: one array job, one child per trial.

Each child runs ``python -m dyntrain.lab.sweep PLAN`` (:func:`dyntrain.lab.sweep.child_main`)
and picks its trial by ``AWS_BATCH_JOB_ARRAY_INDEX``; this side waits for the trial folders
to appear.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from dyntrain.lab.results import LabError
from dyntrain.lab.sweep_files import PLANS_DIR, read_outcome, write_json
from dyntrain.lab.sweep_plan import Sweep, TrialTask
from dyntrain.lab.trial import TrialOutcome
from dyntrain.service.core.model import JobStatus, State


def service_url(choice: str) -> str | None:
    """The service to use: ``none`` -> None; ``auto`` -> $DYNTRAIN_URL or the default URL if a
    service answers there, else None; anything else is a URL that must answer."""
    from dyntrain.service.client import DEFAULT_URL, ApiError, Client

    if choice == "none":
        return None
    url = (os.environ.get("DYNTRAIN_URL") or DEFAULT_URL) if choice == "auto" else choice
    try:
        with Client(url, timeout=2) as client:
            client.health()
    except ApiError as e:
        if choice == "auto":
            return None
        raise LabError(str(e)) from None
    return url


def pick_queue(client: Any, queue: str | None) -> str:
    queues = client.list_job_queues()
    if queue is not None:
        if not any(q["name"] == queue for q in queues):
            raise LabError(f"the service has no job queue {queue!r} (it has: "
                           f"{', '.join(q['name'] for q in queues) or 'none'})")
        return queue
    enabled = [q for q in queues if State(q.get("state", State.ENABLED)) is State.ENABLED]
    if not enabled:
        raise LabError("the service has no enabled job queue: create one, pass --queue, "
                       "or run the sweep inline with --service none")
    return max(enabled, key=lambda q: q.get("priority", 0))["name"]


def run_on_service(sweep: Sweep, tasks: list[TrialTask], url: str, queue: str | None,
                   cpus: float, memory_mib: int,
                   progress: Callable[[TrialTask, TrialOutcome | None], None],
                   poll: float = 1.0) -> str:
    """Submit ``tasks`` as one array job (one child per trial) and wait; returns the job id."""
    from dyntrain.service.client import Client

    plans = sweep.root / PLANS_DIR
    plans.mkdir(exist_ok=True)
    plan_path = plans / f"plan-{uuid.uuid4().hex[:8]}.json"
    write_json(plan_path, {"workload": sweep.config.workload,
                            "workload_args": dict(sweep.config.workload_args),
                            "metric": sweep.metric,
                            "tasks": [t.to_json() for t in tasks]})
    from dyntrain.service.core.submitter import exported

    command = [sys.executable, "-m", "dyntrain.lab.sweep", str(plan_path.resolve())]
    with Client(url) as client:
        queue = pick_queue(client, queue)
        # as `dyntrain submit` does: this directory (a workload given as a relative path) and
        # this shell's environment; a queue whose slots are too small refuses the job here
        fields: dict[str, Any] = {"queue": queue, "command": command,
                                  "name": f"sweep-{sweep.model}",
                                  "environment": {"OMP_NUM_THREADS": "1"},
                                  "workdir": os.getcwd(),
                                  "exported_environment": exported(os.environ),
                                  "resources": {"cpus": cpus, "gpus": 0,
                                                "memory_mib": memory_mib}}
        if len(tasks) > 1:
            fields["array_size"] = len(tasks)
        else:
            fields["environment"]["AWS_BATCH_JOB_ARRAY_INDEX"] = "0"
        job = client.submit(**fields)
        job_id = job["id"]
        print(f"submitted {len(tasks)} trials as job {job_id} to queue {queue} at {url}",
              file=sys.stderr, flush=True)
        waiting, said = list(tasks), ""
        while True:
            status = JobStatus(client.get_job(job_id)["status"])
            if status is JobStatus.RUNNABLE:  # why no trial runs, as soon as the scheduler knows
                said = say_why_waiting(client, job_id, said)
            for task in [t for t in waiting if t.done()]:
                waiting.remove(task)
                progress(task, read_outcome(task, sweep.metric))
            if status.is_terminal():
                break
            time.sleep(poll)
    return job_id


def say_why_waiting(client: Any, job_id: str, said: str) -> str:
    """Print why the array's first waiting child waits, when that reason is new."""
    children = client.list_jobs(parent=job_id, status=JobStatus.RUNNABLE.value, limit=1)
    waiting = children[0].get("waiting") if children else None
    reason = waiting.get("reason", "") if isinstance(waiting, dict) else ""
    if reason and reason != said:
        print(f"waiting: {reason}", file=sys.stderr, flush=True)
        return reason
    return said
