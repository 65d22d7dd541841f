"""AWS Batch: submit, describe, list, cancel and terminate jobs, by the service's operations.

SubmitJob has no client token of its own, so the SDK's ``amz-sdk-invocation-id`` (the same on
every retry of one call) is the job's: a retried submit whose first try did create the job gets
that job back instead of a second one.
"""

from __future__ import annotations

import contextlib
from typing import Any

from dyntrain.service.aws import mapping, shapes
from dyntrain.service.aws.batch_resources import definition_of
from dyntrain.service.aws.context import Context, Handler
from dyntrain.service.aws.errors import client_error
from dyntrain.service.aws.shapes import name_of, page_offset, page_token
from dyntrain.service.core.model import JobStatus, ValidationError

MAX_DESCRIBE = 100
_FILTERS = ("JOB_NAME", "JOB_DEFINITION", "BEFORE_CREATED_AT", "AFTER_CREATED_AT")


def submit_job(ctx: Context, p: dict) -> dict[str, Any]:
    queue = name_of(p["jobQueue"], "job-queue")
    definition = definition_of(ctx, p["jobDefinition"])
    job = ctx.ops.jobs.submit(queue=queue, client_token=ctx.client_token,
                              **mapping.submission(p, definition))
    return {"jobArn": ctx.arns.job(job.id), "jobName": job.name, "jobId": job.id}


def describe_jobs(ctx: Context, p: dict) -> dict[str, Any]:
    """The jobs found, in the order asked; unknown ids are left out (as AWS does)."""
    ids = p["jobs"]
    if len(ids) > MAX_DESCRIBE:
        raise client_error(f"describe at most {MAX_DESCRIBE} jobs at a time, got {len(ids)}")
    jobs, out = ctx.ops.jobs, []
    for job_id in dict.fromkeys(ids):
        try:
            job = jobs.get(job_id)
        except ValidationError:
            continue
        children = jobs.child_statuses(job.id) if job.is_array_parent else None
        attempts = [] if job.is_array_parent else jobs.attempts(job.id)
        out.append(shapes.job_detail(job, attempts, ctx.arns, children))
    return {"jobs": out}


def _filters(p: dict) -> dict[str, Any]:
    """ListJobs' ``filters`` as ``Jobs.list`` filters."""
    out: dict[str, Any] = {}
    for f in p.get("filters") or ():
        name, values = f.get("name"), f.get("values") or []
        if name not in _FILTERS or len(values) != 1:
            raise client_error(f"a ListJobs filter is one of {', '.join(_FILTERS)} with one "
                               f"value, got {name!r} with {len(values)}")
        value = values[0]
        if name == "JOB_NAME":
            out["name"] = value
        elif name == "JOB_DEFINITION":
            out["definition"] = name_of(value, "job-definition")
        else:
            try:
                at = int(value) / 1000
            except ValueError:
                raise client_error(f"{name} is epoch milliseconds, got {value!r}") from None
            out["created_before" if name == "BEFORE_CREATED_AT" else "created_after"] = at
    return out


def list_jobs(ctx: Context, p: dict) -> dict[str, Any]:
    """A queue's top-level jobs, or an array job's children. Without ``filters`` only jobs in
    ``jobStatus`` (default RUNNING) are listed, oldest first; with them, jobs in every status,
    newest first (AWS's documented behaviour for both)."""
    where: dict[str, Any] = _filters(p)
    if p.get("multiNodeJobId"):
        raise client_error("multiNodeJobId: a dyntrain multi-node job has no per-node jobs; "
                           "describe the job itself")
    if p.get("arrayJobId"):
        where["parent"] = p["arrayJobId"]
    elif p.get("jobQueue"):
        where.update(queue=name_of(p["jobQueue"], "job-queue"), top_level=True)
    else:
        raise client_error("ListJobs needs jobQueue, arrayJobId or multiNodeJobId")
    if p.get("filters"):
        where["newest_first"] = True
    else:
        where["status"] = p.get("jobStatus") or JobStatus.RUNNING.value
    limit = p.get("maxResults") or 100
    if not 1 <= limit <= 1000:
        raise client_error(f"maxResults must be 1-1000, got {limit}")
    offset = page_offset(p.get("nextToken"))
    found = ctx.ops.jobs.list(limit=limit + 1, offset=offset, **where)
    out: dict[str, Any] = {"jobSummaryList": [shapes.job_summary(j, ctx.arns)
                                              for j in found[:limit]]}
    if len(found) > limit:
        out["nextToken"] = page_token(offset + limit)
    return out


def cancel_job(ctx: Context, p: dict) -> dict[str, Any]:
    """Cancels a job that has not started (it ends FAILED with ``reason``). A job that already
    started or finished, or an unknown id, is left alone and the call still succeeds, as on
    AWS."""
    job_id, reason = _job_id(p), _reason(p)
    with contextlib.suppress(ValidationError):  # Unknown, or Refused by the job's state
        ctx.ops.jobs.cancel(job_id, reason)
    return {}


def terminate_job(ctx: Context, p: dict) -> dict[str, Any]:
    """Stops a job whatever its state; it ends FAILED with ``reason`` and is not retried (a
    finished job or an unknown id: nothing happens, and the call succeeds, as on AWS)."""
    job_id, reason = _job_id(p), _reason(p)
    with contextlib.suppress(ValidationError):  # Unknown, or Refused: it already finished
        ctx.ops.jobs.terminate(job_id, reason)
    return {}


def _job_id(p: dict) -> str:
    if not p["jobId"]:
        raise client_error("jobId must not be empty")
    return p["jobId"]


def _reason(p: dict) -> str:
    reason = " ".join(str(p.get("reason") or "").split())
    if not reason:
        raise client_error("reason must not be empty")
    return reason[:1024]


OPERATIONS: dict[str, Handler] = {
    "SubmitJob": submit_job,
    "DescribeJobs": describe_jobs,
    "ListJobs": list_jobs,
    "CancelJob": cancel_job,
    "TerminateJob": terminate_job,
}
