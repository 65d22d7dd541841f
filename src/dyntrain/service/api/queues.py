"""Job queues: a priority over an ordered list of compute environments."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dyntrain.service.api.deps import OperationsDep
from dyntrain.service.api.errors import errors
from dyntrain.service.api.schemas import JobQueueIn, JobQueuePatch
from dyntrain.service.core.model import JobQueueSpec
from dyntrain.service.engine import views

router = APIRouter(prefix="/job-queues", tags=["job queues"])


@router.post("", status_code=201, summary="Create a job queue",
             responses=errors(400, 409, 422))
def create(body: JobQueueIn, ops: OperationsDep) -> dict[str, Any]:
    spec = JobQueueSpec(body.name, body.priority, tuple(body.compute_environments), body.state,
                        body.scheduling_policy, body.preempt_plain_jobs)
    return views.job_queue(ops.queues.create(spec))


@router.get("", summary="List job queues (highest priority first)")
def list_all(ops: OperationsDep) -> list[dict[str, Any]]:
    return [views.job_queue(q) for q in ops.queues.list()]


@router.get("/{name}", summary="Describe a job queue", responses=errors(404, 422))
def get(name: str, ops: OperationsDep) -> dict[str, Any]:
    return views.job_queue(ops.queues.get(name))


@router.get("/{name}/snapshot", summary="The front of a job queue and the slots each share "
            "holds", responses=errors(404, 422))
def snapshot(name: str, ops: OperationsDep) -> dict[str, Any]:
    snap = ops.queues.snapshot(name)
    return {"queue": views.job_queue(snap.queue), "at": snap.at,
            "front": [{"id": job.id, "name": job.name, "share": job.share,
                       "scheduling_priority": job.scheduling_priority,
                       "position": None if info is None else info.position,
                       "reason": None if info is None else info.reason}
                      for job, info in snap.front],
            "shares": snap.held}


@router.patch("/{name}", summary="Change a job queue's priority, state or environments",
              responses=errors(400, 404, 409, 422))
def update(name: str, body: JobQueuePatch, ops: OperationsDep) -> dict[str, Any]:
    return views.job_queue(ops.queues.update(name, **body.model_dump(exclude_none=True)))


@router.delete("/{name}", summary="Delete a job queue (it may hold no unfinished job)",
               responses=errors(404, 409, 422))
def delete(name: str, ops: OperationsDep) -> dict[str, Any]:
    ops.queues.delete(name)
    return {"deleted": name}
