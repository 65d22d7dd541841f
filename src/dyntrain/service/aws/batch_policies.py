"""AWS Batch: fair-share scheduling policies and a job queue's snapshot, by the service's
operations.

A policy's ``fairsharePolicy`` is checked with AWS's ranges (``core/fairshare.py``):
``shareDecaySeconds`` 0-604800, ``computeReservation`` 0-99, up to 500 ``shareDistribution``
entries whose identifiers (letters and digits, a trailing ``*`` for a prefix) do not overlap,
``weightFactor`` 0.0001-999.9999. A policy a job queue uses is not deleted. ``quotaSharePolicy``
(quota-share policies) is not implemented.

``GetJobQueueSnapshot`` answers the queue's first 100 RUNNABLE jobs in the order the
scheduler's last pass would start them (``frontOfQueue``; ``earliestTimeAtPosition`` is when
the job became RUNNABLE), and the slots (vCPUs) each share holds now
(``queueUtilization``).
"""

from __future__ import annotations

from typing import Any

from dyntrain.service.aws.context import Context, Handler
from dyntrain.service.aws.errors import client_error
from dyntrain.service.aws.shapes import drop_none, ms, name_of, page, page_offset
from dyntrain.service.core.fairshare import FairsharePolicy, ShareAttributes
from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.records import SchedulingPolicy
from dyntrain.service.operations.errors import PolicyInUse, Unknown

_KIND = "scheduling-policy"


def fairshare_policy(p: dict | None) -> FairsharePolicy:
    """A request's ``fairsharePolicy`` (absent: AWS's defaults, all zero and no shares)."""
    p = p or {}
    try:
        return FairsharePolicy(
            p.get("shareDecaySeconds") or 0, p.get("computeReservation") or 0,
            tuple(ShareAttributes(s.get("shareIdentifier"), s.get("weightFactor", 1.0))
                  for s in p.get("shareDistribution") or ()))
    except ValidationError as e:
        raise client_error(str(e)) from None


def _no_quota(p: dict) -> None:
    if p.get("quotaSharePolicy"):
        raise client_error("quotaSharePolicy: dyntrain implements fair share scheduling "
                           "policies (fairsharePolicy) only")


def policy_detail(policy: SchedulingPolicy, arn: str) -> dict[str, Any]:
    f = policy.fairshare
    return {"name": policy.name, "arn": arn, "tags": policy.tags, "fairsharePolicy": {
        "shareDecaySeconds": f.share_decay_seconds,
        "computeReservation": f.compute_reservation,
        "shareDistribution": [{"shareIdentifier": a.identifier, "weightFactor": a.weight_factor}
                              for a in f.shares]}}


def create_scheduling_policy(ctx: Context, p: dict) -> dict[str, Any]:
    _no_quota(p)
    policy = ctx.ops.policies.create(p["name"], fairshare_policy(p.get("fairsharePolicy")),
                                     tags=p.get("tags"))
    return {"name": policy.name, "arn": ctx.arns.scheduling_policy(policy.name)}


def describe_scheduling_policies(ctx: Context, p: dict) -> dict[str, Any]:
    """The policies found, in the order asked; unknown ARNs are left out."""
    out = []
    for arn in dict.fromkeys(p["arns"]):
        try:
            policy = ctx.ops.policies.get(name_of(arn, _KIND))
        except Unknown:
            continue
        out.append(policy_detail(policy, ctx.arns.scheduling_policy(policy.name)))
    return {"schedulingPolicies": out}


def list_scheduling_policies(ctx: Context, p: dict) -> dict[str, Any]:
    limit = p.get("maxResults") or 100
    if not 1 <= limit <= 1000:
        raise client_error(f"maxResults must be 1-1000, got {limit}")
    arns = [{"arn": ctx.arns.scheduling_policy(x.name)} for x in ctx.ops.policies.list()]
    return page(arns, page_offset(p.get("nextToken")), limit, "schedulingPolicies")


def update_scheduling_policy(ctx: Context, p: dict) -> dict[str, Any]:
    _no_quota(p)
    ctx.ops.policies.update(name_of(p["arn"], _KIND), fairshare_policy(p.get("fairsharePolicy")))
    return {}


def delete_scheduling_policy(ctx: Context, p: dict) -> dict[str, Any]:
    name = name_of(p["arn"], _KIND)
    try:
        ctx.ops.policies.delete(name)
    except PolicyInUse as e:
        raise client_error(f"Cannot delete scheduling policy {p['arn']}: it is in use by job "
                           f"queue(s) {', '.join(e.queues)}") from None
    return {}


def get_job_queue_snapshot(ctx: Context, p: dict) -> dict[str, Any]:
    snap = ctx.ops.queues.snapshot(name_of(p["jobQueue"], "job-queue"))
    at = ms(snap.at)
    out: dict[str, Any] = {"frontOfQueue": {
        "jobs": [{"jobArn": ctx.arns.job(job.id), "earliestTimeAtPosition": ms(job.updated_at)}
                 for job, _ in snap.front],
        "lastUpdatedAt": at}}
    used = sum(snap.held.values())
    utilization: dict[str, Any] = {
        "totalCapacityUsage": [{"capacityUnit": "VCPU", "quantity": float(used)}],
        "lastUpdatedAt": at}
    if snap.queue.spec.scheduling_policy is not None:
        shares = sorted(((s, n) for s, n in snap.held.items() if n > 0),
                        key=lambda sn: (-sn[1], sn[0]))
        utilization["fairshareUtilization"] = {
            "activeShareCount": len(shares),
            "topCapacityUtilization": [
                {"shareIdentifier": s, "capacityUsage": [{"capacityUnit": "VCPU",
                                                          "quantity": float(n)}]}
                for s, n in shares[:20]]}
    out["queueUtilization"] = drop_none(utilization)
    return out


OPERATIONS: dict[str, Handler] = {
    "CreateSchedulingPolicy": create_scheduling_policy,
    "DescribeSchedulingPolicies": describe_scheduling_policies,
    "ListSchedulingPolicies": list_scheduling_policies,
    "UpdateSchedulingPolicy": update_scheduling_policy,
    "DeleteSchedulingPolicy": delete_scheduling_policy,
    "GetJobQueueSnapshot": get_job_queue_snapshot,
}
