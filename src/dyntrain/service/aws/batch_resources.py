"""AWS Batch: compute environments, job queues, job definitions and tags, over the one store.

Writes hold ``service.lock`` (they land between two controller steps), as the native API's do.
"""

from __future__ import annotations

from typing import Any

from dyntrain.service.aws import mapping, shapes
from dyntrain.service.aws.context import Context, Handler
from dyntrain.service.aws.errors import client_error
from dyntrain.service.aws.shapes import name_of, page, page_offset
from dyntrain.service.core.fit import slot_refusal
from dyntrain.service.core.records import JobDefinition
from dyntrain.service.engine.reads import local_machine

MAX_RESULTS = 100


def _limit(p: dict, default: int = MAX_RESULTS, most: int = MAX_RESULTS) -> int:
    n = p.get("maxResults") or default
    if not 1 <= n <= most:
        raise client_error(f"maxResults must be 1-{most}, got {n}")
    return n


# --------------------------------------------------------------------- compute environments


def create_compute_environment(ctx: Context, p: dict) -> dict[str, Any]:
    spec, aws = mapping.compute_environment(p)
    machine = local_machine(ctx.service)
    refusal = slot_refusal(spec, machine) if machine is not None else None
    if refusal:
        raise client_error(refusal)
    with ctx.service.lock:
        ctx.service.store.create_compute_environment(spec, tags=p.get("tags"), aws=aws)
    return {"computeEnvironmentName": spec.name,
            "computeEnvironmentArn": ctx.arns.compute_environment(spec.name)}


def update_compute_environment(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["computeEnvironment"], "compute-environment")
    store = ctx.service.store
    with ctx.service.lock:
        ce = store.get_compute_environment(name)
        store.update_compute_environment(
            name, **mapping.compute_environment_changes(p, ce.spec, ce.aws))
    return {"computeEnvironmentName": name,
            "computeEnvironmentArn": ctx.arns.compute_environment(name)}


def describe_compute_environments(ctx: Context, p: dict) -> dict[str, Any]:
    wanted = {name_of(x, "compute-environment") for x in p.get("computeEnvironments") or ()}
    envs = [shapes.compute_environment(ce, ctx.arns)
            for ce in ctx.service.store.list_compute_environments()
            if not wanted or ce.name in wanted]
    return page(envs, page_offset(p.get("nextToken")), _limit(p), "computeEnvironments")


def delete_compute_environment(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["computeEnvironment"], "compute-environment")
    store = ctx.service.store
    with ctx.service.lock:  # no worker starts in it between the check and the delete
        store.get_compute_environment(name)
        busy = sum(1 for w in store.list_workers(active=True) if w.compute_environment == name)
        if busy:
            raise client_error(f"compute environment {name} still has {busy} running "
                               "worker(s); disable it and let them finish first")
        store.delete_compute_environment(name)
    return {}


# -------------------------------------------------------------------------------- job queues


def create_job_queue(ctx: Context, p: dict) -> dict[str, Any]:
    spec, aws = mapping.job_queue(p)
    store = ctx.service.store
    with ctx.service.lock:
        if spec.name in {q.name for q in store.list_job_queues()}:
            raise client_error(f"Job queue {spec.name} already exists")
        store.create_job_queue(spec, tags=p.get("tags"), aws=aws)
    return {"jobQueueName": spec.name, "jobQueueArn": ctx.arns.job_queue(spec.name)}


def update_job_queue(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["jobQueue"], "job-queue")
    store = ctx.service.store
    with ctx.service.lock:
        queue = store.get_job_queue(name)
        envs, aws = None, None
        if p.get("computeEnvironmentOrder"):
            envs, orders = mapping.job_queue_order(p)
            aws = {**queue.aws, "orders": orders}
        store.update_job_queue(name, priority=p.get("priority"), state=p.get("state"),
                               compute_environments=envs, aws=aws)
    return {"jobQueueName": name, "jobQueueArn": ctx.arns.job_queue(name)}


def describe_job_queues(ctx: Context, p: dict) -> dict[str, Any]:
    wanted = {name_of(x, "job-queue") for x in p.get("jobQueues") or ()}
    queues = [shapes.job_queue(q, ctx.arns) for q in ctx.service.store.list_job_queues()
              if not wanted or q.name in wanted]
    return page(queues, page_offset(p.get("nextToken")), _limit(p), "jobQueues")


def delete_job_queue(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["jobQueue"], "job-queue")
    with ctx.service.lock:
        ctx.service.store.delete_job_queue(name)
    return {}


# --------------------------------------------------------------------------- job definitions


def register_job_definition(ctx: Context, p: dict) -> dict[str, Any]:
    spec, aws = mapping.job_definition(p)
    with ctx.service.lock:
        name, revision = ctx.service.store.register_job_definition(
            spec, tags=p.get("tags"), aws=aws)
    return {"jobDefinitionName": name, "revision": revision,
            "jobDefinitionArn": ctx.arns.job_definition(name, revision)}


def _matches(d: JobDefinition, wanted: list[str]) -> bool:
    return any(d.ref == w or d.name == w for w in wanted)


def describe_job_definitions(ctx: Context, p: dict) -> dict[str, Any]:
    """By ``jobDefinitions`` (``name``, ``name:revision`` or ARNs), ``jobDefinitionName`` and
    ``status``; both ACTIVE and INACTIVE revisions unless ``status`` says which."""
    wanted = [name_of(x, "job-definition") for x in p.get("jobDefinitions") or ()]
    found = ctx.service.store.list_job_definitions(p.get("jobDefinitionName"),
                                                   include_inactive=True)
    found = [d for d in found if (not wanted or _matches(d, wanted))
             and (not p.get("status") or d.status == p["status"])]
    return page([shapes.job_definition(d, ctx.arns) for d in found],
                page_offset(p.get("nextToken")), _limit(p), "jobDefinitions")


def definition_of(ctx: Context, value: str) -> JobDefinition:
    """``name`` (latest active revision), ``name:revision`` or an ARN."""
    name, _, revision = name_of(value, "job-definition").partition(":")
    if revision and not revision.isdigit():
        raise client_error(f"job definition {value!r}: the revision must be a number")
    return ctx.service.store.get_job_definition(name, int(revision) if revision else None)


def deregister_job_definition(ctx: Context, p: dict) -> dict[str, Any]:
    with ctx.service.lock:
        d = definition_of(ctx, p["jobDefinition"])
        ctx.service.store.deregister_job_definition(d.name, d.revision)
    return {}


# -------------------------------------------------------------------------------------- tags


def _resource(arn: str) -> tuple[str, str]:
    parsed = shapes.parse_arn(arn)
    if parsed is None or parsed[0] not in ("compute-environment", "job-queue", "job-definition",
                                            "job"):
        raise client_error(f"{arn!r} is not the ARN of a compute environment, job queue, job "
                           "definition or job of this service")
    return parsed


def tag_resource(ctx: Context, p: dict) -> dict[str, Any]:
    with ctx.service.lock:
        ctx.service.store.tag_resource(*_resource(p["resourceArn"]), p["tags"])
    return {}


def untag_resource(ctx: Context, p: dict) -> dict[str, Any]:
    with ctx.service.lock:
        ctx.service.store.untag_resource(*_resource(p["resourceArn"]), p["tagKeys"])
    return {}


def list_tags_for_resource(ctx: Context, p: dict) -> dict[str, Any]:
    return {"tags": ctx.service.store.resource_tags(*_resource(p["resourceArn"]))}


OPERATIONS: dict[str, Handler] = {
    "CreateComputeEnvironment": create_compute_environment,
    "UpdateComputeEnvironment": update_compute_environment,
    "DescribeComputeEnvironments": describe_compute_environments,
    "DeleteComputeEnvironment": delete_compute_environment,
    "CreateJobQueue": create_job_queue,
    "UpdateJobQueue": update_job_queue,
    "DescribeJobQueues": describe_job_queues,
    "DeleteJobQueue": delete_job_queue,
    "RegisterJobDefinition": register_job_definition,
    "DescribeJobDefinitions": describe_job_definitions,
    "DeregisterJobDefinition": deregister_job_definition,
    "TagResource": tag_resource,
    "UntagResource": untag_resource,
    "ListTagsForResource": list_tags_for_resource,
}
