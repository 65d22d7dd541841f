"""What every route needs: the running Service."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from dyntrain.service.engine.service import Service


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]
