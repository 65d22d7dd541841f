"""Mounting the dashboard on the service's app: routes, static files, /metrics, and the
capacity sampler that feeds the overview's capacity chart."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dyntrain.service.operations import Operations
from dyntrain.service.web import context
from dyntrain.service.web.auth import STATIC_PREFIX
from dyntrain.service.web.capacity import CapacityHistory, Sample
from dyntrain.service.web.lab import LabReport, no_report
from dyntrain.service.web.metrics import service_registry
from dyntrain.service.web.pages import build_router
from dyntrain.service.web.render import make_environment

STATIC_DIR = Path(__file__).resolve().parent / "static"
log = logging.getLogger("dyntrain.service.web")


def capacity_sampler(ops: Operations, history: CapacityHistory,
                     every: float = 1.0) -> Callable[[float], None]:
    """A controller pass observer recording each environment's slots at most every ``every``
    seconds (it runs in the controller's thread, between two steps)."""
    last = -math.inf

    def observe(_seconds: float) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < every:
            return
        last = now
        try:
            at = ops.clock()
            envs = context.environments(ops)
            for v in envs:
                history.record(v["name"], Sample(at, v["available_slots"], v["slots_in_use"],
                                                 v["desired_slots"], v["max_slots"]))
            history.forget_except({v["name"] for v in envs})
        except Exception:  # a dashboard sample must never break a scheduling step
            log.exception("capacity sample failed")

    return observe


def mount_dashboard(app: FastAPI, ops: Operations, lab_report: LabReport = no_report) -> None:
    """Add the dashboard's pages, its static files and ``/metrics`` to ``app``.

    Args:
        app: the application the dashboard shares (the REST API's, whose auth middleware
            covers its pages).
        ops: what the pages show; a pass observer samples the capacity.
        lab_report: what reports a lab sweep's folder (the lab page).
    """
    history = CapacityHistory()
    ops.observe_passes(capacity_sampler(ops, history))
    registry = service_registry(ops)
    app.include_router(build_router(ops, make_environment(), history, lab_report))
    app.mount(STATIC_PREFIX.rstrip("/"), StaticFiles(directory=STATIC_DIR), name="dashboard")

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
