"""The job service's control loop: store in, scheduler decisions, executor and coordinators out.

``Controller.step()`` runs one iteration and is what tests drive; ``run()`` loops it. Each step:

1. learns about new jobs (``JobIndex``: read after a watermark, a bounded number per step);
2. records the handles of the workers whose starts the executor answered since (starts are
   sent without waiting for the children to exec), reaps worker exits from the executor and
   settles the attempts they end;
3. ticks the coordinator of every running elastic job (the service hosts them);
4. when something changed (or every ``schedule_every``): moves waiting jobs whose dependencies
   changed, array parents whose children changed, and asks the pure scheduler for a plan over the
   current capacity (traces included) and applies it: start, grow, shrink (graceful notice),
   suspend (checkpoint and re-queue);
5. enforces timeouts and the grace period of workers told to leave (SIGTERM, then SIGKILL);
6. copies new lines of worker logs into the store.

Work grows with what changed, not with the queue: the index keeps each queue sorted and the
attempts keep their workers in memory, and the database writes of a phase share one transaction
(``Store.batch``). A job's start is claimed (RUNNABLE -> STARTING, a compare-and-set; attempt
and worker records) and committed before any worker starts, so even two controllers over one
database never start a job twice, and a restarted service knows every worker that may run.
Preemptions (shrink, suspend, capacity taken back) never count against a job's retry attempts; a
command that cannot be executed is a failed attempt (``CannotStartContainerError``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dyntrain.elastic.protocol import ENV_OUT, FAILURE_TIMEOUT
from dyntrain.elastic.storage import LocalStore, RunStore, open_store
from dyntrain.service.allocation import FIFO, AllocationPolicy
from dyntrain.service.attempts import Attempt, LogTail, terminating
from dyntrain.service.capacity import parse_trace
from dyntrain.service.executors.base import Executor, ExecutorError, WorkerExit
from dyntrain.service.jobindex import WAITING, JobIndex, job_view
from dyntrain.service.launching import Launching
from dyntrain.service.model import JobStatus
from dyntrain.service.recovery import Recovery
from dyntrain.service.scheduler import EnvView, JobView, Plan, QueueView, Snapshot, schedule
from dyntrain.service.settling import Settling
from dyntrain.service.store import WORKER_LEAVING, WORKER_RUNNING, Job, Store, WorkerRecord


@dataclass
class ControllerConfig:
    state_dir: Path
    grace_seconds: float = 120.0  # SIGTERM -> SIGKILL for workers told to leave
    tick_seconds: float = 0.05
    schedule_every: float = 0.2  # passes when nothing changed (capacity traces move with time)
    failure_timeout: float = FAILURE_TIMEOUT  # heartbeat timeout of elastic workers
    # How long elastic workers train on without their coordinator, waiting for a restarted
    # service to re-attach them; 0: they stop, and the job resumes from its newest checkpoint.
    reattach_seconds: float = 300.0
    new_jobs_per_step: int = 2000  # bounds on one step's work, so API requests never wait long
    resolve_per_step: int = 1000
    starts_per_step: int = 64
    policy: AllocationPolicy = FIFO  # how running elastic jobs share slots (allocation.py)


class Controller(Recovery, Launching, Settling):
    """One service's loop over a store and an executor."""

    def __init__(self, store: Store, executor: Executor, config: ControllerConfig,
                 clock=time.time) -> None:
        self.store, self.executor, self.config, self.clock = store, executor, config, clock
        self.attempts: dict[str, Attempt] = {}
        self.index = JobIndex(store)
        self.plan = Plan()
        self._last_schedule = 0.0
        self._changed = True  # something happened that the scheduler has not seen yet
        self._logs: dict[str, LogTail] = {}  # worker -> the part of its log not yet stored
        self._owner: dict[str, str] = {}  # worker -> the job whose attempt it belongs to
        self._early_exits: list[WorkerExit] = []  # polled before a step could handle them
        self._launching: dict[str, Attempt] = {}  # job -> attempt whose starts were sent
        self._answers: dict = {}  # worker id -> its start's handle or error, not recorded yet
        # called with each scheduling pass's duration in seconds (the dashboard's /metrics)
        self.pass_observers: list[Callable[[float], None]] = []
        self._parent_exports: dict[str, dict[str, str]] = {}  # array parent -> its exports
        config.state_dir.mkdir(parents=True, exist_ok=True)

    @property
    def waiting(self):
        """Job id -> why it waits (``WaitInfo``), as of the last scheduling pass."""
        return self.plan.waiting

    # ---- lifecycle -------------------------------------------------------------------------------

    def run(self, stop) -> None:
        """Loop until ``stop()`` is true."""
        while not stop():
            self.step()
            self.executor.wait(self.config.tick_seconds)

    def step(self) -> None:
        now = self.clock()
        if self.index.refresh(self.config.new_jobs_per_step):
            self._changed = True
        self._record_launches()
        exits = self._early_exits + self.executor.poll()
        # exits of workers whose attempt is not recorded yet (a multi-node one half answered)
        launching = {wid for a in self._launching.values() for wid in a.workers}
        self._early_exits = [e for e in exits if e.worker_id in launching]
        exits = [e for e in exits if e.worker_id not in launching]
        self._settle(exits, now)
        if self._changed or now - self._last_schedule >= self.config.schedule_every:
            self._last_schedule, self._changed = now, False
            started = time.perf_counter()
            self._resolve_waiting()
            self._update_array_parents()
            self._apply(schedule(self.snapshot(now), self.config.policy))
            seconds = time.perf_counter() - started
            for observe in self.pass_observers:
                observe(seconds)
        self._enforce_deadlines(now)
        self._pump_logs()

    # ---- user requests ---------------------------------------------------------------------------

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> bool:
        """Cancel a job that has not started (AWS Batch: cancel); False if it already runs.

        For an array job, every child that has not started is cancelled with one statement per
        status; children already running go on (``terminate`` stops them).
        """
        job = self.store.get_job(job_id)
        done = False
        now = self.clock()
        if job.is_array_parent:
            moved = []
            for status in (*WAITING, JobStatus.RUNNABLE):
                moved += [(i, status) for i in self.store.transition_children(
                    job_id, status, JobStatus.FAILED, reason, stopped_at=now)]
            self.index.drop_children(job_id, moved, JobStatus.FAILED)
            done = bool(moved)
        for status in (*WAITING, JobStatus.RUNNABLE):
            if self.store.transition(job_id, status, JobStatus.FAILED, reason, stopped_at=now):
                self.index.moved(job_id, job.array_parent_id, status, JobStatus.FAILED)
                done = True
                break
        self._changed = True
        return done

    def terminate(self, job_id: str, reason: str = "terminated by user") -> None:
        """Stop a job whatever its state (AWS Batch: terminate); it ends FAILED, not retried.
        Running workers get their notice now and end in the background."""
        self.cancel(job_id, reason)
        for attempt in list(self.attempts.values()):
            if attempt.job_id == job_id or attempt.job.array_parent_id == job_id:
                attempt.terminated = reason
                self._stop_all(attempt, reason)
                # until its workers are gone it stays RUNNING: say that it is on its way out
                if attempt.host is not None:
                    attempt.host.sink.stopping = True  # membership news no longer says why
                self.store.update_job(attempt.job_id, status_reason=terminating(reason))

    # ---- capacity and the scheduler --------------------------------------------------------------

    def available_slots(self, now: float) -> dict[str, int]:
        return self._available(now, self.store.list_compute_environments())

    def _available(self, now: float, envs) -> dict[str, int]:
        traces = self.store.capacity_traces()
        offered = self.executor.slots({ce.name: ce.spec.slot for ce in envs})
        out = {}
        for ce in envs:
            if offered is not None:  # the cluster's nodes decide
                out[ce.name] = min(offered.get(ce.name, 0), ce.spec.max_slots)
            elif ce.name in traces:
                csv, started, loop = traces[ce.name]
                trace = parse_trace(csv, source=f"{ce.name} trace", loop=loop)
                out[ce.name] = min(trace.at(now - started).slots, ce.spec.max_slots)
            else:
                out[ce.name] = ce.spec.desired_slots
        return out

    def snapshot(self, now: float) -> Snapshot:
        ces = self.store.list_compute_environments()
        slots = self._available(now, ces)
        running: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        leaving: dict[str, int] = defaultdict(int)
        in_use: dict[str, int] = defaultdict(int)
        for attempt in self.attempts.values():
            for w in attempt.workers.values():
                if w.state == WORKER_RUNNING:
                    running[w.job_id][w.compute_environment] += 1
                    in_use[w.compute_environment] += 1
                else:
                    leaving[w.compute_environment] += 1  # still holds its slot until it exits

        def usable(name: str) -> int:
            # A leaving worker still holds its slot (nothing new may start there), but it is
            # already on its way out: it must not make the scheduler shrink a second worker.
            have = slots.get(name, 0)
            return max(0, have - leaving[name], min(have, in_use[name]))

        envs = tuple(
            EnvView(ce.name, ce.spec.capacity_type, ce.spec.price_per_slot_hour, ce.spec.slot,
                    usable(ce.name), ce.spec.state) for ce in ces)
        queues = tuple(QueueView(q.name, q.spec.priority, q.spec.compute_environments,
                                 q.spec.state) for q in self.store.list_job_queues())
        active = []
        for attempt in self.attempts.values():
            job = attempt.job
            if attempt.stop_reason:
                continue  # stopping: its slots free up as its workers exit
            lo, hi = job.workers_range
            if job.elastic is None:  # a plain or multi-node job never grows back
                lo = hi = max(1, sum(running.get(job.id, {}).values()))
            status = JobStatus.RUNNING if attempt.workers else JobStatus.STARTING
            profile = (attempt.host.sink.speedup.profile() if attempt.host is not None
                       and self.config.policy.reallocates else None)
            active.append(JobView(job.id, job.queue, job.created_at, job.resources, lo, hi,
                                  status, dict(running.get(job.id, {})),
                                  preemptible=job.elastic is not None, profile=profile))
        self._envs = {ce.name: ce for ce in ces}
        return Snapshot(envs, queues, tuple(active), self.index.queues())

    def _apply(self, plan: Plan) -> None:
        self.plan = plan
        for shrink in plan.shrinks:
            self._shrink(shrink.job, shrink.env, shrink.count, shrink.reason)
        for suspend in plan.suspends:
            attempt = self.attempts.get(suspend.job)
            if attempt is not None:
                attempt.preempted = True
                self._stop_all(attempt, f"suspended: {suspend.reason}")
        starts = plan.starts[:self.config.starts_per_step]
        if len(starts) < len(plan.starts):
            self._changed = True  # the rest start in the next step
        if starts:
            self._start_many(starts)
        for grow in plan.grows:
            attempt = self.attempts.get(grow.job)
            if attempt is not None and attempt.stop_reason is None:
                try:
                    self._start_workers(attempt, {grow.env: grow.count})
                except ExecutorError as exc:  # the job goes on with the workers it has
                    self.store.add_event(grow.job, "grow.failed", {"error": str(exc)})

    # ---- dependencies and arrays -----------------------------------------------------------------

    def _resolve_waiting(self) -> None:
        """Move the waiting jobs whose dependencies changed, many at once."""
        moves = self.index.resolve(self.config.resolve_per_step)
        if self.index.dirty:
            self._changed = True  # more next step
        groups: dict[tuple, list] = defaultdict(list)
        for entry, move in moves:
            groups[(entry.status, move.status, move.reason)].append(entry)
        now = self.clock()
        for (old, new, reason), entries in groups.items():
            extra = {"stopped_at": now} if new.is_terminal() else {}
            moved = set(self.store.transition_many([e.id for e in entries], old, new, reason,
                                                   **extra))
            for e in entries:
                if e.id not in moved:
                    self.index.forget(e.id)  # someone else moved it; a reload would see where
                else:
                    self.index.moved(e.id, e.array_parent_id, old, new,
                                     job_view(e) if new is JobStatus.RUNNABLE else None, reason)
            self._changed = True

    def _update_array_parents(self) -> None:
        changed, self.index.changed_parents = self.index.changed_parents, set()
        for parent_id in changed:
            parent = self.index.parents.get(parent_id)
            if parent is None:
                continue
            status = self.index.parent_status(parent_id)
            if status is parent.status:
                continue
            now = self.clock()
            extra = {"stopped_at": now} if status.is_terminal() else {}
            if status is JobStatus.RUNNING:
                extra["started_at"] = now
            if self.store.transition(parent_id, parent.status, status,
                                     f"children: {status.value.lower()}", **extra):
                self.index.parents[parent_id] = dataclasses.replace(parent, status=status)
                self.index.moved(parent_id, None, parent.status, status)

    # ---- starting --------------------------------------------------------------------------------

    def run_dir(self, job_id: str) -> Path:
        return self.config.state_dir / "jobs" / job_id.replace(":", "_")

    def run_store(self, job: Job) -> RunStore:
        """Where a job's training files go: the object store its ``DYNTRAIN_OUT`` names, else
        its run folder here (which keeps its logs either way)."""
        out = job.environment.get(ENV_OUT)
        return open_store(out) if out else LocalStore(self.run_dir(job.id))

    def _log_path(self, job_id: str, wid: str) -> Path:
        return self.run_dir(job_id) / "logs" / f"{wid}.log"

    def _count_workers(self, attempt: Attempt) -> None:
        self.store.update_job(attempt.job_id, current_workers=len(attempt.running()))

    def _forget_worker(self, wid: str) -> None:
        self._owner.pop(wid, None)
        tail = self._logs.get(wid)
        if tail is not None:
            tail.exited = True

    # ---- stopping --------------------------------------------------------------------------------

    def _shrink(self, job_id: str, env: str, count: int, reason: str) -> None:
        attempt = self.attempts.get(job_id)
        if attempt is None:
            return
        chosen = [w for w in attempt.running() if w.compute_environment == env][-count:]
        for w in chosen:
            self._tell_to_leave(attempt, w, f"shrink: {reason}")
        if chosen:  # what a user calls a preemption: capacity taken from a running job
            attempt.shrunk += len(chosen)
            self.store.update_job(job_id, preemptions=attempt.job.preemptions + attempt.shrunk)
        self._count_workers(attempt)

    def _stop_all(self, attempt: Attempt, reason: str) -> None:
        attempt.stop_reason = attempt.stop_reason or reason
        leaving = attempt.running()
        with self.store.batch():  # recorded in one commit, then the notices go out together
            for w in leaving:
                self._record_leave(attempt, w, reason)
            self._count_workers(attempt)
        for w in leaving:
            self._notify(w)

    def _tell_to_leave(self, attempt: Attempt, w: WorkerRecord, reason: str) -> None:
        """A graceful notice (SIGTERM); SIGKILL follows after the grace period."""
        self._record_leave(attempt, w, reason)
        self._notify(w)

    def _record_leave(self, attempt: Attempt, w: WorkerRecord, reason: str) -> None:
        if attempt.host is not None:
            attempt.host.coordinator.note_request(w.id)
        now = self.clock()
        self.store.update_worker(w.id, state=WORKER_LEAVING, leave_reason=reason, leave_at=now)
        attempt.workers[w.id] = dataclasses.replace(w, state=WORKER_LEAVING, leave_reason=reason,
                                                    leave_at=now)

    def _notify(self, w: WorkerRecord) -> None:
        try:
            self.executor.signal(w.id, "TERM")
        except ExecutorError:
            pass  # already gone; its exit is on its way

    def _enforce_deadlines(self, now: float) -> None:
        for attempt in list(self.attempts.values()):
            for w in attempt.workers.values():
                if (w.state == WORKER_LEAVING
                        and now - (w.leave_at or now) > self.config.grace_seconds):
                    try:
                        self.executor.signal(w.id, "KILL")
                    except ExecutorError:
                        pass
            timeout = attempt.job.timeout_seconds
            if timeout and attempt.timed_out is None and now - attempt.started_at > timeout:
                attempt.timed_out = timeout
                self._stop_all(attempt, f"timeout after {timeout:g}s")

    # ---- exits and attempts ----------------------------------------------------------------------

    # ---- logs ------------------------------------------------------------------------------------

    def _pump_logs(self) -> None:
        """Copy complete new lines of each live worker's log file into the store."""
        with self.store.batch():
            for wid, tail in list(self._logs.items()):
                lines = tail.read_lines()
                if lines:
                    self.store.append_log(tail.job_id, tail.attempt_no, wid, lines)
                if tail.exited and tail.drained:
                    del self._logs[wid]
