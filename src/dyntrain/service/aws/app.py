"""The AWS front end on the service's port: ``with_aws(native_app, ops)``.

An ASGI router in front of the native API. It takes AWS Batch requests (rest-json:
``/v1/<operation>``, and ``/v1/tags/<arn>``) and CloudWatch Logs requests (json 1.1: ``POST /``
with ``X-Amz-Target: Logs_20140328.<Operation>``) and passes everything else to the native
application unchanged, so neither front end's error shape, auth or OpenAPI document leaks into
the other (a ``GET /`` is the native side's).

Each AWS request is checked by ``sigv4.Verifier``, routed by botocore's own service models (the
operation's URI, or the target header), validated against the operation's input shape
(``validate``) and answered by a handler; every error is in AWS's shape
(``errors``): ``ClientException``/``InvalidParameterException`` (400) for a bad request,
``ServerException``/``ServiceUnavailableException`` (500) for a bug, never FastAPI's.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from typing import Any
from urllib.parse import parse_qs

from botocore.session import get_session
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from dyntrain.errors import DyntrainError
from dyntrain.service.aws import batch_jobs, batch_policies, batch_resources, logs, validate
from dyntrain.service.aws.context import Context, Handler
from dyntrain.service.aws.errors import AwsError, client_error, invalid_parameter
from dyntrain.service.aws.shapes import DEFAULT_REGION, Arns, unknown_operation
from dyntrain.service.aws.sigv4 import Verifier, parse_authorization
from dyntrain.service.engine.service import is_loopback
from dyntrain.service.operations import Operations

log = logging.getLogger("dyntrain.service.aws")

LOGS_TARGET = "Logs_20140328."
BATCH_PREFIX = "/v1/"
TAGS_PREFIX = "/v1/tags/"
BATCH = {**batch_resources.OPERATIONS, **batch_jobs.OPERATIONS, **batch_policies.OPERATIONS}


@functools.cache
def _model(service: str):
    return get_session().get_service_model(service)


@functools.cache
def _batch_paths() -> dict[tuple[str, str], str]:
    """(method, path) -> operation, from the Batch model's request URIs."""
    model = _model("batch")
    return {(op.http["method"], op.http["requestUri"]): name
            for name in model.operation_names
            for op in [model.operation_model(name)] if name in BATCH}


def is_aws_request(scope: Scope) -> bool:
    if scope["type"] != "http":
        return False
    if scope["path"].startswith(BATCH_PREFIX):
        return True
    return (scope["method"] == "POST" and scope["path"] == "/"
            and any(k == b"x-amz-target" for k, _ in scope.get("headers", ())))


class AwsRouter:
    """ASGI: AWS requests to the AWS handlers, all others to ``native``."""

    def __init__(self, native: ASGIApp, ops: Operations, verifier: Verifier) -> None:
        self.native, self.ops, self.verifier = native, ops, verifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_aws_request(scope):
            await self.native(scope, receive, send)
            return
        request_id = str(uuid.uuid4())
        headers = _headers(scope)
        is_logs = "x-amz-target" in headers
        media = "application/x-amz-json-1.1" if is_logs else "application/json"
        bad_request = invalid_parameter if is_logs else client_error
        try:
            body = await _body(receive)
            client = scope.get("client")
            self.verifier.check(
                loopback=bool(client) and is_loopback(client[0]), method=scope["method"],
                raw_path=(scope.get("raw_path") or scope["path"].encode()).decode("latin-1"),
                query=scope.get("query_string", b"").decode("latin-1"), headers=headers,
                body=body)
            name, handler, params = (_logs_call(headers, body) if is_logs
                                     else _batch_call(scope, body))
            if name == "CreateComputeEnvironment":
                batch_resources.check_compute_environment(params)
            validate.check(_model("logs" if is_logs else "batch").operation_model(name)
                           .input_shape, params, bad_request)
            auth = parse_authorization(headers.get("authorization"))
            ctx = Context(self.ops, Arns(auth.region if auth else DEFAULT_REGION),
                          headers.get("amz-sdk-invocation-id") if name == "SubmitJob" else None)
            result = await run_in_threadpool(handler, ctx, params)
            response = JSONResponse(result, media_type=media,
                                    headers={"x-amzn-RequestId": request_id})
        except AwsError as e:
            response = e.response(media, request_id)
        except DyntrainError as e:  # the store's and the specs' one-line ValidationErrors
            response = bad_request(str(e)).response(media, request_id)
        except Exception as e:
            log.exception("%s %s failed", scope["method"], scope["path"])
            error = AwsError("ServiceUnavailableException" if is_logs else "ServerException",
                             f"internal error: {type(e).__name__}: {e}", 500)
            response = error.response(media, request_id)
        await response(scope, receive, send)


def with_aws(native: ASGIApp, ops: Operations, keys: dict[str, str] | None = None) -> AwsRouter:
    """The native application with the AWS endpoints in front; ``keys`` (access key id ->
    secret, see ``sigv4.load_credentials``) are required of every AWS request when given."""
    return AwsRouter(native, ops, Verifier(keys))


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in scope.get("headers", ()):
        name, value = k.decode("latin-1").lower(), v.decode("latin-1")
        out[name] = f"{out[name]},{value}" if name in out else value
    return out


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _json(body: bytes, bad_request) -> dict[str, Any]:
    try:
        params = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not JSON: {e}") from None
    if not isinstance(params, dict):
        raise bad_request("the body must be a JSON object")
    return params


def _batch_call(scope: Scope, body: bytes) -> tuple[str, Handler, dict[str, Any]]:
    path, method = scope["path"], scope["method"]
    params: dict[str, Any] = {}
    if path.startswith(TAGS_PREFIX):
        name = _batch_paths().get((method, "/v1/tags/{resourceArn}"))
        params["resourceArn"] = path[len(TAGS_PREFIX):]
        if method == "DELETE":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            params["tagKeys"] = query.get("tagKeys", [])
    else:
        name = _batch_paths().get((method, path.rstrip("/").lower()))
    if name is None:
        raise unknown_operation(f"{method} {path}")
    if method == "POST":
        params.update(_json(body, client_error))
    return name, BATCH[name], params


def _logs_call(headers: dict[str, str], body: bytes) -> tuple[str, Handler, dict[str, Any]]:
    target = headers["x-amz-target"]
    name = target[len(LOGS_TARGET):] if target.startswith(LOGS_TARGET) else None
    if name not in logs.OPERATIONS:
        raise unknown_operation(target)
    return name, logs.OPERATIONS[name], _json(body, invalid_parameter)
