"""How errors become HTTP answers: every error body is ``{"detail": "<one line>"}``.

The rule, in one place:

* 404: the resource named in the URL path does not exist: the operation raised ``Unknown``
  (``dyntrain.service.operations.errors``). An unknown name *inside a request body* (a queue to
  submit to, a dependency) is a bad request (400), not a 404.
* 409: the request is valid but clashes with the current state: the operation ``Refused`` it (a
  resource still in use, cancelling a job that already runs), or the store's messages of that
  kind, recognised by their shape (``_CONFLICTS``: a name that already exists, a racing write).
* any other ``ValidationError`` / ``DyntrainError`` (400): the request is invalid.
* a request that does not match the schema (422): pydantic's first error as
  ``"body.slot.cpus: Input should be greater than 0"`` (plus a count of the others).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from dyntrain.errors import DyntrainError
from dyntrain.service.core.jobtext import one_line
from dyntrain.service.core.model import ValidationError
from dyntrain.service.operations.errors import Refused, Unknown

_CONFLICTS = re.compile(
    r"^(compute environment|job queue|job id) '[^']*' already exists$"
    r"|^conflicting write, nothing was changed: "
    r"|^compute environment '[^']*' is used by job queue\(s\) "
    r"|^job queue '[^']*' still has \d+ unfinished job\(s\)")


class ErrorBody(BaseModel):
    """Every error answer of the API: one line that says what is wrong and why."""

    detail: str


_MEANINGS = {
    400: "Valid by the schema but refused by a rule between fields or about the resources it "
         "names (min <= max, a CSV's rows, an unknown queue, a slot too small)",
    401: "Missing or wrong token (when the service has one)",
    404: "The resource in the path does not exist",
    409: "Clashes with the current state (already exists, still in use, already running or "
         "finished)",
    422: "Does not match the schema: the first error as 'body.field: why'",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error codes, each with the one error body shape."""
    return {code: {"model": ErrorBody, "description": _MEANINGS[code]} for code in codes}


def status_for(exc: DyntrainError) -> int:
    if isinstance(exc, Unknown):
        return 404
    if isinstance(exc, Refused) or isinstance(exc, ValidationError) and _CONFLICTS.match(str(exc)):
        return 409
    return 400


def _loc(loc: Sequence[Any]) -> str:
    parts = []
    for p in loc:
        if isinstance(p, int) and parts:
            parts[-1] += f"[{p}]"
        else:
            parts.append(str(p))
    return ".".join(parts)


def describe_request_errors(errors: Sequence[dict]) -> str:
    """pydantic's error list as one line: the first error and how many more there are."""
    if not errors:
        return "invalid request"
    first = errors[0]
    loc = _loc(first.get("loc", ()))
    msg = first.get("msg", "invalid value")
    if first.get("type") == "json_invalid":
        msg = f"invalid JSON ({first.get('ctx', {}).get('error', 'cannot parse')})"
    text = f"{loc}: {msg}" if loc else str(msg)
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return one_line(text)
