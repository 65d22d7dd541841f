"""The REST API of the job service (FastAPI): ``create_app(service)``."""

from dyntrain.service.api.app import create_app

__all__ = ["create_app"]
