"""What every route needs: the service's operations."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from dyntrain.service.operations import Operations


def get_operations(request: Request) -> Operations:
    return request.app.state.operations


OperationsDep = Annotated[Operations, Depends(get_operations)]
