"""Fair-share scheduling policies (AWS Batch's), which job queues name."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dyntrain.service.api.deps import OperationsDep
from dyntrain.service.api.errors import errors
from dyntrain.service.api.schemas import FairshareIn, SchedulingPolicyIn
from dyntrain.service.core.fairshare import FairsharePolicy, ShareAttributes
from dyntrain.service.core.records import SchedulingPolicy

router = APIRouter(prefix="/scheduling-policies", tags=["scheduling policies"])


def _policy(body: FairshareIn) -> FairsharePolicy:
    return FairsharePolicy(body.share_decay_seconds, body.compute_reservation,
                           tuple(ShareAttributes(s.identifier, s.weight_factor)
                                 for s in body.shares))


def view(p: SchedulingPolicy) -> dict[str, Any]:
    f = p.fairshare
    return {"name": p.name, "share_decay_seconds": f.share_decay_seconds,
            "compute_reservation": f.compute_reservation,
            "shares": [{"identifier": a.identifier, "weight_factor": a.weight_factor}
                       for a in f.shares],
            "created_at": p.created_at, "updated_at": p.updated_at}


@router.post("", status_code=201, summary="Create a fair-share scheduling policy",
             responses=errors(400, 409, 422))
def create(body: SchedulingPolicyIn, ops: OperationsDep) -> dict[str, Any]:
    return view(ops.policies.create(body.name, _policy(body)))


@router.get("", summary="List scheduling policies")
def list_all(ops: OperationsDep) -> list[dict[str, Any]]:
    return [view(p) for p in ops.policies.list()]


@router.get("/{name}", summary="Describe a scheduling policy", responses=errors(404, 422))
def get(name: str, ops: OperationsDep) -> dict[str, Any]:
    return view(ops.policies.get(name))


@router.put("/{name}", summary="Replace a scheduling policy's settings",
            responses=errors(400, 404, 422))
def update(name: str, body: FairshareIn, ops: OperationsDep) -> dict[str, Any]:
    return view(ops.policies.update(name, _policy(body)))


@router.delete("/{name}", summary="Delete a scheduling policy (no job queue may use it)",
               responses=errors(404, 409, 422))
def delete(name: str, ops: OperationsDep) -> dict[str, Any]:
    ops.policies.delete(name)
    return {"deleted": name}
