"""The REST API of the job service (FastAPI): ``create_app(service)``.

Imported lazily, so that ``dyntrain.service.api.schemas`` (the request bodies, which the CLI reads
to check a YAML file's fields) does not import FastAPI.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from dyntrain.service.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
