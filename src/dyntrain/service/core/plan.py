"""What one scheduling pass reads and what it returns, as frozen values.

In: a ``Snapshot`` of the compute environments (``EnvView``), the job queues (``QueueView``) and
the jobs that wait for capacity or hold some (``JobView``). Out: a ``Plan`` of decisions
(``Start``, ``Grow``, ``Shrink``, ``Suspend``) and, for every queued job that does not start,
why it waits (``WaitInfo``; ``WaitingJobs`` keeps the jobs behind a blocked head as one slice of
their sorted queue and builds their entries when read). The policy that maps one to the other
is ``scheduler.schedule``.
"""

from __future__ import annotations

import bisect
from collections.abc import ItemsView, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import TYPE_CHECKING

from dyntrain.service.core.fairshare import FairsharePolicy
from dyntrain.service.core.model import (
    CapacityType,
    JobStatus,
    Resources,
    State,
    ValidationError,
    never_fits,
)

if TYPE_CHECKING:
    from dyntrain.service.core.speedup import JobProfile

_ACTIVE = (JobStatus.STARTING, JobStatus.RUNNING)
FIFO = attrgetter("created", "id")  # a queue's order: first in, first out; ties by id


@dataclass(frozen=True, slots=True)
class EnvView:
    """A compute environment as observed now."""

    name: str
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    price_per_slot_hour: float = 0.0
    slot: Resources = field(default_factory=Resources)
    available_slots: int = 0  # slots that exist right now (spot: what the provider grants)
    state: State = State.ENABLED

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity_type", CapacityType(self.capacity_type))
        object.__setattr__(self, "state", State(self.state))
        if self.available_slots < 0:
            raise ValidationError(f"compute environment {self.name}: available_slots must be "
                                  f">= 0, got {self.available_slots}")


@dataclass(frozen=True, slots=True)
class QueueView:
    """A job queue: a priority (higher runs first) over an ordered list of environments."""

    name: str
    priority: int = 1
    compute_environments: tuple[str, ...] = ()
    state: State = State.ENABLED
    fairshare: FairsharePolicy | None = None  # None: first in, first out
    preempt_plain_jobs: bool = False  # a share-aware policy may preempt its plain jobs

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute_environments", tuple(self.compute_environments))
        object.__setattr__(self, "state", State(self.state))


@dataclass(frozen=True, slots=True)
class JobView:
    """A job waiting for capacity (RUNNABLE) or holding some (STARTING, RUNNING)."""

    id: str
    queue: str
    created: float  # submission order: earlier goes first; ties go by id
    resources: Resources = field(default_factory=Resources)  # per worker
    min_workers: int = 1
    max_workers: int = 1
    status: JobStatus = JobStatus.RUNNABLE
    placement: Mapping[str, int] = field(default_factory=dict)  # env -> workers, when active
    preemptible: bool = True  # may be shrunk (never below min) for a higher-priority job
    profile: JobProfile | None = None  # its measured speed-up, for an allocation policy
    share: str | None = None  # its share identifier, in a fair-share queue
    scheduling_priority: int = 0  # orders the jobs of one share (higher first)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", JobStatus(self.status))
        if self.status is not JobStatus.RUNNABLE and self.status not in _ACTIVE:
            raise ValidationError(f"job {self.id}: the scheduler sees RUNNABLE, STARTING or "
                                  f"RUNNING jobs, got {self.status.value}")
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValidationError(f"job {self.id}: workers must satisfy 1 <= min <= max, got "
                                  f"{self.min_workers}:{self.max_workers}")
        if any(n < 0 for n in self.placement.values()):
            raise ValidationError(f"job {self.id}: negative worker count in {self.placement}")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling pass looks at.

    RUNNABLE jobs come in ``jobs``, or already sorted in ``queued`` (queue -> its RUNNABLE jobs
    in first in, first out order by ``(created, id)``), which is how a caller that keeps its
    queues sorted spares the pass from partitioning and sorting the whole queue. ``held``:
    RUNNABLE jobs whose placement the executor refused, with why (``core/placement.py``): they
    wait, whatever the slots say. ``share_usage``: each share's slots averaged over its
    fair-share window (``core/fairshare.ShareUsage``).
    """

    envs: tuple[EnvView, ...] = ()
    queues: tuple[QueueView, ...] = ()
    jobs: tuple[JobView, ...] = ()
    queued: Mapping[str, Sequence[JobView]] = field(default_factory=dict)
    held: Mapping[str, str] = field(default_factory=dict)
    share_usage: Mapping[str, float] = field(default_factory=dict)  # share -> decayed slots

    def __post_init__(self) -> None:
        object.__setattr__(self, "envs", tuple(self.envs))
        object.__setattr__(self, "queues", tuple(self.queues))
        object.__setattr__(self, "jobs", tuple(self.jobs))
        for kind, items in (("compute environment", self.envs), ("job queue", self.queues)):
            names = [item.name for item in items]
            if len(set(names)) != len(names):
                raise ValidationError(f"snapshot: a {kind} name appears twice in {names}")


@dataclass(frozen=True, slots=True)
class Start:
    """Start a queued job with these workers (environment -> count)."""

    job: str
    placement: Mapping[str, int]

    @property
    def workers(self) -> int:
        return sum(self.placement.values())


@dataclass(frozen=True, slots=True)
class Grow:
    """Add ``count`` workers on ``env`` to a running job (they join at its next step boundary)."""

    job: str
    env: str
    count: int


@dataclass(frozen=True, slots=True)
class Shrink:
    """Send ``count`` of a job's workers on ``env`` a graceful preemption notice."""

    job: str
    env: str
    count: int
    reason: str


@dataclass(frozen=True, slots=True)
class Suspend:
    """Checkpoint a running job and queue it again: it would fall below its min workers."""

    job: str
    reason: str


@dataclass(frozen=True, slots=True)
class WaitInfo:
    """Why a queued job did not start, and its 1-based place among its queue's waiting jobs."""

    reason: str
    position: int


@dataclass(frozen=True, slots=True)
class Plan:
    """The decisions of one pass; ``waiting`` has an entry for every queued job not started."""

    starts: tuple[Start, ...] = ()
    grows: tuple[Grow, ...] = ()
    shrinks: tuple[Shrink, ...] = ()
    suspends: tuple[Suspend, ...] = ()
    waiting: Mapping[str, WaitInfo] = field(default_factory=dict)


class SlotFit:
    """Whether a worker of some size fits a slot of any of a queue's environments."""

    def __init__(self, queue: QueueView, envs: Mapping[str, EnvView]) -> None:
        self.queue = queue.name
        self.slots = [(name, envs[name].slot) for name in queue.compute_environments
                      if name in envs]

    def never_reason(self, resources: Resources) -> str:
        """Why a job of this size can never run in the queue, or '' when some slot fits it."""
        return never_fits(self.queue, resources, self.slots)


@dataclass(frozen=True, slots=True)
class WaitingTail:
    """Queued jobs ``jobs[start:]`` that all wait for one reason (unless they can never fit)."""

    jobs: Sequence[JobView]
    start: int
    first_position: int
    reason: str
    fit: SlotFit | None

    def info(self, index: int) -> WaitInfo:
        job = self.jobs[index]
        never = self.fit.never_reason(job.resources) if self.fit is not None else ""
        return WaitInfo(never or self.reason, self.first_position + index - self.start)


class WaitingJobs(Mapping[str, WaitInfo]):
    """Job id -> ``WaitInfo``: single entries, plus queue tails whose entries are built on read."""

    def __init__(self, single: dict[str, WaitInfo], tails: Sequence[WaitingTail]) -> None:
        self._single = single
        self._tails = tuple(tails)
        self._where: dict[str, tuple[WaitingTail, int]] | None = None

    def __getitem__(self, job_id: str) -> WaitInfo:
        info = self._single.get(job_id)
        if info is not None:
            return info
        if self._where is None:  # built once, on the first lookup of a tail entry
            self._where = {tail.jobs[i].id: (tail, i) for tail in self._tails
                           for i in range(tail.start, len(tail.jobs))}
        tail, index = self._where[job_id]
        return tail.info(index)

    def of(self, job_id: str, created: float) -> WaitInfo | None:
        """``get(job_id)`` for a job whose ``JobView.created`` is ``created``: a binary search
        of each tail instead of the id map, which a request would build for every new plan
        (10 ms of a loaded machine with 10,000 queued, under the GIL the controller needs)."""
        info = self._single.get(job_id)
        if info is not None:
            return info
        key = (created, job_id)
        for tail in self._tails:
            i = bisect.bisect_left(tail.jobs, key, lo=tail.start, key=FIFO)
            if i < len(tail.jobs) and tail.jobs[i].id == job_id:
                return tail.info(i)
        return None

    def __iter__(self) -> Iterator[str]:
        yield from self._single
        for tail in self._tails:
            for job in islice(tail.jobs, tail.start, None):
                yield job.id

    def items(self) -> ItemsView[str, WaitInfo]:
        return _WaitingItems(self)

    def __len__(self) -> int:
        return len(self._single) + sum(len(t.jobs) - t.start for t in self._tails)

    def __repr__(self) -> str:
        return f"WaitingJobs({len(self)} jobs)"


class _WaitingItems(ItemsView[str, WaitInfo]):
    """``WaitingJobs.items()`` that walks the tails instead of looking each id up."""

    _mapping: WaitingJobs

    def __iter__(self) -> Iterator[tuple[str, WaitInfo]]:
        yield from self._mapping._single.items()
        for tail in self._mapping._tails:
            for i in range(tail.start, len(tail.jobs)):
                yield tail.jobs[i].id, tail.info(i)
