"""Jobs: submit, cancel and terminate them; find them, why they wait, their workers, attempts,
cost and run folder."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from dyntrain.elastic.runs.storage import RunStore
from dyntrain.service.core.cost import JobCost, UsageRow, job_cost
from dyntrain.service.core.model import (
    MAX_ARRAY_SIZE,
    CapacityType,
    Dependency,
    JobStatus,
    Resources,
    RetryStrategy,
)
from dyntrain.service.core.plan import WaitInfo
from dyntrain.service.core.records import AttemptRecord, Job, WorkerRecord
from dyntrain.service.engine.jobindex import wait_info
from dyntrain.service.engine.service import Service
from dyntrain.service.operations.errors import JobFinished, JobNotCancellable, found

DEFAULT_ON_DEMAND_PRICE = 1.0  # the cost baseline's price when no ON_DEMAND environment exists


class Jobs:
    def __init__(self, service: Service) -> None:
        self._service = service

    # ---- commands ----------------------------------------------------------------------------

    def submit(self, *, queue: str, definition: str | None = None,
               command: Sequence[str] | None = None, name: str | None = None,
               parameters: dict[str, Any] | None = None,
               environment: dict[str, str] | None = None, resources: Resources | None = None,
               array_size: int | None = None, depends_on: Iterable[Dependency] = (),
               workers: tuple[int, int] | None = None, retry_attempts: int | None = None,
               timeout_seconds: float | None = None, job_id: str | None = None,
               workdir: str | None = None, exported_environment: dict[str, str] | None = None,
               retry_strategy: RetryStrategy | None = None, num_nodes: int | None = None,
               tags: dict[str, str] | None = None, aws: dict[str, Any] | None = None,
               client_token: str | None = None, launcher: str | None = None,
               share: str | None = None, scheduling_priority: int | None = None) -> Job:
        """Create a job (and an array job's children) as SUBMITTED, checked against the
        executor's kernel levels; the arguments are ``Store.jobs.submit``'s.

        Without the lock: it is one transaction, and the controller finds new jobs after its
        watermark whenever they commit, so a 10,000-child array being written holds up no other
        request."""
        return self._service.store.jobs.submit(
            queue=queue, definition=definition, command=command, name=name,
            parameters=parameters, environment=environment, resources=resources,
            array_size=array_size, depends_on=depends_on, workers=workers,
            retry_attempts=retry_attempts, timeout_seconds=timeout_seconds, job_id=job_id,
            workdir=workdir, exported_environment=exported_environment,
            retry_strategy=retry_strategy, num_nodes=num_nodes, tags=tags, aws=aws,
            client_token=client_token, launcher=launcher, share=share,
            scheduling_priority=scheduling_priority,
            kernel_levels=self._service.executor.kernel_levels())

    def cancel(self, job_id: str, reason: str | None = None) -> Job:
        """Cancel a job that has not started (an array job: its children that have not);
        refused (``JobNotCancellable``, ``JobFinished``) once it started or finished."""
        store = self._service.store
        with self._service.lock:  # the controller cannot start it between the check and cancel
            controller = self._service.controller  # a replica's changes with its term
            job = found(store.jobs.get_job, job_id)
            if job.status.is_active():
                raise JobNotCancellable(job_id, job.status,
                                        f"job {job_id} is {job.status.value}; use terminate")
            if job.status.is_terminal():
                raise JobFinished(job_id, job.status)
            done = (controller.cancel(job_id) if reason is None
                    else controller.cancel(job_id, reason))
            job = found(store.jobs.get_job, job_id)
            if not done:
                raise JobNotCancellable(job_id, job.status,
                                        f"job {job_id} is {job.status.value} and cannot be "
                                        "cancelled; use terminate")
            return job

    def terminate(self, job_id: str, reason: str | None = None) -> Job:
        """Stop a job whatever its state; it ends FAILED and is not retried (its running
        workers end in the background). Refused (``JobFinished``) once it finished."""
        store = self._service.store
        with self._service.lock:
            controller = self._service.controller  # a replica's changes with its term
            job = found(store.jobs.get_job, job_id)
            if job.status.is_terminal():
                raise JobFinished(job_id, job.status)
            if reason is None:
                controller.terminate(job_id)
            else:
                controller.terminate(job_id, reason)
            return found(store.jobs.get_job, job_id)

    # ---- queries -----------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        return found(self._service.store.jobs.get_job, job_id)

    def list(self, queue: str | None = None,
             status: JobStatus | str | Iterable[JobStatus | str] | None = None,
             parent: str | None = None, *, top_level: bool = False, limit: int = 100,
             offset: int = 0, name: str | None = None, definition: str | None = None,
             created_after: float | None = None, created_before: float | None = None,
             newest_first: bool = False) -> list[Job]:
        """Jobs by creation time (``newest_first``: the other way); ``top_level`` hides array
        children, ``parent`` lists one array's."""
        return self._service.store.jobs.list_jobs(
            queue, status, parent, top_level=top_level, limit=limit, offset=offset, name=name,
            definition=definition, created_after=created_after, created_before=created_before,
            newest_first=newest_first)

    def search(self, *, queue: str | None = None,
               status: Iterable[JobStatus | str] | None = None, text: str | None = None,
               parent: str | None = None, limit: int = 100, offset: int = 0
               ) -> tuple[list[Job], int]:
        """One page of the jobs that match, newest first, and how many match in all."""
        return self._service.store.summaries.search_jobs(queue=queue, status=status, text=text,
                                               parent=parent, limit=limit, offset=offset)

    def ids_starting_with(self, prefix: str, limit: int = 10) -> list[str]:
        return self._service.store.jobs.job_ids_starting_with(prefix, limit=limit)

    def counts(self) -> dict[tuple[str, JobStatus], int]:
        """Top-level jobs by (queue, status)."""
        return self._service.store.summaries.count_jobs_by_queue_and_status()

    def child_counts(self, parent_ids: Sequence[str]) -> dict[str, Counter]:
        """Array parent id -> its children by status."""
        return self._service.store.scheduling.child_status_counts(parent_ids)

    def child_statuses(self, parent_id: str) -> list[JobStatus]:
        return self._service.store.jobs.child_statuses(parent_id)

    def wait_reasons(self) -> Callable[[Job], WaitInfo | None]:
        """Why a job waits, as of the controller's last pass (None when it does not). Read
        without the lock: the pass's mapping is replaced, never changed."""
        return partial(wait_info, self._service.controller.waiting)

    def workers(self, job_id: str | None = None, active: bool = True) -> list[WorkerRecord]:
        """A job's workers (None: every job's); ``active``: only those not yet exited."""
        return self._service.store.workers.list_workers(job_id, active=active)

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        return self._service.store.jobs.list_attempts(job_id)

    def exported_environment(self, job: Job) -> dict[str, str]:
        return self._service.store.jobs.exported_environment(job)

    def run_folder(self, job: Job) -> RunStore:
        """Where the job's training files are (metrics, checkpoints)."""
        return self._service.controller.run_store(job)

    def cost(self, job: Job) -> JobCost:
        """The job's cost and its static on-demand baseline.

        The baseline runs ``max workers`` slots (1 for a plain job; times the array size for
        an array job, whose children's usage is summed) at the highest price among ON_DEMAND
        environments, or at 1.0 per slot-hour when there is none. The wall time runs from the
        job's start to its stop (or to now while it runs).
        """
        store = self._service.store
        ids = [job.id]
        if job.is_array_parent:
            ids += [c.id for c in store.jobs.list_jobs(parent=job.id, limit=MAX_ARRAY_SIZE)]
        rows = [UsageRow(u.compute_environment, u.capacity_type, u.worker_seconds,
                         u.price_per_slot_hour, u.wasted)
                for jid in ids for u in store.workers.job_usage(jid)]
        max_workers = (job.max_workers or 1) * (job.array_size if job.is_array_parent else 1)
        now = store.clock()
        wall = 0.0 if job.started_at is None else max(
            0.0, (job.stopped_at or now) - job.started_at)
        prices = [
            ce.spec.price_per_slot_hour
            for ce in store.environments.list_compute_environments()
            if ce.spec.capacity_type is CapacityType.ON_DEMAND
        ]
        price = max(prices) if prices else DEFAULT_ON_DEMAND_PRICE
        return job_cost(rows, max_workers=max_workers, wall_seconds=wall,
                        on_demand_price_per_slot_hour=price)
