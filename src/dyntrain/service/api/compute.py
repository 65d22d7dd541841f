"""Compute environments: pools of worker slots, their capacity at run time, capacity traces."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dyntrain.service.api.deps import ServiceDep
from dyntrain.service.api.errors import Conflict, errors, lookup
from dyntrain.service.api.schemas import ComputeEnvironmentIn, ComputeEnvironmentPatch, TraceIn
from dyntrain.service.core.capacity import parse_trace
from dyntrain.service.core.fit import slot_refusal
from dyntrain.service.core.model import ComputeEnvironmentSpec, ValidationError
from dyntrain.service.engine.reads import environment_views, local_machine
from dyntrain.service.engine.service import Service

router = APIRouter(prefix="/compute-environments", tags=["compute environments"])


def _one(service: Service, name: str) -> dict[str, Any]:
    return environment_views(service, [lookup(service.store.get_compute_environment, name)])[0]


@router.post("", status_code=201, summary="Create a compute environment",
             responses=errors(400, 409, 422))
def create(body: ComputeEnvironmentIn, service: ServiceDep) -> dict[str, Any]:
    spec = ComputeEnvironmentSpec(
        name=body.name, capacity_type=body.capacity_type,
        price_per_slot_hour=body.price_per_slot_hour, slot=body.slot.spec(),
        min_slots=body.min_slots, desired_slots=body.desired_slots, max_slots=body.max_slots,
        state=body.state)
    machine = local_machine(service)
    refusal = slot_refusal(spec, machine) if machine is not None else None
    if refusal:
        raise ValidationError(refusal)
    with service.lock:
        ce = service.store.create_compute_environment(spec)
    return environment_views(service, [ce])[0]


@router.get("", summary="List compute environments")
def list_all(service: ServiceDep) -> list[dict[str, Any]]:
    return environment_views(service, service.store.list_compute_environments())


@router.get("/{name}", summary="Describe a compute environment", responses=errors(404, 422))
def get(name: str, service: ServiceDep) -> dict[str, Any]:
    return _one(service, name)


@router.patch("/{name}", summary="Change a compute environment's state, slots or price",
              responses=errors(400, 404, 409, 422))
def update(name: str, body: ComputeEnvironmentPatch, service: ServiceDep) -> dict[str, Any]:
    with service.lock:
        lookup(service.store.get_compute_environment, name)
        ce = service.store.update_compute_environment(name,
                                                      **body.model_dump(exclude_none=True))
    return environment_views(service, [ce])[0]


@router.delete("/{name}", summary="Delete a compute environment (no queue may use it)",
               responses=errors(404, 409, 422))
def delete(name: str, service: ServiceDep) -> dict[str, Any]:
    with service.lock:  # no worker starts in it between the check and the delete
        lookup(service.store.get_compute_environment, name)
        busy = sum(1 for w in service.store.list_workers(active=True)
                   if w.compute_environment == name)
        if busy:
            raise Conflict(f"compute environment {name!r} still has {busy} active worker(s); "
                           "disable it and let them finish first")
        service.store.delete_compute_environment(name)
    return {"deleted": name}


@router.put("/{name}/trace", summary="Replay a capacity trace (CSV) as the available slots",
            responses=errors(400, 404, 409, 422))
def set_trace(name: str, body: TraceIn, service: ServiceDep) -> dict[str, Any]:
    parse_trace(body.csv, source=f"{name} trace", loop=body.loop)
    with service.lock:
        lookup(service.store.get_compute_environment, name)
        service.store.set_capacity_trace(name, body.csv, started_at=service.store.clock(),
                                         loop=body.loop)
    return _one(service, name)


@router.delete("/{name}/trace", summary="Stop replaying a trace: desired_slots applies again",
               responses=errors(404, 409, 422))
def clear_trace(name: str, service: ServiceDep) -> dict[str, Any]:
    with service.lock:
        lookup(service.store.get_compute_environment, name)
        service.store.clear_capacity_trace(name)
    return _one(service, name)
