"""Compute environments: pools of worker slots, their capacity at run time, capacity traces."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dyntrain.service.api.deps import OperationsDep
from dyntrain.service.api.errors import errors
from dyntrain.service.api.schemas import ComputeEnvironmentIn, ComputeEnvironmentPatch, TraceIn
from dyntrain.service.core.model import ComputeEnvironmentSpec
from dyntrain.service.core.records import ComputeEnvironment
from dyntrain.service.engine import views
from dyntrain.service.operations import Operations

router = APIRouter(prefix="/compute-environments", tags=["compute environments"])


def environment_views(ops: Operations, envs: list[ComputeEnvironment]) -> list[dict[str, Any]]:
    """With the slots each offers now (traces included) and how many active workers use."""
    c = ops.environments.capacity()
    return [views.compute_environment(ce, c.available, c.in_use, c.traces, c.machine)
            for ce in envs]


@router.post("", status_code=201, summary="Create a compute environment",
             responses=errors(400, 409, 422))
def create(body: ComputeEnvironmentIn, ops: OperationsDep) -> dict[str, Any]:
    spec = ComputeEnvironmentSpec(
        name=body.name, capacity_type=body.capacity_type,
        price_per_slot_hour=body.price_per_slot_hour, slot=body.slot.spec(),
        min_slots=body.min_slots, desired_slots=body.desired_slots, max_slots=body.max_slots,
        state=body.state)
    return environment_views(ops, [ops.environments.create(spec)])[0]


@router.get("", summary="List compute environments")
def list_all(ops: OperationsDep) -> list[dict[str, Any]]:
    return environment_views(ops, ops.environments.list())


@router.get("/{name}", summary="Describe a compute environment", responses=errors(404, 422))
def get(name: str, ops: OperationsDep) -> dict[str, Any]:
    return environment_views(ops, [ops.environments.get(name)])[0]


@router.patch("/{name}", summary="Change a compute environment's state, slots or price",
              responses=errors(400, 404, 409, 422))
def update(name: str, body: ComputeEnvironmentPatch, ops: OperationsDep) -> dict[str, Any]:
    ce = ops.environments.update(name, **body.model_dump(exclude_none=True))
    return environment_views(ops, [ce])[0]


@router.delete("/{name}", summary="Delete a compute environment (no queue may use it)",
               responses=errors(404, 409, 422))
def delete(name: str, ops: OperationsDep) -> dict[str, Any]:
    ops.environments.delete(name)
    return {"deleted": name}


@router.put("/{name}/trace", summary="Replay a capacity trace (CSV) as the available slots",
            responses=errors(400, 404, 409, 422))
def set_trace(name: str, body: TraceIn, ops: OperationsDep) -> dict[str, Any]:
    ce = ops.environments.set_trace(name, body.csv, loop=body.loop)
    return environment_views(ops, [ce])[0]


@router.delete("/{name}/trace", summary="Stop replaying a trace: desired_slots applies again",
               responses=errors(404, 409, 422))
def clear_trace(name: str, ops: OperationsDep) -> dict[str, Any]:
    return environment_views(ops, [ops.environments.clear_trace(name)])[0]
