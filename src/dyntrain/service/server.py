"""The service as ``dyntrain server`` serves it: one web application on one port.

The front ends (``api``, ``aws``, ``web``) import only downward and never each other, and each
calls the service by its operations (``dyntrain.service.operations``); this module, above all
three, builds the operations of a ``Service`` once and puts the front ends together over them:
``create_app`` is the REST API with the dashboard mounted on it (the dashboard's session cookie
counting as the API's token, the lab's reports on its lab page), ``create_server_app`` puts the
AWS wire protocols in front of that. The service itself is built by
``dyntrain.service.assembly``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp

from dyntrain.errors import DyntrainError
from dyntrain.service.api.app import create_api
from dyntrain.service.aws.app import with_aws
from dyntrain.service.engine.service import Service
from dyntrain.service.operations import Operations
from dyntrain.service.web import auth as web_auth
from dyntrain.service.web.lab import LabReport
from dyntrain.service.web.mount import mount_dashboard


def lab_report(root: Path) -> dict[str, Any]:
    """The lab's report of the sweep folder ``root`` as JSON (``{"error": ...}`` when it has
    none yet): the dashboard's lab page. The lab is imported only now: it sits above the
    service."""
    from dyntrain.lab.analysis import analyse
    from dyntrain.lab.render import to_json
    from dyntrain.lab.results import read_studies

    try:
        return to_json(analyse(read_studies(root)))
    except DyntrainError as e:
        return {"error": str(e).splitlines()[0], "workloads": []}


def create_app(service: Service, lab_report: LabReport = lab_report) -> FastAPI:
    """The REST API over ``service`` with the dashboard and ``/metrics`` mounted on it.

    Args:
        service: what it serves.
        lab_report: what reports a lab sweep's folder on the dashboard's lab page.
    """
    return _native_app(Operations(service), lab_report)


def _native_app(ops: Operations, lab_report: LabReport) -> FastAPI:
    app = create_api(ops, session=web_auth)
    mount_dashboard(app, ops, lab_report)
    return app


def create_server_app(service: Service, aws_keys: dict[str, str] | None = None) -> ASGIApp:
    """Everything ``dyntrain server`` answers on its port: AWS Batch's and CloudWatch Logs'
    wire protocols (``with_aws``) in front of ``create_app``.

    Args:
        service: what it serves.
        aws_keys: access key id -> secret key that AWS requests may be signed with.
    """
    ops = Operations(service)
    return with_aws(_native_app(ops, lab_report), ops, aws_keys)
