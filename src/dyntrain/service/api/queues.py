"""Job queues: a priority over an ordered list of compute environments."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dyntrain.service.api.deps import ServiceDep
from dyntrain.service.api.errors import errors, lookup
from dyntrain.service.api.schemas import JobQueueIn, JobQueuePatch
from dyntrain.service.core.model import JobQueueSpec
from dyntrain.service.engine import views

router = APIRouter(prefix="/job-queues", tags=["job queues"])


@router.post("", status_code=201, summary="Create a job queue",
             responses=errors(400, 409, 422))
def create(body: JobQueueIn, service: ServiceDep) -> dict[str, Any]:
    spec = JobQueueSpec(body.name, body.priority, tuple(body.compute_environments), body.state)
    with service.lock:
        return views.job_queue(service.store.create_job_queue(spec))


@router.get("", summary="List job queues (highest priority first)")
def list_all(service: ServiceDep) -> list[dict[str, Any]]:
    return [views.job_queue(q) for q in service.store.list_job_queues()]


@router.get("/{name}", summary="Describe a job queue", responses=errors(404, 422))
def get(name: str, service: ServiceDep) -> dict[str, Any]:
    return views.job_queue(lookup(service.store.get_job_queue, name))


@router.patch("/{name}", summary="Change a job queue's priority, state or environments",
              responses=errors(400, 404, 409, 422))
def update(name: str, body: JobQueuePatch, service: ServiceDep) -> dict[str, Any]:
    with service.lock:
        lookup(service.store.get_job_queue, name)
        return views.job_queue(service.store.update_job_queue(
            name, **body.model_dump(exclude_none=True)))


@router.delete("/{name}", summary="Delete a job queue (it may hold no unfinished job)",
               responses=errors(404, 409, 422))
def delete(name: str, service: ServiceDep) -> dict[str, Any]:
    with service.lock:
        lookup(service.store.get_job_queue, name)
        service.store.delete_job_queue(name)
    return {"deleted": name}
