"""The dashboard's routes: pages, the parts that pages re-render while they are open, the JSON
the charts poll, and the login page. None of them is in the API's OpenAPI document.

A page is rendered whole once; its live sections (``data-part``) are fetched again every couple
of seconds from ``/ui/part/...`` as ``{section: html}`` and swapped in by ``static/dashboard.js``;
the charts poll ``/ui/data/...`` and append what is new. Actions (cancel, terminate, desired
capacity) are the native API's own routes, called by the page's script.
"""

from __future__ import annotations

import hmac
import re
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment

from dyntrain.errors import DyntrainError
from dyntrain.service.core.jobtext import one_line
from dyntrain.service.core.records import Job
from dyntrain.service.operations import Operations
from dyntrain.service.web import auth, context, lab
from dyntrain.service.web.capacity import CapacityHistory

OVERVIEW_PARTS = ("replicas", "environments", "queues", "jobs")
JOB_PARTS = ("summary", "membership", "checkpoints", "cost", "workers", "attempts", "array")
CAPACITY_WINDOW = 3600.0  # seconds of capacity history the overview plots
AMBIGUOUS_SHOWN = 10  # job ids listed on the page of an ambiguous short id
_CHILD_FOLDER = re.compile(r"^(.+)_(\d+)$")  # an array child as its run folder names it
Text = Annotated[str, Query(max_length=200)]
Page = Annotated[int, Query(ge=0, le=1_000_000)]
Offset = Annotated[int, Query(ge=0, le=2**53)]


def build_router(ops: Operations, env: Environment, history: CapacityHistory,
                 lab_report: lab.LabReport = lab.no_report) -> APIRouter:
    """The dashboard's routes over the service's operations.

    Args:
        ops: what the pages show.
        env: the templates (``render.make_environment``).
        history: the environments' capacity over time (the overview's chart).
        lab_report: what reports a lab sweep's folder (the lab page).
    """
    router = APIRouter(include_in_schema=False)

    def page(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("token_required", bool(ops.token))
        ctx.setdefault("now", ops.clock())
        return HTMLResponse(env.get_template(name).render(**ctx), status_code=status)

    def parts(names: tuple[str, ...], ctx: dict[str, Any]) -> JSONResponse:
        ctx.setdefault("now", ops.clock())
        return JSONResponse({n: env.get_template(f"parts/{n}.html").render(**ctx)
                             for n in names})

    def not_found(message: str) -> HTMLResponse:
        return page("error.html", status=404, title="Not found", message=message)

    def find_job(job_id: str) -> Job | None:
        try:
            return ops.jobs.get(job_id)
        except DyntrainError:
            return None

    def by_prefix(ref: str) -> tuple[Job | None, list[str]]:
        """The job a short id names, as the CLI prints them (a unique prefix of a job id; an
        array child as PREFIX:N or PREFIX_N); else None and the ids the prefix matches."""
        parent, sep, index = ref.partition(":")
        folder = _CHILD_FOLDER.match(ref) if not sep else None
        if folder:
            parent, sep, index = folder.group(1), ":", folder.group(2)
        ids = ops.jobs.ids_starting_with(parent, limit=AMBIGUOUS_SHOWN + 1)
        if len(ids) != 1:
            return None, ids
        return find_job(ids[0] + sep + index), ids

    def overview_ctx(status: str, queue: str, q: str, page_no: int) -> dict[str, Any]:
        return context.overview(ops, context.JobFilters.parse(status, queue, q, page_no))

    @router.get("/", response_class=HTMLResponse)
    def overview(status: Text = "", queue: Text = "", q: Text = "", page_no: Annotated[
            int, Query(alias="page", ge=0, le=1_000_000)] = 0) -> HTMLResponse:
        try:
            ctx = overview_ctx(status, queue, q, page_no)
        except DyntrainError as e:
            return page("error.html", status=400, title="Bad filter", message=one_line(e))
        return page("overview.html", **ctx)

    @router.get("/ui/part/overview")
    def overview_parts(status: Text = "", queue: Text = "", q: Text = "", page_no: Annotated[
            int, Query(alias="page", ge=0, le=1_000_000)] = 0) -> JSONResponse:
        return parts(OVERVIEW_PARTS, overview_ctx(status, queue, q, page_no))

    @router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(request: Request, job_id: str, child_status: Text = "",
                 child_page: Page = 0) -> Response:
        job = find_job(job_id)
        if job is None:
            job, matches = by_prefix(job_id)
            if len(matches) > 1:
                return page("ambiguous.html", status=409, ref=job_id,
                            matches=matches[:AMBIGUOUS_SHOWN],
                            more=len(matches) > AMBIGUOUS_SHOWN,
                            title=f"Job id {job_id!r} is ambiguous")
            if job is None:
                return not_found(f"unknown job {job_id!r}")
            query = f"?{request.url.query}" if request.url.query else ""
            return RedirectResponse(f"/ui/jobs/{quote(job.id, safe=':')}{query}",
                                    status_code=307)
        return page("job.html", **context.job_page(ops, job, child_status.upper(),
                                                   child_page))

    @router.get("/ui/part/jobs/{job_id}")
    def job_parts(job_id: str, child_status: Text = "", child_page: Page = 0) -> Response:
        job = find_job(job_id)
        if job is None:
            return JSONResponse({"detail": f"unknown job {job_id!r}"}, status_code=404)
        return parts(JOB_PARTS, context.job_page(ops, job, child_status.upper(), child_page))

    @router.get("/ui/data/jobs/{job_id}/series")
    def job_series(job_id: str, offset: Offset = 0) -> JSONResponse:
        job = find_job(job_id)
        if job is None:
            return JSONResponse({"detail": f"unknown job {job_id!r}"}, status_code=404)
        return JSONResponse(context.job_series(ops, job, offset))

    @router.get("/ui/data/capacity")
    def capacity() -> JSONResponse:
        now = ops.clock()
        table = history.table(now, since=now - CAPACITY_WINDOW)
        types = {ce.name: ce.spec.capacity_type.value
                 for ce in ops.environments.list()}
        for env in table["environments"]:
            env["capacity_type"] = types.get(env["name"])
        return JSONResponse(table)

    @router.get("/ui/lab", response_class=HTMLResponse)
    def lab_page() -> HTMLResponse:
        runs = lab.sweeps(ops)
        return page("lab.html", sweeps=[(run, lab_report(run.root)) for run in runs])

    @router.get(auth.LOGIN_PATH, response_class=HTMLResponse)
    def login_form(next: Text = "/") -> HTMLResponse:
        return page("login.html", next=_safe_next(next), message="")

    @router.post(auth.LOGIN_PATH)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body())[:10_000].decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0]
        target = _safe_next((form.get("next") or ["/"])[0])
        expected = ops.token
        if expected is None:
            return RedirectResponse(target, status_code=303)
        if not hmac.compare_digest(token.encode(), expected.encode()):
            return page("login.html", status=401, next=target,
                        message="wrong token: the service refused it")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(auth.COOKIE, auth.session_value(expected), httponly=True,
                            samesite="strict", path="/")
        return response

    @router.post("/ui/logout")
    def logout() -> Response:
        response = RedirectResponse(auth.LOGIN_PATH, status_code=303)
        response.delete_cookie(auth.COOKIE, path="/")
        return response

    return router


def _safe_next(target: str) -> str:
    """Only a path on this service (never ``//host`` or a URL) may follow the login."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
