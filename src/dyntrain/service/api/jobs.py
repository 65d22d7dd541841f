"""Jobs: submit, list, describe, cancel, terminate, logs, events and cost."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from dyntrain.service.api.deps import OperationsDep
from dyntrain.service.api.errors import errors
from dyntrain.service.api.schemas import JobIn
from dyntrain.service.core.model import (
    Dependency,
    JobStatus,
)
from dyntrain.service.engine import views

router = APIRouter(prefix="/jobs", tags=["jobs"])

MAX_OFFSET = 2**53
After = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
Limit = Annotated[int, Query(ge=1, le=10_000)]
_STATUS = "|".join(s.value for s in JobStatus)
STATUSES = rf"^({_STATUS})(,({_STATUS}))*$"


@router.post("", status_code=201, summary="Submit a job (a definition and/or a command)",
             responses=errors(400, 409, 422))
def submit(body: JobIn, ops: OperationsDep) -> dict[str, Any]:
    job = ops.jobs.submit(
        queue=body.queue, definition=body.definition, command=body.command,
        name=body.name, parameters={k: str(v) for k, v in body.parameters.items()},
        environment=body.environment,
        resources=None if body.resources is None else body.resources.spec(),
        array_size=body.array_size,
        depends_on=[Dependency(d.job_id, d.type) for d in body.depends_on],
        workers=None if body.workers is None else (body.workers.min, body.workers.max),
        retry_attempts=body.retry_attempts, timeout_seconds=body.timeout_seconds,
        job_id=body.job_id, workdir=body.workdir,
        exported_environment=body.exported_environment,
        launcher=None if body.launcher is None else body.launcher.value, share=body.share,
        scheduling_priority=body.scheduling_priority)
    return views.job(job)


@router.get("", summary="List jobs (top-level jobs unless `parent` names an array job)",
            responses=errors(422))
def list_jobs(ops: OperationsDep,
              queue: Annotated[str | None, Query(max_length=128)] = None,
              status: Annotated[str | None, Query(max_length=200, pattern=STATUSES,
                                                  description="one or several, comma-separated")
                                ] = None,
              parent: Annotated[str | None, Query(max_length=200)] = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 100,
              offset: After = 0) -> list[dict[str, Any]]:
    jobs = ops.jobs.list(queue=queue, status=status and status.split(","), parent=parent,
                         top_level=parent is None, limit=limit, offset=offset)
    why = ops.jobs.wait_reasons()
    return [views.job(j, why(j)) for j in jobs]


@router.get("/{job_id}", summary="Describe a job: why it waits, its workers, its children",
            responses=errors(404, 422))
def get(job_id: str, ops: OperationsDep) -> dict[str, Any]:
    job = ops.jobs.get(job_id)
    out = views.job(job, ops.jobs.wait_reasons()(job))
    out["workers"] = [views.worker(w) for w in ops.jobs.workers(job_id, active=True)]
    out["attempt_history"] = [views.attempt(a) for a in ops.jobs.attempts(job_id)]
    out["exported_environment"] = ops.jobs.exported_environment(job)
    if job.is_array_parent:
        counts = ops.jobs.child_counts([job_id])[job_id]
        out["array"] = {"size": job.array_size,
                        "status_counts": {s.value: counts.get(s, 0) for s in JobStatus}}
    else:
        out["array"] = None
    return out


@router.post("/{job_id}/cancel", summary="Cancel a job that has not started yet",
             responses=errors(404, 409, 422))
def cancel(job_id: str, ops: OperationsDep) -> dict[str, Any]:
    return views.job(ops.jobs.cancel(job_id))


@router.post("/{job_id}/terminate",
             summary="Stop a job whatever its state; it ends FAILED and is not retried",
             responses=errors(404, 409, 422))
def terminate(job_id: str, ops: OperationsDep) -> dict[str, Any]:
    return views.job(ops.jobs.terminate(job_id))


@router.get("/{job_id}/logs", summary="Log lines after `after_seq`, and whether more can come",
            responses=errors(404, 422))
def logs(job_id: str, ops: OperationsDep, after_seq: After = 0,
         limit: Limit = 1000) -> dict[str, Any]:
    log = ops.logs.read(job_id, after_seq, limit)
    return {"lines": [views.log_line(x) for x in log.lines], "last_seq": log.last_seq,
            "status": log.job.status.value, "done": log.job.status.is_terminal()}


@router.get("/{job_id}/events", summary="The job's events with id > `after_id`, oldest first",
            responses=errors(404, 422))
def events(job_id: str, ops: OperationsDep, after_id: After = 0,
           limit: Limit = 1000) -> dict[str, Any]:
    ops.jobs.get(job_id)
    found = ops.logs.events(job_id, after_id=after_id, limit=limit)
    return {"events": [views.event(e) for e in found],
            "last_id": found[-1].id if found else after_id}


@router.get("/{job_id}/cost",
            summary="What the job cost, and what a static on-demand run would have cost",
            responses=errors(404, 422))
def cost(job_id: str, ops: OperationsDep) -> dict[str, Any]:
    """The static baseline runs ``max workers`` slots (1 for a plain job; times the array size
    for an array job, whose children's usage is summed) at the highest price among ON_DEMAND
    environments, or at 1.0 per slot-hour when there is none. The wall time runs from the
    job's start to its stop (or to now while it runs)."""
    return views.job_cost(job_id, ops.jobs.cost(ops.jobs.get(job_id)))
