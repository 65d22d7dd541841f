"""How the controller starts workers: claimed first, sent together, recorded once answered."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Mapping, Sequence

from dyntrain.elastic.protocol import (
    ENV_COORDINATOR,
    ENV_OUT,
    ENV_REATTACH,
    ENV_SECRET,
    ENV_WORKER_ID,
)
from dyntrain.service.core.executor import (
    Executor,
    ExecutorError,
    StartError,
    WorkerHandle,
    WorkerSpec,
)
from dyntrain.service.core.lifecycle import Ending, EndKind
from dyntrain.service.core.model import JobStatus, WorkerState
from dyntrain.service.core.placement import Refusal, refusal, with_released
from dyntrain.service.core.plan import Start
from dyntrain.service.core.records import ComputeEnvironment, Job, WorkerRecord
from dyntrain.service.core.submitter import job_numerics, pinned_kernels
from dyntrain.service.core.torchrun import restart_count, worker_env
from dyntrain.service.engine.attempts import Attempt, AttemptTable, worker_id, worker_index
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.jobindex import JobIndex, job_view
from dyntrain.service.engine.logtail import LogPump
from dyntrain.service.engine.runfolders import ElasticHosts, RunFolders
from dyntrain.service.engine.stopping import Stopper
from dyntrain.service.store import Store

MAIN_NODE_ADDRESS = "127.0.0.1"  # every worker of the local executor runs on this host

CANNOT_START = "CannotStartContainerError"
MAX_PARENT_EXPORTS = 64  # array parents whose exported environment is kept in memory

Answers = dict[str, WorkerHandle | ExecutorError]  # worker id -> its start's handle or error
Launched = dict[str, tuple[dict[str, WorkerHandle], ExecutorError | None]]


class Launcher:
    """Starts attempts (``start``) and grows running ones (``grow``).

    A pass's starts are claimed in one transaction before any worker starts (a compare-and-set
    RUNNABLE -> STARTING with the attempt and worker records), then sent to the executor
    together without waiting for the children to exec; ``record_launches`` stores the handles
    once the executor has them. A service that dies in between finds those workers again by
    their ids.

    Args:
        store: the claims, worker records and handles.
        executor: what starts the workers.
        index: told which jobs started (and which someone else moved first).
        attempts: where a started attempt is tracked.
        logs: follows each started worker's log.
        folders: the jobs' run folders (log paths, ``DYNTRAIN_OUT``).
        hosts: builds an elastic job's coordinator host.
        stopper: stops an attempt whose start failed.
        clock: the time of a start (epoch seconds).
        config: its ``reattach_seconds``, which elastic workers are told (how long they wait
            for a restarted service).
    """

    def __init__(self, *, store: Store, executor: Executor, index: JobIndex,
                 attempts: AttemptTable, logs: LogPump, folders: RunFolders,
                 hosts: ElasticHosts, stopper: Stopper, clock: Callable[[], float],
                 config: ControllerConfig) -> None:
        self.store, self.executor, self.index, self.attempts = store, executor, index, attempts
        self.logs, self.folders, self.hosts, self.stopper = logs, folders, hosts, stopper
        self.clock, self.config = clock, config
        self._launching: dict[str, Attempt] = {}  # job -> attempt whose starts were sent
        self._answers: Answers = {}  # answered starts not recorded yet
        self._parent_exports: dict[str, dict[str, str]] = {}  # array parent -> its exports
        #: job -> the executor's refusal of its last placement (core/placement.py): the
        #: controller holds the job back until the executor has more room
        self.refusals: dict[str, Refusal] = {}

    def launching_workers(self) -> set[str]:
        """Workers whose attempt's starts are not all answered yet (their exits wait)."""
        return {wid for a in self._launching.values() for wid in a.workers}

    def start(self, starts: Sequence[Start], envs: Mapping[str, ComputeEnvironment]) -> None:
        """Claim a pass's starts in one transaction, send their workers' starts, and record
        the handles of those already answered (the rest at the next step's start). ``envs``:
        the compute environments the pass placed them in, by name."""
        jobs = self.store.scheduling.get_jobs([s.job for s in starts])
        numbers = self.store.scheduling.last_attempt_numbers(list(jobs))
        claims, attempts = [], {}
        now = self.clock()
        for start in starts:
            job = jobs.get(start.job)
            if job is None or start.job in self.attempts:
                self.index.forget(start.job)
                continue
            attempt = Attempt(job.id, numbers.get(job.id, 0) + 1, now, job=job)
            self.refusals.pop(job.id, None)
            try:
                records = self._plan_workers(attempt, dict(start.placement), envs, now)
            except ExecutorError:
                continue  # its environment is gone: the next pass places it elsewhere
            attempts[job.id] = attempt
            claims.append((job.id, attempt.number, records))
        claimed = self.store.scheduling.claim_starts(claims, now)
        for job_id in set(attempts) - set(claimed):
            self.index.forget(job_id)  # someone else moved it first
        started = []
        for job_id in claimed:
            attempt = attempts[job_id]
            attempt.job = job = dataclasses.replace(attempt.job, status=JobStatus.STARTING)
            self.attempts.add(attempt)
            self.index.moved(job_id, job.array_parent_id, JobStatus.RUNNABLE, JobStatus.STARTING)
            if job.torchrun:  # a fresh port per gang: the last one's may linger in TIME_WAIT
                attempt.master_port = free_port(MAIN_NODE_ADDRESS)
            elif job.elastic is not None:
                attempt.host = self.hosts.host(job, attempt.number, len(attempt.workers))
            started.append(attempt)
        specs = self._specs(started)
        for attempt in started:
            self._launching[attempt.job_id] = attempt
        self.executor.send_starts(specs)
        self.record_launches()

    def record_launches(self) -> None:
        """Record the handles of the attempts whose every start was answered, in one
        transaction; a failed start ends its attempt. A service that dies before this finds
        those workers again by their ids (``Recovery``)."""
        self._answers.update(self.executor.started())
        ready = [a for a in self._launching.values()
                 if all(wid in self._answers for wid, w in a.workers.items() if w.handle is None)]
        if not ready:
            return
        for attempt in ready:
            del self._launching[attempt.job_id]
        launched = self._results(ready, self._answers)
        for job_id, (started_handles, error) in list(launched.items()):
            if (error is not None and not isinstance(error, StartError)
                    and not started_handles):  # no room for any: as if never claimed
                del launched[job_id]
                self._unplace(self.attempts[job_id], error)
        handles, never, running = {}, [], {}
        for job_id, (started_handles, error) in launched.items():
            attempt = self.attempts[job_id]
            for wid, handle in started_handles.items():
                handles[wid] = handle.to_dict()
                attempt.workers[wid] = dataclasses.replace(attempt.workers[wid],
                                                           handle=handles[wid])
            if error is not None:
                never += self._drop_unstarted(attempt)
            elif attempt.host is None:  # plain, multi-node or torchrun: it runs once started
                running[job_id] = len(attempt.workers)
        self.store.scheduling.record_launch(handles, never, running)
        for job_id, (_, error) in launched.items():
            if error is None and job_id not in running:  # elastic: RUNNING once it trains
                self.stopper.count_workers(self.attempts[job_id])
        for job_id in running:
            attempt = self.attempts[job_id]
            self.index.moved(job_id, attempt.job.array_parent_id, JobStatus.STARTING,
                             JobStatus.RUNNING)
            attempt.job = dataclasses.replace(attempt.job, status=JobStatus.RUNNING)
        for job_id, (_, error) in launched.items():
            if error is not None:
                self._start_failed(self.attempts[job_id], error)

    def grow(self, attempt: Attempt, placement: dict[str, int],
             envs: Mapping[str, ComputeEnvironment]) -> None:
        """Grow a running attempt: record, then start, the new workers; raises the first
        ``ExecutorError`` of those that did not start (the job goes on with the others)."""
        first = attempt.workers_started
        records = self._plan_workers(attempt, placement, envs, self.clock())
        for record in records:
            self.store.workers.add_worker(record)
            self.attempts.own(record.id, attempt.job_id)
        specs = self._specs([attempt])
        asked = attempt.host.clock() if attempt.host is not None else None
        answers = dict(zip((s.worker_id for s in specs), self.executor.start_many(specs),
                           strict=True))
        handles, error = self._results([attempt], answers)[attempt.job_id]
        for wid, handle in handles.items():
            attempt.workers[wid] = dataclasses.replace(attempt.workers[wid],
                                                       handle=handle.to_dict())
        self.store.scheduling.record_launch({wid: h.to_dict() for wid, h in handles.items()},
                                 self._drop_unstarted(attempt), {})
        if attempt.host is not None and first > 0 and handles:
            # workers added together join together: the group re-forms once
            attempt.host.expect_joiners(list(handles), within=60.0, requested_at=asked)
        self.stopper.count_workers(attempt)
        if error is not None:
            if not isinstance(error, StartError):  # no more room: grow again once there is
                # (its workers' records stay: no retry before more is free)
                self.refusals[attempt.job_id] = refusal(str(error), self.executor.free())
            raise error

    def _start_failed(self, attempt: Attempt, exc: ExecutorError) -> None:
        if isinstance(exc, StartError):  # the command's fault: a failed attempt, counted
            self.stopper.stop_all(attempt, f"{CANNOT_START}: {exc}")
        else:  # no room for all of its workers: not the job's fault, and no preemption
            free = with_released(self.executor.free(), attempt.job.resources,
                                 len(attempt.workers))  # what is free once they are stopped
            # it expires too: a refusal not about room (a Ray actor that died while starting)
            # must not hold the job until more room frees, which may never happen
            refused = self.refusals[attempt.job_id] = refusal(str(exc), free, self.clock())
            attempt.claim(Ending(EndKind.UNPLACED))
            self.stopper.stop_all(attempt, refused.reason)

    def _unplace(self, attempt: Attempt, exc: ExecutorError) -> None:
        """The executor had no room for any of the attempt's workers: take the claim back (no
        attempt, no preemption, no worker records) and let the job wait, RUNNABLE, with the
        executor's reason, until it has more room (``core/placement.py``)."""
        job = attempt.job
        refused = self.refusals[job.id] = refusal(str(exc), self.executor.free(), self.clock())
        self._drop_unstarted(attempt)
        self.attempts.remove(job.id)
        if attempt.host is not None:
            attempt.host.close()
        if self.store.scheduling.unclaim_start(job.id, attempt.number, refused.reason,
                                               job.started_at):
            job = dataclasses.replace(job, status=JobStatus.RUNNABLE,
                                      status_reason=refused.reason)
            self.index.moved(job.id, job.array_parent_id, JobStatus.STARTING,
                             JobStatus.RUNNABLE, job_view(job))
        else:
            self.index.forget(job.id)  # someone else moved it first

    def _plan_workers(self, attempt: Attempt, placement: dict[str, int],
                      envs: Mapping[str, ComputeEnvironment], now: float) -> list[WorkerRecord]:
        """Worker records (no handles yet) for ``placement``, added to the attempt."""
        records = []
        for env_name, count in placement.items():
            ce = envs.get(env_name)
            if ce is None:
                raise ExecutorError(f"compute environment {env_name} was deleted")
            for _ in range(count):
                wid = worker_id(attempt.job_id, attempt.number, attempt.workers_started)
                attempt.workers_started += 1
                records.append(WorkerRecord(wid, attempt.job_id, attempt.number, env_name,
                                            ce.spec.capacity_type.value,
                                            ce.spec.price_per_slot_hour, None, WorkerState.RUNNING,
                                            now))
        attempt.workers.update((r.id, r) for r in records)
        return records

    def _specs(self, attempts: list[Attempt]) -> list[WorkerSpec]:
        """What starts the attempts' (already recorded) workers that have no handle yet."""
        return [WorkerSpec(job.id, attempt.number, record.id, list(job.command),
                           self._worker_env(job, attempt, record), job.resources, job.workdir,
                           str(self.folders.log_path(job.id, record.id)),
                           record.compute_environment, _main_worker(attempt),
                           pinned_kernels(job.environment, self._exported(job),
                                          job.elastic is not None))
                for attempt in attempts if (job := attempt.job)
                for record in attempt.workers.values() if record.handle is None]

    def _results(self, attempts: list[Attempt], answers: Answers) -> Launched:
        """Per job, the handles of its workers that started and the first error of those that
        did not, taken out of ``answers``; each started worker's log is followed from now."""
        out = {}
        for attempt in attempts:
            handles, error = {}, None
            for wid, record in attempt.workers.items():
                if record.handle is not None:
                    continue
                result = answers.pop(wid)
                if isinstance(result, ExecutorError):
                    error = error or result
                    continue
                handles[wid] = result
                self.logs.follow(wid, self.folders.log_path(attempt.job_id, wid),
                                 attempt.job_id, attempt.number)
            out[attempt.job_id] = (handles, error)
        return out

    def _drop_unstarted(self, attempt: Attempt) -> list[str]:
        """Forget the attempt's workers that never got a handle; returns their ids."""
        gone = [wid for wid, w in attempt.workers.items() if w.handle is None]
        for wid in gone:
            self.attempts.disown(wid)
            self.logs.exited(wid)
            del attempt.workers[wid]
        return gone

    def _exported(self, job: Job) -> dict[str, str]:
        """The submitter's variables (an array child's are its parent's, read once)."""
        if job.array_parent_id is None:
            return job.exported_environment or {}
        found = self._parent_exports.get(job.array_parent_id)
        if found is None:
            found = self._parent_exports[job.array_parent_id] = \
                self.store.jobs.exported_environment(job)
            if len(self._parent_exports) > MAX_PARENT_EXPORTS:
                del self._parent_exports[next(iter(self._parent_exports))]
        return found

    def _worker_env(self, job: Job, attempt: Attempt, w: WorkerRecord) -> dict[str, str]:
        """AWS Batch's variables too; a multi-node job's nodes are its workers in start order
        (an elastic one's ranks come from its coordinator, not from the node index); a
        torchrun job's workers get torchrun's variables, ranked in start order."""
        # the job's numerics as the libraries read them (threads, kernel level) unless the job
        # chose its own, the submitter's variables under the job's own, under the service's
        # (submitter.py)
        own = {**self._exported(job), **job.environment}
        env = {**job_numerics(job.environment)[0].library_env(own), **own,
               "DYNTRAIN_JOB_ID": job.id, "DYNTRAIN_JOB_NAME": job.name,
               "DYNTRAIN_JOB_ATTEMPT": str(attempt.number), "AWS_BATCH_JOB_ID": job.id,
               "AWS_BATCH_JOB_ATTEMPT": str(attempt.number), "AWS_BATCH_JQ_NAME": job.queue,
               "AWS_BATCH_CE_NAME": w.compute_environment, ENV_WORKER_ID: w.id,
               ENV_OUT: self.folders.run_store(job).location, "PYTHONUNBUFFERED": "1"}
        if job.array_index is not None:
            env["AWS_BATCH_JOB_ARRAY_INDEX"] = env["DYNTRAIN_ARRAY_INDEX"] = str(job.array_index)
        if job.num_nodes:
            env.update(AWS_BATCH_JOB_NUM_NODES=str(job.num_nodes),
                       AWS_BATCH_JOB_NODE_INDEX=str(worker_index(w.id)),
                       AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
                       AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=MAIN_NODE_ADDRESS)
        if attempt.master_port is not None:
            env.update(worker_env(
                rank=worker_index(w.id), world_size=len(attempt.workers),
                master_addr=MAIN_NODE_ADDRESS, master_port=attempt.master_port,
                restart=restart_count(attempt.number), run_id=job.id,
                max_restarts=job.retry_strategy.attempts - 1,
                nccl_async_error_handling=own.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")))
        if attempt.host is not None:
            env.update(attempt.host.numerics.env())  # the job's numerics, whatever the host's
            env[ENV_COORDINATOR] = attempt.host.address
            env[ENV_REATTACH] = f"{self.config.reattach_seconds:g}"
            env[ENV_SECRET] = attempt.host.secret
        return env


def _main_worker(attempt: Attempt) -> str | None:
    """A gang's first worker, whose host is its main node (torchrun and multi-node jobs)."""
    if attempt.master_port is None and not attempt.job.num_nodes:
        return None
    return worker_id(attempt.job_id, attempt.number, 0)


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (a torchrun gang's ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]
