"""What a controller is told: where its run folders go, its timings and its bounds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dyntrain.elastic.protocol import FAILURE_TIMEOUT
from dyntrain.service.core.allocation import FIFO, AllocationPolicy


@dataclass
class ControllerConfig:
    """A controller's settings; its collaborators read them when they act, so a change made
    between two steps applies from the next one.

    Args:
        state_dir: the root of the jobs' run folders (``jobs/<id>`` under it).
        grace_seconds: SIGTERM -> SIGKILL for workers told to leave.
        tick_seconds: the loop's wait between two steps (a worker's exit ends it early).
        schedule_every: passes when nothing changed (capacity traces move with time).
        failure_timeout: the heartbeat timeout of elastic workers.
        reattach_seconds: how long elastic workers train on without their coordinator, waiting
            for a restarted service to re-attach them; 0: they stop, and the job resumes from
            its newest checkpoint.
        new_jobs_per_step: new jobs read in one step; with ``resolve_per_step`` (waiting jobs
            resolved) and ``starts_per_step`` (jobs started), what bounds a step's work, so
            that an API request never waits long.
        policy: how running elastic jobs share slots (``core/allocation.py``; default:
            by priority, then first in, first out).
        replicated: one of several service replicas runs it (``engine/leadership.py``): the
            terminations that the other replicas hand over are taken from the store.
    """

    state_dir: Path
    grace_seconds: float = 120.0
    tick_seconds: float = 0.05
    schedule_every: float = 0.2
    failure_timeout: float = FAILURE_TIMEOUT
    reattach_seconds: float = 300.0
    new_jobs_per_step: int = 2000
    resolve_per_step: int = 1000
    starts_per_step: int = 64
    policy: AllocationPolicy = FIFO
    replicated: bool = False
