"""The REST API of the job service: ``create_api(ops)`` returns the FastAPI application.

JSON in and out; OpenAPI at ``/openapi.json``, interactive docs at ``/docs``. Every error answer
is ``{"detail": "<one line>"}`` with the status chosen in ``dyntrain.service.api.errors``:
400 invalid request, 401 missing or wrong token, 404 the resource in the path does not exist,
409 a conflict with the current state, 422 a body or query that does not match the schema.

Auth: when the service has a token (``ops.token``), every request needs ``Authorization: Bearer
<token>`` (compared in constant time), except ``/health`` and the API description (``/docs``,
``/redoc``, ``/openapi.json``), which reveal nothing about the service's state. A
``BrowserSession`` handed to ``create_api`` (the dashboard's session cookie) counts as the token
too, and keeps its own pages open.

The web dashboard (``/``, ``/ui/...``) and ``/metrics`` are another front end
(``dyntrain.service.web``), mounted on this app by ``dyntrain.service.server.create_app``,
outside the OpenAPI document.

The routes translate JSON to the service's operations (``dyntrain.service.operations``) and
their records back, and nothing more: each operation owns its transaction and its locking.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Protocol

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from dyntrain.errors import DyntrainError
from dyntrain.service.api import compute, definitions, jobs, policies, queues
from dyntrain.service.api.errors import describe_request_errors, errors, one_line, status_for
from dyntrain.service.operations import Operations

log = logging.getLogger("dyntrain.service.api")

OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})

# Documents the scheme in OpenAPI (the "Authorize" button of /docs); BearerAuth enforces it.
_bearer = HTTPBearer(auto_error=False, description="the service's token (--token)")


class BrowserSession(Protocol):
    """Another way for a browser to hold the token (the dashboard's session cookie: the module
    ``dyntrain.service.web.auth`` is one): the paths it keeps open (its login page), whether a
    request's cookie grants the token, and where a browser that asked for a page without
    credentials is sent instead of a 401."""

    def is_open(self, path: str) -> bool: ...

    def cookie_grants(self, scope: Scope, token: str) -> bool: ...

    def login_redirect(self, scope: Scope) -> str | None: ...


class BearerAuth:
    """ASGI middleware: refuse (401) any request but OPEN_PATHS without the right bearer token.

    A middleware rather than a dependency, so a request without the token learns nothing, not
    even whether its body would have been valid. A ``session`` (the dashboard's) may hold the
    token instead, and a page it serves asked for without either redirects to its login page.
    """

    def __init__(self, app: ASGIApp, token: str, session: BrowserSession | None = None) -> None:
        self.app = app
        self.token = token.encode()
        self.session = session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = self.session
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or (
                session is not None and session.is_open(scope["path"])):
            await self.app(scope, receive, send)
            return
        header = b""
        for key, value in scope.get("headers", ()):
            if key == b"authorization":
                header = value
                break
        scheme, _, credentials = header.partition(b" ")
        if (scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.token)
                or session is not None and session.cookie_grants(scope, self.token.decode())):
            await self.app(scope, receive, send)
            return
        login = session.login_redirect(scope) if session is not None else None
        if login is not None:
            await RedirectResponse(login, status_code=303)(scope, receive, send)
            return
        detail = ("wrong token: the service refused 'Authorization: Bearer ...'" if header
                  else "this service needs a token: send 'Authorization: Bearer <token>' "
                       "(dyntrain: --token or DYNTRAIN_TOKEN)")
        response = JSONResponse({"detail": detail}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


def _allowed_methods(app: FastAPI, scope: Scope) -> str:
    """Every method some route serves at this request's path (HEAD goes without saying)."""
    methods: set[str] = set()
    for route in app.routes:
        if route.matches(scope)[0] is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods - {"HEAD"}))


def create_api(ops: Operations, session: BrowserSession | None = None) -> FastAPI:
    """The REST API over the service's operations.

    Args:
        ops: what the routes read and change.
        session: what else holds the token for a browser (see ``BearerAuth``); None: only the
            bearer token does.
    """
    app = FastAPI(
        title="dyntrain job service",
        version="1",
        summary="Elastic training jobs on capacity that comes and goes, in AWS Batch's "
                "vocabulary: compute environments, job queues, job definitions and jobs.",
    )
    app.state.operations = ops
    if ops.token:
        app.add_middleware(BearerAuth, token=ops.token, session=session)

    @app.exception_handler(DyntrainError)
    async def _dyntrain_error(_: Request, exc: DyntrainError) -> JSONResponse:
        return JSONResponse({"detail": one_line(exc)}, status_code=status_for(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": describe_request_errors(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:  # Starlette names only the first matching route's methods
            headers = {**(headers or {}), "Allow": _allowed_methods(app, request.scope)}
        return JSONResponse({"detail": one_line(exc.detail)}, status_code=exc.status_code,
                            headers=headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"detail": one_line(f"internal error: {type(exc).__name__}: {exc}")},
                            status_code=500)

    @app.get("/health", tags=["service"], summary="Liveness (needs no token)")
    def health() -> dict[str, Any]:
        """``leader``: whether this service runs the controller; ``epoch``: the controller's
        lease (several replicas, ``docs/replicas.md``), null for a single service."""
        leader, epoch = ops.leader()
        return {"status": "ok", "leader": leader, "epoch": epoch}

    secured = [Depends(_bearer)]
    for module in (compute, queues, policies, definitions, jobs):
        app.include_router(module.router, dependencies=secured, responses=errors(401))
    return app
