"""AWS Batch: submit, describe, list, cancel and terminate jobs, over the one store and controller.

SubmitJob has no client token of its own, so the SDK's ``amz-sdk-invocation-id`` (the same on
every retry of one call) is the job's: a retried submit whose first try did create the job gets
that job back instead of a second one.
"""

from __future__ import annotations

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
    with ctx.service.lock:
        definition = definition_of(ctx, p["jobDefinition"])
        job = ctx.service.store.submit(queue=queue, client_token=ctx.client_token,
                                       kernel_levels=ctx.service.executor.kernel_levels(),
                                       **mapping.submission(p, definition))
    return {"jobArn": ctx.arns.job(job.id), "jobName": job.name, "jobId": job.id}


def describe_jobs(ctx: Context, p: dict) -> dict[str, Any]:
    """The jobs found, in the order asked; unknown ids are left out (as AWS does)."""
    ids = p["jobs"]
    if len(ids) > MAX_DESCRIBE:
        raise client_error(f"describe at most {MAX_DESCRIBE} jobs at a time, got {len(ids)}")
    store, out = ctx.service.store, []
    for job_id in dict.fromkeys(ids):
        try:
            job = store.get_job(job_id)
        except ValidationError:
            continue
        children = store.child_statuses(job.id) if job.is_array_parent else None
        attempts = [] if job.is_array_parent else store.list_attempts(job.id)
        out.append(shapes.job_detail(job, attempts, ctx.arns, children))
    return {"jobs": out}


def _filters(p: dict) -> dict[str, Any]:
    """ListJobs' ``filters`` as ``Store.list_jobs`` arguments."""
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
    found = ctx.service.store.list_jobs(limit=limit + 1, offset=offset, **where)
    out: dict[str, Any] = {"jobSummaryList": [shapes.job_summary(j, ctx.arns)
                                              for j in found[:limit]]}
    if len(found) > limit:
        out["nextToken"] = page_token(offset + limit)
    return out


def cancel_job(ctx: Context, p: dict) -> dict[str, Any]:
    """Cancels a job that has not started (it ends FAILED with ``reason``). A job that already
    started or finished, or an unknown id, is left alone and the call still succeeds, as on
    AWS."""
    with ctx.service.lock:
        job = _job(ctx, p)
        if job is not None and not job.status.is_terminal() and not job.status.is_active():
            ctx.service.controller.cancel(job.id, _reason(p))
    return {}


def terminate_job(ctx: Context, p: dict) -> dict[str, Any]:
    """Stops a job whatever its state; it ends FAILED with ``reason`` and is not retried (a
    finished job or an unknown id: nothing happens, and the call succeeds, as on AWS)."""
    with ctx.service.lock:
        job = _job(ctx, p)
        if job is not None and not job.status.is_terminal():
            ctx.service.controller.terminate(job.id, _reason(p))
    return {}


def _job(ctx: Context, p: dict):
    if not p["jobId"]:
        raise client_error("jobId must not be empty")
    _reason(p)
    try:
        return ctx.service.store.get_job(p["jobId"])
    except ValidationError:
        return None


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
