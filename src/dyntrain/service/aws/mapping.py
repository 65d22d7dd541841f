"""AWS Batch requests as dyntrain specs: what each field becomes, and what is only recorded.

- Capacity is counted in vCPUs: one vCPU of an environment is one worker slot, and every node of
  a job (one for a container job, ``numNodes`` for a multi-node job) takes one slot. A MANAGED
  environment offers ``desiredvCpus`` slots now (``maxvCpus`` when not given: AWS would scale
  up to it on demand); raising or lowering ``desiredvCpus`` later is how capacity comes and
  goes. ``EC2``/``FARGATE`` are on-demand capacity, ``SPOT``/``FARGATE_SPOT`` spot. An
  UNMANAGED environment is this machine: ``unmanagedvCpus`` slots, or one per CPU.
- Job definitions run their ``command`` as a process (no container runtime): ``image``,
  ``vcpus``, ``memory``, ``resourceRequirements``, ``volumes``, ``mountPoints`` and the other
  container fields are recorded and described back, not applied.
- Multi-node jobs: every node runs the main node's command with ``AWS_BATCH_JOB_NUM_NODES``,
  ``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX`` and
  ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` set. With the tag ``dyntrain:elastic`` =
  ``MIN:MAX`` (or ``MIN``; MAX defaults to ``numNodes``), on the job definition or the job, the
  job is elastic: dyntrain's coordinator runs it between MIN and MAX workers as capacity allows.
  With ``dyntrain:launcher`` = ``torchrun`` too, it runs a plain DDP script instead, with
  torchrun's variables, restarted at each change of size (``core/torchrun.py``).
"""

from __future__ import annotations

import os
import re
from typing import Any

from dyntrain.service.aws.errors import client_error
from dyntrain.service.aws.shapes import name_of
from dyntrain.service.core.fairshare import check_priority
from dyntrain.service.core.model import (
    CapacityType,
    ComputeEnvironmentSpec,
    Dependency,
    ElasticSettings,
    JobDefinitionSpec,
    JobQueueSpec,
    Resources,
    RetryRule,
    RetryStrategy,
    ValidationError,
    parse_launcher,
)
from dyntrain.service.core.records import JobDefinition

ELASTIC_TAG = "dyntrain:elastic"
LAUNCHER_TAG = "dyntrain:launcher"
SLOT = Resources()  # one vCPU: what a node takes
_CAPACITY = {"EC2": CapacityType.ON_DEMAND, "FARGATE": CapacityType.ON_DEMAND,
             "ECS_MANAGED_INSTANCES": CapacityType.ON_DEMAND, "SPOT": CapacityType.SPOT,
             "FARGATE_SPOT": CapacityType.SPOT}
_VCPUS = ("minvCpus", "maxvCpus", "desiredvCpus")
_RANGE = re.compile(r"^(\d*)(:?)(\d*)$")


# ------------------------------------------------------------------- compute environments


def compute_environment(p: dict) -> tuple[ComputeEnvironmentSpec, dict[str, Any]]:
    """The spec and the AWS fields to keep, from CreateComputeEnvironment's request."""
    name, kind = p["computeEnvironmentName"], p["type"]
    aws: dict[str, Any] = {"type": kind, "serviceRole": p.get("serviceRole")}
    if kind == "MANAGED":
        resources = p.get("computeResources")
        if not resources:
            raise client_error("a MANAGED compute environment needs computeResources")
        if resources["type"] in ("EC2", "SPOT"):  # AWS's own checks, in its words
            if not resources.get("instanceRole"):
                raise client_error("Error executing request, Exception : Instance role is "
                                   "required.")
            if "minvCpus" not in resources:
                raise client_error("Error executing request, Exception : Resource minvCpus "
                                   "is required.")
        high = resources["maxvCpus"]
        spec = ComputeEnvironmentSpec(
            name, _CAPACITY[resources["type"]], 0.0, SLOT, resources.get("minvCpus", 0),
            resources.get("desiredvCpus", high), high, p.get("state", "ENABLED"))
        aws["computeResources"] = {k: v for k, v in resources.items() if k not in _VCPUS}
    else:
        slots = p.get("unmanagedvCpus") or os.cpu_count() or 1
        spec = ComputeEnvironmentSpec(name, CapacityType.ON_DEMAND, 0.0, SLOT, 0, slots, slots,
                                      p.get("state", "ENABLED"))
    return spec, {k: v for k, v in aws.items() if v is not None}


def compute_environment_changes(p: dict, spec: ComputeEnvironmentSpec,
                                aws: dict[str, Any]) -> dict[str, Any]:
    """``Store.environments.update_compute_environment`` arguments from UpdateComputeEnvironment's
    request: a new min or max without a desired value keeps the desired slots within them."""
    resources = p.get("computeResources") or {}
    if aws.get("type") == "UNMANAGED" and p.get("unmanagedvCpus") is not None:
        resources = {"minvCpus": 0, "maxvCpus": p["unmanagedvCpus"],
                     "desiredvCpus": p["unmanagedvCpus"]}
    low = resources.get("minvCpus", spec.min_slots)
    high = resources.get("maxvCpus", spec.max_slots)
    desired = resources.get("desiredvCpus", min(max(spec.desired_slots, low), high))
    kept = dict(aws)
    if p.get("serviceRole"):
        kept["serviceRole"] = p["serviceRole"]
    if "computeResources" in kept:
        kept["computeResources"] = {**kept["computeResources"], **{
            k: v for k, v in resources.items() if k not in _VCPUS}}
    return {"state": p.get("state"), "min_slots": low, "desired_slots": desired,
            "max_slots": high, "aws": kept}


# ----------------------------------------------------------------------------- job queues


def job_queue_order(p: dict) -> tuple[tuple[str, ...], list[int]]:
    """Environment names in ``computeEnvironmentOrder``'s order, and the order numbers."""
    order = sorted(p.get("computeEnvironmentOrder") or (), key=lambda o: o["order"])
    if not order:
        raise client_error("At least 1 compute environment must be provided")
    return (tuple(name_of(o["computeEnvironment"], "compute-environment") for o in order),
            [o["order"] for o in order])


def job_queue(p: dict) -> tuple[JobQueueSpec, dict[str, Any]]:
    envs, orders = job_queue_order(p)
    policy = p.get("schedulingPolicyArn")
    spec = JobQueueSpec(p["jobQueueName"], p["priority"], envs, p.get("state", "ENABLED"),
                        None if policy is None else name_of(policy, "scheduling-policy"))
    return spec, {"orders": orders}


# ------------------------------------------------------------------------ job definitions


def retry_strategy(d: dict | None) -> RetryStrategy | None:
    if d is None:
        return None
    rules = tuple(RetryRule(r["action"].upper(), r.get("onExitCode"),
                            r.get("onStatusReason") or r.get("onReason"))
                  for r in d.get("evaluateOnExit") or ())
    return RetryStrategy(d.get("attempts", 1), rules)


def _environment(items: list[dict] | None) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in items or () if e.get("name")}


def _covers(target: str, node: int, num_nodes: int) -> bool:
    m = _RANGE.match(target.strip())
    if m is None or not (m.group(1) or m.group(3)):
        raise client_error(f"targetNodes {target!r} must be N, N:, :M or N:M")
    start = int(m.group(1) or 0)
    end = int(m.group(3)) if m.group(3) else (num_nodes - 1 if m.group(2) else start)
    return start <= node <= end


def _main_container(node_properties: dict) -> dict:
    """The main node's container; every node runs it, so the ranges must agree on it."""
    ranges = node_properties["nodeRangeProperties"]
    main, count = node_properties["mainNode"], node_properties["numNodes"]
    if not 0 <= main < count:
        raise client_error(f"mainNode {main} must lie in [0, numNodes={count})")
    mains = [r.get("container") or {} for r in ranges if _covers(r["targetNodes"], main, count)]
    if not mains:
        raise client_error(f"no nodeRangeProperties entry covers the main node {main}")
    for r in ranges:
        c = r.get("container") or {}
        if (c.get("command"), _environment(c.get("environment"))) != (
                mains[0].get("command"), _environment(mains[0].get("environment"))):
            raise client_error("every node of a dyntrain multi-node job runs one command: node "
                               "ranges must not differ in command or environment")
    return mains[0]


def elastic_range(tags: dict[str, str], num_nodes: int) -> ElasticSettings | None:
    """The ``dyntrain:elastic`` tag (``MIN:MAX`` or ``MIN``) as worker bounds, with the
    ``dyntrain:launcher`` tag's launcher, or None."""
    value, launcher = tags.get(ELASTIC_TAG), tags.get(LAUNCHER_TAG)
    if value is None:
        if launcher is not None:
            raise client_error(f"tag {LAUNCHER_TAG} needs the tag {ELASTIC_TAG} (MIN:MAX)")
        return None
    low, colon, high = value.partition(":")
    if not low.strip().isdigit() or (colon and not high.strip().isdigit()):
        raise client_error(f"tag {ELASTIC_TAG} must be MIN or MIN:MAX (numbers), got {value!r}")
    try:
        chosen = parse_launcher(launcher)
    except ValidationError as exc:
        raise client_error(f"tag {LAUNCHER_TAG}: {exc}") from None
    return ElasticSettings(int(low), int(high) if colon else num_nodes, chosen)


def job_definition(p: dict) -> tuple[JobDefinitionSpec, dict[str, Any]]:
    """The spec and the AWS fields to keep, from RegisterJobDefinition's request."""
    kind, tags = p["type"], p.get("tags") or {}
    aws: dict[str, Any] = {"type": kind, "propagateTags": p.get("propagateTags"),
                           "platformCapabilities": p.get("platformCapabilities"),
                           "schedulingPriority": _priority(p, "schedulingPriority")}
    elastic = None
    if kind == "multinode":
        nodes = p.get("nodeProperties")
        if not nodes:
            raise client_error("a multinode job definition needs nodeProperties")
        container = _main_container(nodes)
        aws["nodeProperties"] = nodes
        elastic = elastic_range(tags, nodes["numNodes"])
    else:
        container = p.get("containerProperties") or {}
        if ELASTIC_TAG in tags or LAUNCHER_TAG in tags:
            raise client_error(f"tag {ELASTIC_TAG} needs a multinode job definition (type "
                               "multinode, nodeProperties.numNodes = the most workers)")
    aws["containerProperties"] = {k: v for k, v in container.items()
                                  if k not in ("command", "environment")}
    timeout = (p.get("timeout") or {}).get("attemptDurationSeconds")
    spec = JobDefinitionSpec(
        p["jobDefinitionName"], tuple(container.get("command") or ()),
        tuple(_environment(container.get("environment")).items()),
        tuple((p.get("parameters") or {}).items()), SLOT,
        retry_strategy(p.get("retryStrategy")) or RetryStrategy(), timeout, elastic)
    return spec, {k: v for k, v in aws.items() if v is not None}


# ------------------------------------------------------------------------------------- jobs


def _node_overrides(p: dict, num_nodes: int) -> dict:
    """The container overrides of the node range covering node 0 (every node runs them)."""
    chosen: list[dict] = []
    for o in (p.get("nodeOverrides") or {}).get("nodePropertyOverrides") or ():
        if _covers(o["targetNodes"], 0, num_nodes):
            chosen.append(o.get("containerOverrides") or {})
    if len({repr(c) for c in chosen}) > 1:
        raise client_error("every node of a dyntrain multi-node job runs one command: "
                           "nodePropertyOverrides must agree for the main node")
    return chosen[0] if chosen else {}


def _dependency(d: dict) -> Dependency:
    """``SEQUENTIAL`` without a job id chains an array job's own children; with another
    job's id it waits for that job, as a plain dependency does."""
    kind = d.get("type") or "STANDARD"
    if kind == "SEQUENTIAL" and d.get("jobId"):
        kind = "STANDARD"
    return Dependency(d.get("jobId", ""), kind)


def _priority(p: dict, key: str) -> int | None:
    if p.get(key) is None:
        return None
    try:
        return check_priority(p[key], key)
    except ValidationError as exc:
        raise client_error(str(exc)) from None


def submission(p: dict, d: JobDefinition) -> dict[str, Any]:
    """``Store.jobs.submit`` arguments (but the queue and the client token) from SubmitJob's
    request for definition ``d``."""
    kind = d.aws.get("type", "multinode" if d.spec.elastic else "container")
    tags = p.get("tags") or {}
    overrides = dict(p.get("containerOverrides") or {})
    num_nodes = workers = None
    if kind == "multinode":
        nodes = d.aws.get("nodeProperties") or {}
        num_nodes = ((p.get("nodeOverrides") or {}).get("numNodes") or nodes.get("numNodes")
                     or (d.spec.elastic.max_workers if d.spec.elastic else 1))
        overrides = {**overrides, **_node_overrides(p, num_nodes)}
        elastic = elastic_range({**d.tags, **tags}, num_nodes)
        workers = None if elastic is None else (elastic.min_workers, elastic.max_workers)
    elif p.get("nodeOverrides"):
        raise client_error("nodeOverrides need a multinode job definition")
    elif ELASTIC_TAG in tags:
        raise client_error(f"tag {ELASTIC_TAG} needs a multinode job definition")
    container = {**d.aws.get("containerProperties", {}),
                 **{k: v for k, v in overrides.items() if k not in ("command", "environment")}}
    depends = [_dependency(x) for x in p.get("dependsOn") or ()]
    aws = {"container": container, "nodeProperties": d.aws.get("nodeProperties"),
           "propagateTags": p.get("propagateTags", d.aws.get("propagateTags")),
           "platformCapabilities": d.aws.get("platformCapabilities")}
    priority = _priority(p, "schedulingPriorityOverride")
    return {
        "definition": d.ref, "name": p["jobName"], "command": overrides.get("command"),
        "environment": _environment(overrides.get("environment")),
        "parameters": p.get("parameters") or {},
        "array_size": (p.get("arrayProperties") or {}).get("size"), "depends_on": depends,
        "retry_strategy": retry_strategy(p.get("retryStrategy")),
        "timeout_seconds": (p.get("timeout") or {}).get("attemptDurationSeconds"),
        "num_nodes": num_nodes, "workers": workers, "tags": tags,
        "launcher": None if workers is None else elastic.launcher.value,
        "aws": {k: v for k, v in aws.items() if v is not None},
        "share": p.get("shareIdentifier"),
        "scheduling_priority": d.aws.get("schedulingPriority") if priority is None else priority,
    }
