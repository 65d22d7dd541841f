"""How records become columns and back: what a job row may change, a retry strategy as JSON,
the launcher column."""

from __future__ import annotations

import dataclasses

from dyntrain.service.core.model import (
    ElasticSettings,
    Launcher,
    RetryAction,
    RetryRule,
    RetryStrategy,
)
from dyntrain.service.core.records import WorkerRecord

WORKER_FIELDS = [f.name for f in dataclasses.fields(WorkerRecord)]

# Columns update_job may change; everything else about a job is fixed at submit.
MUTABLE_JOB_FIELDS = frozenset({
    "status", "status_reason", "attempts", "preemptions", "started_at", "stopped_at",
    "exit_code", "current_workers", "min_workers", "max_workers", "progress", "result",
})


def retry_to_json(r: RetryStrategy) -> dict:
    return {"attempts": r.attempts,
            "evaluate_on_exit": [{"action": rule.action.value, "on_exit_code": rule.on_exit_code,
                                  "on_reason": rule.on_reason} for rule in r.evaluate_on_exit]}


def retry_from_json(d: dict) -> RetryStrategy:
    return RetryStrategy(d["attempts"], tuple(
        RetryRule(RetryAction(x["action"]), x.get("on_exit_code"), x.get("on_reason"))
        for x in d.get("evaluate_on_exit", ())))


def launcher_column(elastic: ElasticSettings | None) -> str | None:
    """What the ``launcher`` column holds: None for dyntrain's own (and for a plain job)."""
    if elastic is None or elastic.launcher is Launcher.DYNTRAIN:
        return None
    return elastic.launcher.value

