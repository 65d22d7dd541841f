"""The REST API of the job service (FastAPI): ``create_api(service)``.

Imported lazily, so that ``dyntrain.service.api.schemas`` (the request bodies, which the CLI reads
to check a YAML file's fields) does not import FastAPI. ``create_app``, this package's name for
the whole application before the front ends were separated, is kept: it is
``dyntrain.service.server.create_app`` (the API with the dashboard mounted).
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_api", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_api":
        from dyntrain.service.api.app import create_api

        return create_api
    if name == "create_app":  # the old import path (see the module docstring)
        from dyntrain.service.server import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
