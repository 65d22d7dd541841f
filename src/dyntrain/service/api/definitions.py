"""Job definitions: templates of jobs; registering a name again makes its next revision."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from dyntrain.service.api.deps import OperationsDep
from dyntrain.service.api.errors import errors
from dyntrain.service.api.schemas import MAX_INT32, JobDefinitionIn
from dyntrain.service.core.model import (
    ElasticSettings,
    JobDefinitionSpec,
    RetryRule,
    RetryStrategy,
)
from dyntrain.service.engine import views

router = APIRouter(prefix="/job-definitions", tags=["job definitions"])
Revision = Annotated[int, Path(ge=1, le=MAX_INT32)]


def spec_of(body: JobDefinitionIn) -> JobDefinitionSpec:
    retry = RetryStrategy(body.retry_strategy.attempts, tuple(
        RetryRule(r.action, None if r.on_exit_code is None else str(r.on_exit_code), r.on_reason)
        for r in body.retry_strategy.evaluate_on_exit))
    elastic = (None if body.elastic is None
               else ElasticSettings(body.elastic.min_workers, body.elastic.max_workers,
                                    body.elastic.launcher))
    return JobDefinitionSpec(
        name=body.name, command=tuple(body.command), environment=tuple(body.environment.items()),
        parameters=tuple((k, str(v)) for k, v in body.parameters.items()),
        resources=body.resources.spec(), retry_strategy=retry,
        timeout_seconds=body.timeout_seconds, elastic=elastic)


@router.post("", status_code=201, summary="Register a job definition (its next revision)",
             responses=errors(400, 409, 422))
def register(body: JobDefinitionIn, ops: OperationsDep) -> dict[str, Any]:
    d = ops.definitions.register(spec_of(body))
    return {"name": d.name, "revision": d.revision, "ref": d.ref}


@router.get("", summary="List job definitions", responses=errors(422))
def list_all(ops: OperationsDep,
             name: Annotated[str | None, Query(max_length=128)] = None,
             include_inactive: bool = False) -> list[dict[str, Any]]:
    return [views.job_definition(d)
            for d in ops.definitions.list(name, include_inactive=include_inactive)]


@router.get("/{name}", summary="Describe a revision (default: the latest active one)",
            responses=errors(404, 422))
def get(name: str, ops: OperationsDep,
        revision: Annotated[int | None, Query(ge=1, le=MAX_INT32)] = None) -> dict[str, Any]:
    return views.job_definition(ops.definitions.get(name, revision))


@router.delete("/{name}/{revision}", summary="Deregister a revision: no new job can use it",
               responses=errors(404, 409, 422))
def deregister(name: str, revision: Revision, ops: OperationsDep) -> dict[str, Any]:
    return views.job_definition(ops.definitions.deregister(name, revision))
