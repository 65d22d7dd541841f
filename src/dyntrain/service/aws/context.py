"""What every AWS operation handler gets: the service's operations, the ARNs of the caller's
region, and the request's client token."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dyntrain.service.aws.shapes import Arns
from dyntrain.service.operations import Operations


@dataclass(frozen=True)
class Context:
    ops: Operations
    arns: Arns
    client_token: str | None = None  # the SDK's amz-sdk-invocation-id: the same on retries


Handler = Callable[[Context, dict[str, Any]], dict[str, Any]]
