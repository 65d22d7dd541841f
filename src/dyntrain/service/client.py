"""A thin client of the job service's REST API (one method per route).

``Client()`` talks to ``$DYNTRAIN_URL`` (default ``http://127.0.0.1:8642``) with the token in
``$DYNTRAIN_TOKEN`` (if any). A comma-separated list of URLs names several replicas of one
service (``docs/replicas.md``): a request goes to the next one when one does not answer, and
the one that answered is asked first from then on. Methods return the decoded JSON. Every
failure raises ``ApiError`` with a one-line message: the server's ``detail`` (and ``status``,
the HTTP status code), or, when there is no answer, ``ServiceUnreachable`` (``status`` None):
"cannot reach the dyntrain service at URL (...)", with how to start one or point at another.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from dyntrain.errors import DyntrainError, Unreachable
from dyntrain.service.core.model import DEFAULT_PORT, TERMINAL_STATUSES

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
TERMINAL = frozenset(TERMINAL_STATUSES)


class ApiError(DyntrainError):
    """The service refused a request (``status`` is its HTTP code) or could not be reached.

    Args:
        message: The service's one-line reason.
        status: The HTTP status code (None when there was no answer).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def status_code(self) -> int | None:
        """The HTTP status code (as ``status``)."""
        return self.status


class ServiceUnreachable(ApiError, Unreachable):
    """No answer from the service at all (refused, unknown host, timed out)."""


def unreachable_hint() -> str:
    return ("start one with `dyntrain server`, or point at another with --url URL or "
            "DYNTRAIN_URL=URL")


def service_urls(value: str) -> list[str]:
    """The URLs of ``URL[,URL...]``, in order, without trailing slashes."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    return list(dict.fromkeys(urls)) or [DEFAULT_URL]


def _no_answer(error: httpx.TransportError, method: str) -> bool:
    """Whether the next URL may be asked after ``error``: nothing reached the service (no
    connection), or the request changes nothing (a GET); a POST that may have landed is not
    sent twice."""
    return method == "GET" or isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))


def _seg(value: Any) -> str:
    """One URL path segment (job ids of array children hold ':')."""
    return quote(str(value), safe="")


def _jsonable(value: Any) -> Any:
    """Dataclasses (Resources, Dependency), enums and tuples as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, str):
        text = response.text.strip().splitlines()
        detail = text[0] if text else f"HTTP {response.status_code} {response.reason_phrase}"
    return " ".join(str(detail).split()) or f"HTTP {response.status_code}"


class Client:
    """The REST API of ``dyntrain server`` from Python: one method per route.

    Each method returns the JSON the service answers (dicts and lists); a refusal raises
    ``ApiError`` with the service's one-line reason and HTTP status, no answer at all raises
    ``ServiceUnreachable``. Use it as a context manager, or call ``close()``.

    Args:
        base_url: The service's URL, or several replicas' URLs separated by commas; default
            ``DYNTRAIN_URL``, else ``http://127.0.0.1:8642``.
        token: The bearer token of a service started with ``--token``; default
            ``DYNTRAIN_TOKEN``.
        timeout: Seconds to wait for each answer.
    """

    def __init__(self, base_url: str | None = None, token: str | None = None,
                 timeout: float = 10) -> None:
        self.urls = service_urls(base_url or os.environ.get("DYNTRAIN_URL") or DEFAULT_URL)
        self.base_url = self.urls[0]  # the one asked first: the last that answered
        token = token if token is not None else os.environ.get("DYNTRAIN_TOKEN") or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the HTTP connection pool (also done on leaving a ``with`` block)."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, json: Any = None,
                params: Mapping[str, Any] | None = None, timeout: float | None = None) -> Any:
        """One request to the service; returns its JSON body (None when empty).

        Args:
            method: ``GET``, ``POST``, ``PATCH``, ``PUT`` or ``DELETE``.
            path: The route, e.g. ``/jobs``.
            json: The request body (dataclasses and enums become plain JSON values).
            params: Query parameters; None values are left out.
            timeout: Seconds to wait for this answer (None: the client's timeout).

        Raises:
            ApiError: The service answered with a 4xx/5xx (its one-line ``detail``, ``status``).
            ServiceUnreachable: No answer at all (refused, unknown host, timed out).
        """
        params = {k: v for k, v in (params or {}).items() if v is not None}
        order = [self.base_url, *(u for u in self.urls if u != self.base_url)]
        for i, url in enumerate(order):
            try:
                response = self._http.request(
                    method, url + path, json=_jsonable(json) if json is not None else None,
                    params=params or None,
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)
            except httpx.TransportError as e:
                if i + 1 < len(order) and _no_answer(e, method.upper()):
                    continue  # the next replica
                where = url if i == 0 else f"{url} (nor at {', '.join(order[:i])})"
                if isinstance(e, httpx.TimeoutException):
                    raise ServiceUnreachable(f"the dyntrain service at {where} did not answer "
                                             f"in time: {e or type(e).__name__}") from None
                raise ServiceUnreachable(f"cannot reach the dyntrain service at {where} "
                                         f"({e or type(e).__name__}): {unreachable_hint()}") \
                    from None
            self.base_url = url
            break
        if response.status_code >= 400:
            raise ApiError(_detail(response), response.status_code)
        return response.json() if response.content else None

    # ---- service -----------------------------------------------------------------------------

    def health(self) -> dict:
        """The service's ``/health`` answer."""
        return self.request("GET", "/health")

    # ---- compute environments ----------------------------------------------------------------

    def create_compute_environment(self, **fields: Any) -> dict:
        """Create a compute environment.

        Args:
            **fields: The body of ``POST /compute-environments``: ``name``, ``type`` (``on_demand``,
                ``reserved``, ``spot``), ``price``, ``min_slots``/``desired_slots``/``max_slots``,
                ``slot`` (cpus, gpus, memory_mib), ...
        """
        return self.request("POST", "/compute-environments", json=fields)

    def list_compute_environments(self) -> list[dict]:
        """Every compute environment."""
        return self.request("GET", "/compute-environments")

    def get_compute_environment(self, name: str) -> dict:
        """One compute environment.

        Args:
            name: Its name.
        """
        return self.request("GET", f"/compute-environments/{_seg(name)}")

    def update_compute_environment(self, name: str, **fields: Any) -> dict:
        """Change state, min/desired/max slots or price at run time.

        Args:
            name: The environment's name.
            **fields: The fields to change, as in ``PATCH /compute-environments/NAME``.
        """
        return self.request("PATCH", f"/compute-environments/{_seg(name)}", json=fields)

    def delete_compute_environment(self, name: str) -> dict:
        """Delete a compute environment (no queue may use it).

        Args:
            name: Its name.
        """
        return self.request("DELETE", f"/compute-environments/{_seg(name)}")

    def set_capacity_trace(self, name: str, csv: str, loop: bool = False) -> dict:
        """Replay ``csv`` (offset_s,slots[,price]) as the environment's slots from now.

        Args:
            name: The environment's name.
            csv: The trace: one ``offset_s,slots[,price]`` row per change.
            loop: Start the trace again when it ends.
        """
        return self.request("PUT", f"/compute-environments/{_seg(name)}/trace",
                            json={"csv": csv, "loop": loop})

    def clear_capacity_trace(self, name: str) -> dict:
        """Stop replaying the environment's trace.

        Args:
            name: The environment's name.
        """
        return self.request("DELETE", f"/compute-environments/{_seg(name)}/trace")

    # ---- job queues --------------------------------------------------------------------------

    def create_job_queue(self, **fields: Any) -> dict:
        """Create a job queue.

        Args:
            **fields: The body of ``POST /job-queues``: ``name``, ``priority``,
                ``compute_environments`` (in spill-over order), ...
        """
        return self.request("POST", "/job-queues", json=fields)

    def list_job_queues(self) -> list[dict]:
        """Every job queue."""
        return self.request("GET", "/job-queues")

    def get_job_queue(self, name: str) -> dict:
        """One job queue.

        Args:
            name: Its name.
        """
        return self.request("GET", f"/job-queues/{_seg(name)}")

    def update_job_queue(self, name: str, **fields: Any) -> dict:
        """Change a queue's priority, state or environments.

        Args:
            name: The queue's name.
            **fields: The fields to change, as in ``PATCH /job-queues/NAME``.
        """
        return self.request("PATCH", f"/job-queues/{_seg(name)}", json=fields)

    def delete_job_queue(self, name: str) -> dict:
        """Delete a job queue.

        Args:
            name: Its name.
        """
        return self.request("DELETE", f"/job-queues/{_seg(name)}")

    # ---- job definitions ---------------------------------------------------------------------

    def register_job_definition(self, **fields: Any) -> dict:
        """Register a job definition (a new revision when the name exists).

        Args:
            **fields: The body of ``POST /job-definitions``: ``name``, ``command``, ``parameters``,
                ``retry_strategy``, ``timeout_s``, ``workers``, ...

        Returns:
            ``{"name", "revision", "ref"}``.
        """
        return self.request("POST", "/job-definitions", json=fields)

    def list_job_definitions(self, name: str | None = None,
                             include_inactive: bool = False) -> list[dict]:
        """Job definitions, by name and revision.

        Args:
            name: Only this definition's revisions.
            include_inactive: Also deregistered revisions.
        """
        return self.request("GET", "/job-definitions",
                            params={"name": name, "include_inactive": include_inactive})

    def get_job_definition(self, name: str, revision: int | None = None) -> dict:
        """One job definition.

        Args:
            name: Its name.
            revision: A revision (None: the newest active one).
        """
        return self.request("GET", f"/job-definitions/{_seg(name)}",
                            params={"revision": revision})

    def deregister_job_definition(self, name: str, revision: int) -> dict:
        """Deregister one revision of a job definition.

        Args:
            name: Its name.
            revision: The revision.
        """
        return self.request("DELETE", f"/job-definitions/{_seg(name)}/{_seg(revision)}")

    # ---- jobs --------------------------------------------------------------------------------

    def submit(self, **fields: Any) -> dict:
        """Submit a job; returns it as the service stored it.

        Args:
            **fields: Fields as in ``POST /jobs`` (``queue``, ``command``, ``workers``,
                ``array_size``, ``retry_attempts``, ``environment``, ``resources``, ``depends_on``,
                ...). Shorthands: ``depends_on`` may list plain job ids, and ``workers`` may be a
                ``(min, max)`` pair.

        Raises:
            ApiError: The job was refused (400: bad input, or a job that can never run).
        """
        deps = fields.get("depends_on")
        if deps is not None:
            fields["depends_on"] = [{"job_id": d} if isinstance(d, str) else d for d in deps]
        workers = fields.get("workers")
        if isinstance(workers, (list, tuple)):
            fields["workers"] = {"min": workers[0], "max": workers[1]}
        return self.request("POST", "/jobs", json=fields)

    def list_jobs(self, **filters: Any) -> list[dict]:
        """Jobs, newest first: top-level jobs only unless ``parent`` names an array job.

        Args:
            **filters: ``queue``, ``status`` (one, a comma-separated string or a list), ``parent``,
                ``limit``, ``offset``.
        """
        status = filters.get("status")
        if isinstance(status, (list, tuple, set, frozenset)):
            filters["status"] = ",".join(str(_jsonable(s)) for s in status)
        elif status is not None:
            filters["status"] = _jsonable(status)
        return self.request("GET", "/jobs", params=filters)

    def get_job(self, job_id: str, timeout: float | None = None) -> dict:
        """One job: status, reason, attempts, workers, progress, result.

        Args:
            job_id: Its id, or ``ARRAY:N`` for an array's child.
            timeout: Seconds to wait for the answer (None: the client's timeout).
        """
        return self.request("GET", f"/jobs/{_seg(job_id)}", timeout=timeout)

    def cancel(self, job_id: str) -> dict:
        """Cancel a job that has not started: it ends FAILED with the reason.

        Args:
            job_id: Its id.

        Raises:
            ApiError: 409 when the job has started (use ``terminate``) or already finished.
        """
        return self.request("POST", f"/jobs/{_seg(job_id)}/cancel")

    def terminate(self, job_id: str) -> dict:
        """Terminate a job: every worker is told to stop; it ends FAILED and is not retried.

        Args:
            job_id: Its id.
        """
        return self.request("POST", f"/jobs/{_seg(job_id)}/terminate")

    def logs(self, job_id: str, after_seq: int = 0, limit: int | None = None) -> dict:
        """A page of the job's log lines after ``after_seq``.

        Args:
            job_id: Its id.
            after_seq: The last sequence number already read (0: from the start).
            limit: Most lines to return.

        Returns:
            ``{"lines": [{seq, attempt, worker, line, at}], "last_seq", "status", "done"}``.
        """
        return self.request("GET", f"/jobs/{_seg(job_id)}/logs",
                            params={"after_seq": after_seq, "limit": limit})

    def follow_logs(self, job_id: str, poll: float = 0.5, after_seq: int = 0) -> Iterator[dict]:
        """Yield log lines as they come, until the job is terminal and no line is left.

        Args:
            job_id: Its id.
            poll: Seconds between requests while nothing is new.
            after_seq: Start after this sequence number.

        Yields:
            Dicts as in ``logs``; the text is ``["line"]``.
        """
        while True:
            page = self.logs(job_id, after_seq)
            yield from page["lines"]
            after_seq = page["last_seq"]
            if not page["lines"]:
                if page["done"]:
                    return
                time.sleep(poll)

    def events(self, job_id: str, after_id: int = 0, limit: int | None = None) -> list[dict]:
        """The job's events (membership changes, status changes) after ``after_id``.

        Args:
            job_id: Its id.
            after_id: The last event id already read.
            limit: Most events to return.
        """
        return self.request("GET", f"/jobs/{_seg(job_id)}/events",
                            params={"after_id": after_id, "limit": limit})["events"]

    def cost(self, job_id: str) -> dict:
        """The job's cost by environment and capacity type, against a static on-demand baseline.

        Args:
            job_id: Its id.
        """
        return self.request("GET", f"/jobs/{_seg(job_id)}/cost")

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 0.5) -> dict:
        """Poll until the job is SUCCEEDED or FAILED; returns it.

        Args:
            job_id: Its id.
            timeout: Seconds to wait at most (None: no limit).
            poll: Seconds between requests.

        Raises:
            ApiError: The job is still not finished after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise ApiError(f"job {job_id} is still {job['status']} after {timeout:g}s")
            time.sleep(poll)
