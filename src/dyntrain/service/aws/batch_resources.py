"""AWS Batch: compute environments, job queues, job definitions and tags, by the service's
operations (which hold the lock for their writes, as for the REST API's)."""

from __future__ import annotations

from typing import Any

from dyntrain.service.aws import mapping, shapes
from dyntrain.service.aws.context import Context, Handler
from dyntrain.service.aws.errors import client_error
from dyntrain.service.aws.shapes import name_of, page, page_offset
from dyntrain.service.core.records import JobDefinition
from dyntrain.service.operations.errors import EnvironmentInUse, PolicyChange, QueueExists

MAX_RESULTS = 100


def _limit(p: dict, default: int = MAX_RESULTS, most: int = MAX_RESULTS) -> int:
    n = p.get("maxResults") or default
    if not 1 <= n <= most:
        raise client_error(f"maxResults must be 1-{most}, got {n}")
    return n


# --------------------------------------------------------------------- compute environments


def check_compute_environment(p: dict) -> None:
    """What AWS says before it checks the request's shape: a compute environment of no known
    type needs a service role first."""
    if p.get("type") not in ("MANAGED", "UNMANAGED") and not p.get("serviceRole"):
        raise client_error(f"Error executing request, Exception : ServiceRole is required., "
                           f"type {p.get('type')} must be one of MANAGED | UNMANAGED")


def create_compute_environment(ctx: Context, p: dict) -> dict[str, Any]:
    spec, aws = mapping.compute_environment(p)
    ctx.ops.environments.create(spec, tags=p.get("tags"), aws=aws)
    return {"computeEnvironmentName": spec.name,
            "computeEnvironmentArn": ctx.arns.compute_environment(spec.name)}


def update_compute_environment(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["computeEnvironment"], "compute-environment")
    ctx.ops.environments.revise(
        name, lambda ce: mapping.compute_environment_changes(p, ce.spec, ce.aws))
    return {"computeEnvironmentName": name,
            "computeEnvironmentArn": ctx.arns.compute_environment(name)}


def describe_compute_environments(ctx: Context, p: dict) -> dict[str, Any]:
    wanted = {name_of(x, "compute-environment") for x in p.get("computeEnvironments") or ()}
    envs = [shapes.compute_environment(ce, ctx.arns)
            for ce in ctx.ops.environments.list()
            if not wanted or ce.name in wanted]
    return page(envs, page_offset(p.get("nextToken")), _limit(p), "computeEnvironments")


def delete_compute_environment(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["computeEnvironment"], "compute-environment")
    try:
        ctx.ops.environments.delete(name)
    except EnvironmentInUse as e:
        raise client_error(f"compute environment {name} still has {e.workers} running "
                           "worker(s); disable it and let them finish first") from None
    return {}


# -------------------------------------------------------------------------------- job queues


def _known_environments(ctx: Context, names: tuple[str, ...]) -> None:
    """AWS's answer to an order naming an environment that does not exist."""
    known = {ce.name for ce in ctx.ops.environments.list()}
    if any(name not in known for name in names):
        raise client_error("computeEnvironmentOrder is malformed")


def create_job_queue(ctx: Context, p: dict) -> dict[str, Any]:
    spec, aws = mapping.job_queue(p)
    _known_environments(ctx, spec.compute_environments)
    try:
        ctx.ops.queues.create(spec, tags=p.get("tags"), aws=aws)
    except QueueExists:
        raise client_error(f"Job queue {spec.name} already exists") from None
    return {"jobQueueName": spec.name, "jobQueueArn": ctx.arns.job_queue(spec.name)}


def update_job_queue(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["jobQueue"], "job-queue")
    envs, aws = None, None
    if p.get("computeEnvironmentOrder"):
        envs, orders = mapping.job_queue_order(p)
        _known_environments(ctx, envs)
        aws = {"orders": orders}
    policy = p.get("schedulingPolicyArn")
    try:
        ctx.ops.queues.update(name, priority=p.get("priority"), state=p.get("state"),
                              compute_environments=envs, aws=aws,
                              scheduling_policy=None if policy is None
                              else name_of(policy, "scheduling-policy"))
    except PolicyChange as e:
        raise client_error(str(e)) from None
    return {"jobQueueName": name, "jobQueueArn": ctx.arns.job_queue(name)}


def describe_job_queues(ctx: Context, p: dict) -> dict[str, Any]:
    wanted = {name_of(x, "job-queue") for x in p.get("jobQueues") or ()}
    queues = [shapes.job_queue(q, ctx.arns) for q in ctx.ops.queues.list()
              if not wanted or q.name in wanted]
    return page(queues, page_offset(p.get("nextToken")), _limit(p), "jobQueues")


def delete_job_queue(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["jobQueue"], "job-queue")
    ctx.ops.queues.delete(name)
    return {}


# --------------------------------------------------------------------------- job definitions


def register_job_definition(ctx: Context, p: dict) -> dict[str, Any]:
    spec, aws = mapping.job_definition(p)
    d = ctx.ops.definitions.register(spec, tags=p.get("tags"), aws=aws)
    return {"jobDefinitionName": d.name, "revision": d.revision,
            "jobDefinitionArn": ctx.arns.job_definition(d.name, d.revision)}


def _matches(d: JobDefinition, wanted: list[str]) -> bool:
    return any(d.ref == w or d.name == w for w in wanted)


def describe_job_definitions(ctx: Context, p: dict) -> dict[str, Any]:
    """By ``jobDefinitions`` (``name``, ``name:revision`` or ARNs), ``jobDefinitionName`` and
    ``status``; both ACTIVE and INACTIVE revisions unless ``status`` says which."""
    wanted = [name_of(x, "job-definition") for x in p.get("jobDefinitions") or ()]
    found = ctx.ops.definitions.list(p.get("jobDefinitionName"), include_inactive=True)
    found = [d for d in found if (not wanted or _matches(d, wanted))
             and (not p.get("status") or d.status == p["status"])]
    return page([shapes.job_definition(d, ctx.arns) for d in found],
                page_offset(p.get("nextToken")), _limit(p), "jobDefinitions")


def definition_of(ctx: Context, value: str) -> JobDefinition:
    """``name`` (latest active revision), ``name:revision`` or an ARN."""
    name, revision = _definition_ref(value)
    return ctx.ops.definitions.get(name, revision)


def _definition_ref(value: str) -> tuple[str, int | None]:
    name, _, revision = name_of(value, "job-definition").partition(":")
    if revision and not revision.isdigit():
        raise client_error(f"job definition {value!r}: the revision must be a number")
    return name, int(revision) if revision else None


def deregister_job_definition(ctx: Context, p: dict) -> dict[str, Any]:
    ctx.ops.definitions.deregister(*_definition_ref(p["jobDefinition"]))
    return {}


# -------------------------------------------------------------------------------------- tags


def _resource(arn: str) -> tuple[str, str]:
    parsed = shapes.parse_arn(arn)
    if parsed is None or parsed[0] not in ("compute-environment", "job-queue", "job-definition",
                                            "job", "scheduling-policy"):
        raise client_error(f"{arn!r} is not the ARN of a compute environment, job queue, job "
                           "definition, job or scheduling policy of this service")
    return parsed


def tag_resource(ctx: Context, p: dict) -> dict[str, Any]:
    ctx.ops.tags.add(*_resource(p["resourceArn"]), p["tags"])
    return {}


def untag_resource(ctx: Context, p: dict) -> dict[str, Any]:
    ctx.ops.tags.remove(*_resource(p["resourceArn"]), p["tagKeys"])
    return {}


def list_tags_for_resource(ctx: Context, p: dict) -> dict[str, Any]:
    return {"tags": ctx.ops.tags.of(*_resource(p["resourceArn"]))}


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
