"""Executors: where the worker processes of jobs run (``local`` now; cluster engines later)."""

from dyntrain.service.core.executor import (
    Executor,
    ExecutorError,
    StartError,
    WorkerExit,
    WorkerHandle,
    WorkerSpec,
    get_executor,
    known_executors,
)

__all__ = [
    "Executor",
    "ExecutorError",
    "StartError",
    "WorkerExit",
    "WorkerHandle",
    "WorkerSpec",
    "get_executor",
    "known_executors",
]
