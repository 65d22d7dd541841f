"""What the controller keeps in memory about each running attempt, and how an attempt ends.

An ``Attempt`` is the one in-memory attempt type: its workers that have not exited, what it was
told and what it saw. How it is to end is claimed as it happens (``claim``: a suspend's
preemption, a timeout, a user's terminate) and, once no worker is left, turned into one value,
an ``Ending`` (``Attempt.ending``), from which ``lifecycle.after_ending`` decides the job's next
status. ``AttemptTable`` holds the running attempts by job and which attempt each worker
belongs to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dyntrain.service.core.executor import WorkerExit
from dyntrain.service.core.lifecycle import Ending, EndKind
from dyntrain.service.core.model import WorkerState
from dyntrain.service.core.records import Job, WorkerRecord

if TYPE_CHECKING:  # torch: imported only once an elastic job runs
    from dyntrain.service.engine.elastic_host import ElasticHost


@dataclass(frozen=True)
class CoordinatorEnd:
    """How an elastic attempt's coordinator ended: its training done, or failed (and why)."""

    done: bool
    failed: bool = False
    failure: str | None = None


@dataclass
class Attempt:
    """A job's running attempt: its workers that have not exited, and how it is to end."""

    job_id: str
    number: int
    started_at: float
    job: Job | None = None  # the job as it was when the attempt started (its status follows)
    host: ElasticHost | None = None  # an elastic job's coordinator
    workers: dict[str, WorkerRecord] = field(default_factory=dict)  # not exited, by start
    workers_started: int = 0
    stop_reason: str | None = None  # why every worker was told to leave (the first reason)
    claims: dict[EndKind, Ending] = field(default_factory=dict)  # see ``claim``
    last_exit: WorkerExit | None = None
    main_exit: WorkerExit | None = None  # a multi-node job's node 0: its exit decides
    first_error: str | None = None  # the first failing worker's error line, from its log
    wasted: dict[str, float] = field(default_factory=dict)  # worker -> seconds thrown away
    priced_events: int = 0  # membership events already looked at for crash waste
    running_seen: bool = False  # an elastic job's first generation was reported running
    shrunk: int = 0  # workers told to leave by a shrink: preemptions, as a user counts them
    failed_untrained: int = 0  # an elastic job's workers failed before its first generation
    master_port: int | None = None  # a torchrun job's gang: where its rank 0 listens

    def running(self) -> list[WorkerRecord]:
        """Workers not told to leave, oldest first."""
        return [w for w in self.workers.values() if w.state == WorkerState.RUNNING]

    @property
    def terminated(self) -> str | None:
        """The reason a user terminated it (None: not terminated)."""
        found = self.claims.get(EndKind.TERMINATED)
        return None if found is None else found.reason

    def claim(self, ending: Ending) -> None:
        """Record what will decide how it ends, whatever its workers' exit codes say: a
        preemption (``Ending(EndKind.PREEMPTED)``), a timeout, a terminate. The strongest
        claim wins (``EndKind``'s order); a later claim of the same kind replaces the first."""
        self.claims[ending.kind] = ending

    def stop(self, reason: str) -> None:
        """It is stopping: every worker is told to leave; the first reason given is kept."""
        self.stop_reason = self.stop_reason or reason

    def leaving(self, w: WorkerRecord, reason: str, now: float) -> None:
        """``w`` was told to leave at ``now``."""
        self.workers[w.id] = dataclasses.replace(w, state=WorkerState.LEAVING, leave_reason=reason,
                                                 leave_at=now)

    def ending(self, coordinator: CoordinatorEnd | None = None) -> Ending:
        """How it ended, once no worker is left: the strongest claim, else its workers' exit.

        The deciding exit is a multi-node job's main node's, else the last one; the reason is
        why its workers were stopped, else that exit's (a main node's exit names its own). An
        elastic job (``coordinator``) succeeded when its coordinator says its training is
        done, whatever the workers' codes (a worker lost on the way then asks no retry), and
        failed otherwise.
        """
        exit_ = self.main_exit or self.last_exit
        code = exit_.exit_code if exit_ else None
        reason = self.stop_reason or (exit_.reason if exit_ else "")
        if self.main_exit is not None:
            reason = self.main_exit.reason or ""
        claims = dict(self.claims)
        if coordinator is not None:
            if coordinator.done:
                claims.pop(EndKind.PREEMPTED, None)
            if EndKind.TERMINATED not in claims:  # a terminated job's code is its workers' own
                code = 0 if coordinator.done else (code if code not in (0, None) else 1)
            if coordinator.failed:
                reason = coordinator.failure or reason
        kind = max(claims, key=list(EndKind).index, default=EndKind.EXITED)
        if kind is EndKind.TERMINATED:
            return dataclasses.replace(claims[kind], exit_code=code)
        timeout = claims[kind].timeout_seconds if kind is EndKind.TIMED_OUT else None
        return Ending(kind, code, reason, timeout, self.first_error)


class AttemptTable:
    """The running attempts by job, and the attempt each of their workers belongs to."""

    def __init__(self) -> None:
        self._by_job: dict[str, Attempt] = {}
        self._owner: dict[str, str] = {}  # worker -> the job whose attempt it belongs to

    def __getitem__(self, job_id: str) -> Attempt:
        return self._by_job[job_id]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._by_job

    def __len__(self) -> int:
        return len(self._by_job)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_job)

    def get(self, job_id: str) -> Attempt | None:
        return self._by_job.get(job_id)

    def values(self) -> list[Attempt]:
        """The running attempts, a copy (callers may end some while they go through it)."""
        return list(self._by_job.values())

    def add(self, attempt: Attempt) -> None:
        """Track ``attempt`` and the workers it has now."""
        self._by_job[attempt.job_id] = attempt
        for wid in attempt.workers:
            self._owner[wid] = attempt.job_id

    def remove(self, job_id: str) -> None:
        del self._by_job[job_id]

    def own(self, worker_id: str, job_id: str) -> None:
        """``worker_id`` belongs to ``job_id``'s attempt (a worker added later)."""
        self._owner[worker_id] = job_id

    def disown(self, worker_id: str) -> None:
        self._owner.pop(worker_id, None)

    def of_worker(self, worker_id: str) -> Attempt | None:
        """The attempt ``worker_id`` belongs to, if it runs."""
        return self._by_job.get(self._owner.get(worker_id, ""))


def terminating(reason: str) -> str:
    """The status reason of a job whose workers were told to stop by a terminate."""
    return f"terminating ({reason}): its workers were told to stop"


def worker_id(job_id: str, attempt: int, index: int) -> str:
    return f"{job_id.replace(':', '_')}-a{attempt}-w{index}"


def worker_index(wid: str) -> int:
    """The start order of a worker in its attempt (a multi-node job's node index)."""
    return int(wid.rsplit("-w", 1)[1])
