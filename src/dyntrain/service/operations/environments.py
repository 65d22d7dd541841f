"""Compute environments (with their capacity traces) and job queues: commands and queries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dyntrain.service.core.capacity import parse_trace
from dyntrain.service.core.fit import slot_refusal
from dyntrain.service.core.model import (
    ComputeEnvironmentSpec,
    JobQueueSpec,
    JobStatus,
    Resources,
    State,
    ValidationError,
)
from dyntrain.service.core.plan import WaitInfo
from dyntrain.service.core.records import ComputeEnvironment, Job, JobQueue
from dyntrain.service.engine.jobindex import wait_info
from dyntrain.service.engine.service import Service
from dyntrain.service.operations.errors import EnvironmentInUse, PolicyChange, QueueExists, found


class Environments:
    """Compute environments: pools of worker slots, and the capacity traces replayed on them."""

    def __init__(self, service: Service) -> None:
        self._service = service

    def local_machine(self) -> Resources | None:
        """The machine every slot is carved from, when the executor is the local one."""
        executor = self._service.executor
        return executor.capacity() if executor.name == "local" else None

    def create(self, spec: ComputeEnvironmentSpec, tags: dict[str, str] | None = None,
               aws: dict[str, Any] | None = None) -> ComputeEnvironment:
        """Refused (``ValidationError``) when its slot does not fit the local machine."""
        machine = self.local_machine()
        refusal = slot_refusal(spec, machine) if machine is not None else None
        if refusal:
            raise ValidationError(refusal)
        with self._service.lock:
            return self._service.store.environments.create_compute_environment(spec, tags=tags,
                                                                               aws=aws)

    def get(self, name: str) -> ComputeEnvironment:
        return found(self._service.store.environments.get_compute_environment, name)

    def list(self) -> list[ComputeEnvironment]:
        return self._service.store.environments.list_compute_environments()

    def update(self, name: str, *, state: State | str | None = None,
               min_slots: int | None = None, desired_slots: int | None = None,
               max_slots: int | None = None, price_per_slot_hour: float | None = None
               ) -> ComputeEnvironment:
        """Change the given fields (the result is checked as a whole spec)."""
        changes = {k: v for k, v in (("state", state), ("min_slots", min_slots),
                                     ("desired_slots", desired_slots), ("max_slots", max_slots),
                                     ("price_per_slot_hour", price_per_slot_hour))
                   if v is not None}
        return self.revise(name, lambda _: changes)

    def revise(self, name: str, changes: Callable[[ComputeEnvironment], dict[str, Any]]
               ) -> ComputeEnvironment:
        """Apply what ``changes`` makes of the environment as it is now (read and written in
        one step, so no other change lands in between)."""
        store = self._service.store
        with self._service.lock:
            return store.environments.update_compute_environment(
                name, **changes(found(store.environments.get_compute_environment, name)))

    def delete(self, name: str) -> None:
        """Refused (``EnvironmentInUse``) while a worker is active in it."""
        store = self._service.store
        with self._service.lock:  # no worker starts in it between the check and the delete
            found(store.environments.get_compute_environment, name)
            busy = sum(1 for w in store.workers.list_workers(active=True)
                       if w.compute_environment == name)
            if busy:
                raise EnvironmentInUse(name, busy)
            store.environments.delete_compute_environment(name)

    def set_trace(self, name: str, csv: str, loop: bool = False) -> ComputeEnvironment:
        """Replay ``csv`` (offset_s,slots rows) as the slots ``name`` offers, from now."""
        parse_trace(csv, source=f"{name} trace", loop=loop)
        store = self._service.store
        with self._service.lock:
            found(store.environments.get_compute_environment, name)
            store.environments.set_capacity_trace(name, csv, started_at=store.clock(), loop=loop)
            return found(store.environments.get_compute_environment, name)

    def clear_trace(self, name: str) -> ComputeEnvironment:
        store = self._service.store
        with self._service.lock:
            found(store.environments.get_compute_environment, name)
            store.environments.clear_capacity_trace(name)
            return found(store.environments.get_compute_environment, name)

    def capacity(self) -> Capacity:
        """What the environments offer now: the controller's slots (traces applied), the active
        workers in each, the traces replayed."""
        store = self._service.store
        with self._service.lock:  # the controller's view, between two steps
            available = self._service.controller.available_slots(store.clock())
        in_use = Counter(w.compute_environment for w in store.workers.list_workers(active=True))
        return Capacity(available, in_use, store.environments.capacity_traces(),
                        self.local_machine())


@dataclass(frozen=True)
class Capacity:
    """The slots environments offer now (by name), those active workers hold, the traces
    replayed (csv, started_at, loop), and the one machine all slots share (the local
    executor's; None otherwise)."""

    available: dict[str, int]
    in_use: Counter
    traces: dict[str, tuple[str, float, bool]]
    machine: Resources | None


@dataclass(frozen=True)
class QueueSnapshot:
    """A queue's front (its RUNNABLE jobs, each with why it waits, in the order they would
    start), the slots each share holds (share -> slots; ``""``: jobs without one) and when."""

    queue: JobQueue
    front: list[tuple[Job, WaitInfo | None]]
    held: dict[str, int]
    at: float


class Queues:
    """Job queues: a priority over an ordered list of compute environments."""

    def __init__(self, service: Service) -> None:
        self._service = service

    def create(self, spec: JobQueueSpec, tags: dict[str, str] | None = None,
               aws: dict[str, Any] | None = None) -> JobQueue:
        """Refused (``QueueExists``) when one of that name exists."""
        store = self._service.store
        with self._service.lock:
            if any(q.name == spec.name for q in store.environments.list_job_queues()):
                raise QueueExists(spec.name)
            return store.environments.create_job_queue(spec, tags=tags, aws=aws)

    def get(self, name: str) -> JobQueue:
        return found(self._service.store.environments.get_job_queue, name)

    def list(self) -> list[JobQueue]:
        """Highest priority first."""
        return self._service.store.environments.list_job_queues()

    def update(self, name: str, *, priority: int | None = None,
               state: State | str | None = None,
               compute_environments: Sequence[str] | None = None,
               aws: dict[str, Any] | None = None,
               scheduling_policy: str | None = None,
               preempt_plain_jobs: bool | None = None) -> JobQueue:
        """Change the given fields; ``aws`` is merged into the AWS fields kept with it. A
        queue's fair-share policy may be replaced, not added to a first in, first out queue
        (``PolicyChange``), as on AWS Batch."""
        store = self._service.store
        with self._service.lock:
            queue = found(store.environments.get_job_queue, name)
            if scheduling_policy is not None and queue.spec.scheduling_policy is None:
                raise PolicyChange(f"job queue {name} is first in, first out: a fair share "
                                   "scheduling policy can only be given when it is created")
            return store.environments.update_job_queue(
                name, priority=priority, state=state, compute_environments=compute_environments,
                aws=None if aws is None else {**queue.aws, **aws},
                scheduling_policy=scheduling_policy, preempt_plain_jobs=preempt_plain_jobs)

    def snapshot(self, name: str, most: int = 100) -> QueueSnapshot:
        """The front of a queue: its RUNNABLE jobs in the order the scheduler's last pass
        would start them (``most`` at most), and the slots each share holds now."""
        store = self._service.store
        queue = found(store.environments.get_job_queue, name)
        waiting = self._service.controller.waiting
        runnable = store.jobs.list_jobs(name, JobStatus.RUNNABLE, limit=10 * most)
        infos = [(job, wait_info(waiting, job)) for job in runnable]
        infos.sort(key=lambda ji: (ji[1].position if ji[1] else 1 << 30, ji[0].created_at))
        return QueueSnapshot(queue, infos[:most], self.shares(name), store.clock())

    def shares(self, name: str) -> dict[str, int]:
        """The slots the active workers of queue ``name``'s jobs hold, by share (``""``: jobs
        without one)."""
        store = self._service.store
        held: Counter = Counter()
        workers = store.workers.list_workers(active=True)
        jobs = store.scheduling.get_jobs(sorted({w.job_id for w in workers}))
        for w in workers:
            job = jobs.get(w.job_id)
            if job is not None and job.queue == name:
                held[job.share or ""] += 1
        return dict(held)

    def delete(self, name: str) -> None:
        store = self._service.store
        with self._service.lock:
            found(store.environments.get_job_queue, name)
            store.environments.delete_job_queue(name)
