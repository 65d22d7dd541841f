"""The coordinator's vocabulary: its phases, where it reports, what it records of the job."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from dyntrain.elastic.admission import NumericsRecord


class Phase(enum.Enum):
    """The coordinator's state."""

    WAITING = "waiting"  # no generation runs: starting, or fewer than min workers
    RUNNING = "running"
    REFORMING = "reforming"  # the current generation ends; waiting for every member to report
    DONE = "done"
    FAILED = "failed"

    def is_terminal(self) -> bool:
        return self in (Phase.DONE, Phase.FAILED)


class Sink(Protocol):
    """Where the coordinator reports what happens (files, terminal, a service's database)."""

    def event(self, record: dict) -> None: ...
    def metrics(self, record: dict) -> None: ...
    def log(self, line: str) -> None: ...
    def result(self, record: dict) -> None: ...
    def numerics(self, record: NumericsRecord) -> None: ...


@dataclass
class JobRecord:
    """What the coordinator learned about the job itself from its workers."""

    fingerprint: str | None = None  # the first hello's: every other worker must match it
    config: dict = field(default_factory=dict)  # the numbers behind the fingerprint
    highest_step: int = 0  # the most advanced step any metrics row reported
    last_checkpoint: tuple[int, str] | None = None  # (step, where) of the newest one written
    last_error: str | None = None  # "<worker>: <exception>" of the last error reported
    errors: dict[str, str] = field(default_factory=dict)  # worker -> the exception it reported
    failure: str | None = None  # why the job failed
    # what the job computes with, and its proof (``dyntrain.elastic.admission``): from the run
    # folder when resumed, else from the first worker that runs the job's pinned numerics
    numerics: NumericsRecord | None = None

    def stepped(self, row: dict, now: float) -> None:
        """Take a metrics row of the current generation: mark it ``recomputed`` when its step
        was reported before (the step was redone after a failure), and give it a ``time``."""
        row["recomputed"] = row["step"] <= self.highest_step
        self.highest_step = max(self.highest_step, row["step"])
        row["time"] = row.get("time", now)
