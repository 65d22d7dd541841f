"""The store's records in AWS Batch's and CloudWatch Logs' response shapes, and back.

ARNs name resources as AWS does (``arn:aws:batch:<region>:<account>:job-queue/<name>``), with
the region the client signed for and a fixed account id; either the ARN or the bare name is
accepted wherever AWS accepts both. Times are integer epoch milliseconds.

Log streams: one per attempt of a job, named ``<jobDefinitionName>/default/<task>`` as AWS Batch
does today, where ``task`` is the job id (``:`` of an array child becomes ``.``; a later attempt
adds ``.attempt<N>``). Each stream also answers to ``<jobName>/<task>``, the name AWS Batch used
in 2017 and the prefix older scripts search for.
"""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from dyntrain.service.aws.errors import AwsError, client_error
from dyntrain.service.core.model import CapacityType, JobStatus, RetryStrategy
from dyntrain.service.core.records import (
    AttemptRecord,
    ComputeEnvironment,
    Job,
    JobDefinition,
    JobQueue,
    LogStream,
)

ACCOUNT = "123456789012"
DEFAULT_REGION = "us-east-1"
LOG_GROUP = "/aws/batch/job"
_ARN = re.compile(r"^arn:aws[a-z-]*:batch:[^:]*:[^:]*:([a-z-]+)/(.+)$")
_EMPTY_LISTS = ("volumes", "mountPoints", "ulimits", "resourceRequirements", "secrets")
_TASK = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]*)(?:\.(\d+))?(?:\.attempt(\d+))?$")


def ms(t: float | None) -> int | None:
    return None if t is None else int(round(t * 1000))


def drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class Arns:
    """ARNs in one region (the one the client signed for)."""

    region: str = DEFAULT_REGION

    def _batch(self, kind: str, key: str) -> str:
        return f"arn:aws:batch:{self.region}:{ACCOUNT}:{kind}/{key}"

    def compute_environment(self, name: str) -> str:
        return self._batch("compute-environment", name)

    def job_queue(self, name: str) -> str:
        return self._batch("job-queue", name)

    def job_definition(self, name: str, revision: int) -> str:
        return self._batch("job-definition", f"{name}:{revision}")

    def job(self, job_id: str) -> str:
        return self._batch("job", job_id)

    def scheduling_policy(self, name: str) -> str:
        return self._batch("scheduling-policy", name)

    def log_group(self) -> str:
        return f"arn:aws:logs:{self.region}:{ACCOUNT}:log-group:{LOG_GROUP}"


def parse_arn(value: str) -> tuple[str, str] | None:
    """``(kind, key)`` of a Batch ARN (``job-queue``, ``name``), or None for a bare name."""
    m = _ARN.match(value)
    return (m.group(1), m.group(2)) if m else None


def name_of(value: str, kind: str) -> str:
    """A resource's name from its name or its ARN (which must be of ``kind``)."""
    parsed = parse_arn(value)
    if parsed is None:
        return value
    if parsed[0] != kind:
        raise client_error(f"{value} is the ARN of a {parsed[0]}, not of a {kind}")
    return parsed[1]


# --------------------------------------------------------------------------------- pagination


def page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def page_offset(token: str | None, error=client_error) -> int:
    """The offset a ``nextToken`` stands for (0 without one)."""
    if not token:
        return 0
    try:
        offset = json.loads(base64.urlsafe_b64decode(token.encode()))["offset"]
        if isinstance(offset, int) and offset >= 0:
            return offset
    except (ValueError, KeyError, TypeError):
        pass
    raise error(f"invalid nextToken {token[:80]!r}: pass the token a previous page returned")


def page(items: list, offset: int, limit: int, key: str) -> dict[str, Any]:
    """``{key: items[offset:offset+limit]}`` plus ``nextToken`` when more follow."""
    out: dict[str, Any] = {key: items[offset:offset + limit]}
    if offset + limit < len(items):
        out["nextToken"] = page_token(offset + limit)
    return out


# ------------------------------------------------------------------------------- batch shapes


def compute_environment(ce: ComputeEnvironment, arns: Arns) -> dict[str, Any]:
    s, aws = ce.spec, ce.aws
    kind = aws.get("type", "MANAGED")
    out = {
        "computeEnvironmentName": s.name, "computeEnvironmentArn": arns.compute_environment(s.name),
        "ecsClusterArn": f"arn:aws:ecs:{arns.region}:{ACCOUNT}:cluster/{s.name}",
        "tags": ce.tags, "type": kind, "state": s.state.value, "status": ce.status.value,
        "statusReason": ce.status_reason or "ComputeEnvironment Healthy",
        "containerOrchestrationType": "ECS", "serviceRole": aws.get("serviceRole"),
    }
    if kind == "MANAGED":
        resources = dict(aws.get("computeResources") or {
            "type": "SPOT" if s.capacity_type is CapacityType.SPOT else "EC2"})
        resources.update(minvCpus=s.min_slots, maxvCpus=s.max_slots,
                         desiredvCpus=s.desired_slots)
        out["computeResources"] = resources
    else:
        out["unmanagedvCpus"] = s.max_slots
    return drop_none(out)


def job_queue(q: JobQueue, arns: Arns) -> dict[str, Any]:
    orders = q.aws.get("orders") or list(range(1, len(q.spec.compute_environments) + 1))
    return drop_none({
        "jobQueueName": q.name, "jobQueueArn": arns.job_queue(q.name),
        "state": q.spec.state.value, "status": "VALID", "statusReason": "JobQueue Healthy",
        "priority": q.spec.priority, "tags": q.tags,
        "computeEnvironmentOrder": [
            {"order": order, "computeEnvironment": arns.compute_environment(ce)}
            for order, ce in zip(orders, q.spec.compute_environments, strict=False)],
        "schedulingPolicyArn": (arns.scheduling_policy(q.spec.scheduling_policy)
                                if q.spec.scheduling_policy else None),
    })


def retry_strategy(r: RetryStrategy) -> dict[str, Any] | None:
    """AWS's shape (actions in lower case, as AWS answers); None for the default (one
    attempt), which AWS leaves out."""
    if r == RetryStrategy():
        return None
    out: dict[str, Any] = {"attempts": r.attempts}
    if r.evaluate_on_exit:
        out["evaluateOnExit"] = [drop_none({
            "action": rule.action.value.lower(), "onExitCode": rule.on_exit_code,
            "onStatusReason": rule.on_reason}) for rule in r.evaluate_on_exit]
    return out


def env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def _container(props: dict | None, command, environment: dict[str, str],
               cpus: float, memory: int) -> dict[str, Any]:
    out = {key: [] for key in _EMPTY_LISTS} | dict(props or {})
    out["command"] = list(command)
    out["environment"] = env_list(environment)
    if "resourceRequirements" not in out:
        out.setdefault("vcpus", max(1, int(cpus)))
        out.setdefault("memory", memory)
    return out


def job_definition(d: JobDefinition, arns: Arns) -> dict[str, Any]:
    s, aws = d.spec, d.aws
    kind = aws.get("type") or ("multinode" if s.elastic else "container")
    container = _container(aws.get("containerProperties"), s.command, dict(s.environment),
                           s.resources.cpus, s.resources.memory_mib)
    if "FARGATE" in (aws.get("platformCapabilities") or ()):
        container.setdefault("fargatePlatformConfiguration", {"platformVersion": "LATEST"})
    out = {
        "jobDefinitionName": s.name, "jobDefinitionArn": arns.job_definition(s.name, d.revision),
        "revision": d.revision, "status": d.status, "type": kind,
        "parameters": dict(s.parameters), "retryStrategy": retry_strategy(s.retry_strategy),
        "tags": d.tags, "propagateTags": aws.get("propagateTags"),
        "platformCapabilities": aws.get("platformCapabilities"),
        "schedulingPriority": aws.get("schedulingPriority"),
        "containerOrchestrationType": "ECS",
        "timeout": (None if s.timeout_seconds is None
                    else {"attemptDurationSeconds": int(s.timeout_seconds)}),
    }
    if kind == "multinode":
        out["nodeProperties"] = aws.get("nodeProperties") or {
            "numNodes": s.elastic.max_workers if s.elastic else 1, "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": container}]}
    else:
        out["containerProperties"] = container
    return drop_none(out)


def task_of(job_id: str, attempt_no: int) -> str:
    task = job_id.replace(":", ".")
    return task if attempt_no <= 1 else f"{task}.attempt{attempt_no}"


def stream_name(definition_name: str | None, job_name: str, job_id: str,
                attempt_no: int) -> str:
    return f"{definition_name or job_name}/default/{task_of(job_id, attempt_no)}"


def stream_names(s: LogStream) -> tuple[str, str]:
    """A stream's name and the 2017-style name it also answers to."""
    return (stream_name(s.definition_name, s.job_name, s.job_id, s.attempt_no),
            f"{s.job_name}/{task_of(s.job_id, s.attempt_no)}")


def parse_stream(name: str) -> tuple[str, int] | None:
    """``(job id, attempt)`` a stream name (either form) stands for, or None."""
    m = _TASK.match(name.rsplit("/", 1)[-1])
    if m is None or "/" not in name:
        return None
    root, index, attempt = m.groups()
    return (root if index is None else f"{root}:{index}"), int(attempt or 1)


def batch_variables(job: Job) -> dict[str, str]:
    """The AWS_BATCH_* variables every worker of the job gets (the controller sets them)."""
    out = {"AWS_BATCH_JOB_ID": job.id, "AWS_BATCH_JQ_NAME": job.queue}
    if job.array_index is not None:
        out["AWS_BATCH_JOB_ARRAY_INDEX"] = str(job.array_index)
    return out


def _job_stream(job: Job, attempt_no: int) -> str:
    return stream_name(job.definition_name, job.name, job.id, attempt_no)


def _definition_arn(job: Job, arns: Arns) -> str:
    return arns.job_definition(job.definition_name or "inline", job.definition_revision or 0)


def _reason(job: Job) -> str | None:
    """A job's ``statusReason``: none once it SUCCEEDED (as AWS describes such a job)."""
    return None if job.status is JobStatus.SUCCEEDED else job.status_reason


def job_detail(job: Job, attempts: list[AttemptRecord], arns: Arns,
               children: list[JobStatus] | None = None) -> dict[str, Any]:
    """DescribeJobs' entry; ``children`` are an array parent's child statuses."""
    aws = job.aws
    out: dict[str, Any] = {
        "jobArn": arns.job(job.id), "jobName": job.name, "jobId": job.id,
        "jobQueue": arns.job_queue(job.queue), "status": job.status.value,
        "statusReason": _reason(job), "createdAt": ms(job.created_at),
        "startedAt": ms(job.started_at), "stoppedAt": ms(job.stopped_at),
        "jobDefinition": _definition_arn(job, arns), "parameters": dict(job.parameters),
        "retryStrategy": retry_strategy(job.retry_strategy), "tags": job.tags,
        "dependsOn": [drop_none({"jobId": d.job_id, "type": None if d.type.value == "STANDARD"
                                 else d.type.value}) for d in job.depends_on],
        "timeout": (None if job.timeout_seconds is None
                    else {"attemptDurationSeconds": int(job.timeout_seconds)}),
        "propagateTags": aws.get("propagateTags"),
        "platformCapabilities": aws.get("platformCapabilities"),
        "attempts": [], "shareIdentifier": job.share,
        "schedulingPriority": job.scheduling_priority if job.share is not None else None,
    }
    if job.is_array_parent:
        counts = Counter(s.value for s in children or ())
        out["arrayProperties"] = {"size": job.array_size,
                                  "statusSummary": {s.value: counts.get(s.value, 0)
                                                    for s in JobStatus}}
        return drop_none(out)
    if job.array_index is not None:
        out["arrayProperties"] = {"index": job.array_index}
    out["attempts"] = [drop_none({
        "container": drop_none({
            "exitCode": a.exit_code, "logStreamName": _job_stream(job, a.attempt_no),
            "taskArn": f"arn:aws:ecs:{arns.region}:{ACCOUNT}:task/{task_of(job.id, a.attempt_no)}",
            "containerInstanceArn": f"arn:aws:ecs:{arns.region}:{ACCOUNT}:container-instance/"
                                    "local", "networkInterfaces": []}),
        "startedAt": ms(a.started_at), "stoppedAt": ms(a.stopped_at),
        "statusReason": a.reason}) for a in attempts if a.stopped_at is not None]
    container = _container(aws.get("container"), job.command,
                           {**job.environment, **batch_variables(job)},
                           job.resources.cpus, job.resources.memory_mib)
    if attempts:
        container["logStreamName"] = _job_stream(job, attempts[-1].attempt_no)
    if job.status.is_terminal() and job.exit_code is not None:
        container["exitCode"] = job.exit_code
    out["container"] = container  # a multi-node job's too: its nodes share one stream
    if job.num_nodes:
        out["nodeProperties"] = {**(aws.get("nodeProperties") or {
            "mainNode": 0, "nodeRangeProperties": [{"targetNodes": "0:",
                                                    "container": container}]}),
            "numNodes": job.num_nodes}
    return drop_none(out)


def job_summary(job: Job, arns: Arns) -> dict[str, Any]:
    out: dict[str, Any] = {
        "jobArn": arns.job(job.id), "jobId": job.id, "jobName": job.name,
        "createdAt": ms(job.created_at), "status": job.status.value,
        "statusReason": _reason(job), "startedAt": ms(job.started_at),
        "stoppedAt": ms(job.stopped_at), "jobDefinition": _definition_arn(job, arns),
    }
    if job.status.is_terminal() and job.exit_code is not None:
        out["container"] = {"exitCode": job.exit_code}
    if job.is_array_parent:
        out["arrayProperties"] = {"size": job.array_size}
    elif job.array_index is not None:
        out["arrayProperties"] = {"index": job.array_index}
    if job.num_nodes:
        out["nodeProperties"] = {"numNodes": job.num_nodes}
    return drop_none(out)


def unknown_operation(name: str) -> AwsError:
    return AwsError("UnknownOperationException", f"dyntrain does not implement {name}", 400)
