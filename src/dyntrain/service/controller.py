"""The job service's control loop: store in, scheduler decisions, executor and coordinators out.

``Controller.step()`` runs one iteration and is what tests drive; ``run()`` loops it. Each step:

1. reaps worker exits from the executor and settles the attempts they end;
2. ticks the coordinator of every running elastic job (the service hosts them);
3. moves SUBMITTED/PENDING jobs along their dependencies and array parents along their children;
4. asks the pure scheduler for a plan over the current capacity (traces included) and applies it:
   start, grow, shrink (graceful notice), suspend (checkpoint and re-queue);
5. enforces timeouts and the grace period of workers told to leave (SIGTERM, then SIGKILL);
6. copies new lines of worker logs into the store.

Preemptions (shrink, suspend, capacity taken back) never count against a job's retry attempts.
A job moves RUNNABLE -> STARTING only through a compare-and-set on its status, so even two
controllers over one database never start a job twice.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dyntrain.elastic.coordinator import Phase
from dyntrain.elastic.trainer import ENV_COORDINATOR, ENV_OUT, ENV_REATTACH, ENV_WORKER_ID
from dyntrain.service import lifecycle
from dyntrain.service.capacity import parse_trace
from dyntrain.service.elastic_host import ElasticHost
from dyntrain.service.executors.base import (
    Executor,
    ExecutorError,
    StartError,
    WorkerExit,
    WorkerHandle,
    WorkerSpec,
)
from dyntrain.service.model import JobStatus
from dyntrain.service.scheduler import (
    EnvView,
    JobView,
    Plan,
    QueueView,
    Snapshot,
    WaitInfo,
    schedule,
)
from dyntrain.service.store import (
    WORKER_EXITED,
    WORKER_LEAVING,
    WORKER_RUNNING,
    Job,
    Store,
    WorkerRecord,
)

WAITING = (JobStatus.SUBMITTED, JobStatus.PENDING)


@dataclass
class ControllerConfig:
    state_dir: Path
    grace_seconds: float = 120.0  # SIGTERM -> SIGKILL for workers told to leave
    tick_seconds: float = 0.05
    schedule_every: float = 0.2  # dependency resolution and scheduling passes
    failure_timeout: float = 10.0  # heartbeat timeout of elastic workers
    # How long elastic workers train on without their coordinator, waiting for a restarted
    # service to re-attach them; 0: they stop, and the job resumes from its newest checkpoint.
    reattach_seconds: float = 300.0


@dataclass
class Attempt:
    """What the controller tracks about a job's running attempt."""

    job_id: str
    number: int
    started_at: float
    host: ElasticHost | None = None
    stop_reason: str | None = None  # why every worker was told to leave
    preempted: bool = False
    timed_out: float | None = None
    terminated: bool = False
    last_exit: WorkerExit | None = None
    workers_started: int = 0
    wasted: dict[str, float] = field(default_factory=dict)  # worker -> seconds thrown away
    priced_events: int = 0  # membership events already looked at for crash waste


class Controller:
    """One service's loop over a store and an executor."""

    def __init__(self, store: Store, executor: Executor, config: ControllerConfig,
                 clock=time.time) -> None:
        self.store, self.executor, self.config, self.clock = store, executor, config, clock
        self.attempts: dict[str, Attempt] = {}
        self.waiting: dict[str, WaitInfo] = {}
        self._last_schedule = 0.0
        self._logs: dict[str, _LogTail] = {}  # worker -> the part of its log not yet stored
        self._early_exits: list[WorkerExit] = []  # polled before a step could handle them
        config.state_dir.mkdir(parents=True, exist_ok=True)

    # ---- lifecycle -------------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """After a (re)start: adopt the workers of plain jobs, host elastic jobs again.

        A plain job's attempt goes on where it was: its running workers are adopted, and a worker
        that exited while no service watched is reported by the executor from what it left
        behind (exit code or signal, end time), so the job ends as that exit dictates and never
        runs twice. A worker whose handle was never stored is looked up by its id; one that was
        never started re-queues the attempt (it did not run). An elastic job's coordinator died
        with the previous service, but its workers trained on: it is hosted again (same port if
        free) and they re-attach (``reattach_seconds``). Without any running worker, or with
        re-attaching off, the job is queued again to resume from its newest checkpoint. Returns
        one line per job touched.
        """
        notes = []
        by_job: dict[str, list[WorkerRecord]] = defaultdict(list)
        for w in self.store.list_workers(active=True):
            by_job[w.job_id].append(w)
        for job in self.store.list_jobs(status=[JobStatus.STARTING, JobStatus.RUNNING],
                                        limit=1_000_000):
            if job.is_array_parent:
                continue
            workers = by_job.get(job.id, [])
            number = len(self.store.list_attempts(job.id))
            ever = [w for w in self.store.list_workers(job.id, active=False)
                    if w.attempt_no == number]
            attempt = Attempt(job.id, number, job.started_at or self.clock(),
                              workers_started=len(ever))
            if job.elastic is None:
                self.attempts[job.id] = attempt
                notes.append(f"{job.id}: {self._recover_plain(attempt, workers)}")
                continue
            found = {w.id: self._adopt(attempt, w) for w in workers}
            adopted = [w for w in workers if found[w.id]]
            if adopted and self.config.reattach_seconds:
                started = [w for w in workers if found[w.id] is not None]
                notes.append(f"{job.id}: {self._host_again(job, attempt, started)}")
                continue
            for w in adopted:
                self.executor.signal(w.id, "KILL")
            self._wait_gone([w.id for w in adopted])
            for w in workers:
                self.store.update_worker(w.id, state=WORKER_EXITED, stopped_at=self.clock())
                if w.id in self._logs:
                    self._logs[w.id].exited = True
            reason = "service restarted: resumes from its newest checkpoint"
            if number:
                self.store.finish_attempt(job.id, number, None, reason, self.clock())
            self.store.update_job(job.id, status=JobStatus.RUNNABLE, status_reason=reason,
                                  preemptions=job.preemptions + 1, current_workers=0)
            notes.append(f"{job.id}: {reason}")
        return notes

    def _recover_plain(self, attempt: Attempt, workers: list[WorkerRecord]) -> str:
        found = [self._adopt(attempt, w) for w in workers]
        running, exited = found.count(True), found.count(False)
        if not running and not exited:
            attempt.preempted = True
            attempt.stop_reason = "the service stopped before its worker started"
            return "its worker never started: queued again"
        return ", ".join(part for part in (
            f"re-adopted {running} running worker(s)" if running else "",
            f"{exited} worker(s) exited while the service was down" if exited else "") if part)

    def _host_again(self, job: Job, attempt: Attempt, workers: list[WorkerRecord]) -> str:
        """Host a running elastic job's coordinator again: its workers trained on meanwhile and
        re-attach (those that ended while the service was down are reported by the executor)."""
        attempt.host = ElasticHost(self.store, job.id, self.run_dir(job.id), job.min_workers,
                                   job.max_workers, expected=len(workers),
                                   failure_timeout=self.config.failure_timeout,
                                   attempt=attempt.number, recovering=[w.id for w in workers])
        self.attempts[job.id] = attempt
        return f"its workers re-attach to its coordinator at {attempt.host.address}"

    def _adopt(self, attempt: Attempt, w: WorkerRecord) -> bool | None:
        """Watch ``w`` again: True while it runs, False when it ended (the executor reports its
        exit), None when it never started.

        A worker without a stored handle was being started when the service stopped: the
        executor finds it by its id, or it never started (it is then marked so).
        """
        handle = None
        try:
            handle = WorkerHandle.from_dict(w.handle) if w.handle else self.executor.find(w.id)
        except ExecutorError as e:
            reason = f"exit status lost: the service stopped while starting it ({e})"
            attempt.last_exit = WorkerExit(w.id, None, None, reason)
            self.store.update_worker(w.id, state=WORKER_EXITED, stopped_at=self.clock(),
                                     leave_reason=reason)
            return False
        if handle is None:
            self.store.update_worker(w.id, state=WORKER_EXITED, stopped_at=self.clock(),
                                     leave_reason="never started")
            return None
        if not w.handle:
            self.store.update_worker(w.id, handle=handle.to_dict())
        spec = WorkerSpec(w.job_id, w.attempt_no, w.id, ["true"], {}, self._resources_of(w),
                          None, str(self._log_path(w.job_id, w.id)))
        path = self._log_path(w.job_id, w.id)
        offset = _after_lines(path, self.store.count_log_lines(w.job_id, w.id))
        self._logs[w.id] = _LogTail(path, w.job_id, w.attempt_no, offset)
        if self.executor.adopt(handle, spec):
            return True
        self._logs[w.id].exited = True  # its exit comes with the next poll()
        return False

    def _resources_of(self, w: WorkerRecord):
        return self.store.get_job(w.job_id).resources

    def _wait_gone(self, worker_ids: list[str], timeout: float = 10.0) -> None:
        """Wait for these workers' exits; the exits of others are kept for the next step."""
        deadline = time.monotonic() + timeout
        pending = set(worker_ids)
        while pending and time.monotonic() < deadline:
            for e in self.executor.poll():
                if e.worker_id in pending:
                    pending.discard(e.worker_id)
                else:
                    self._early_exits.append(e)
            self.executor.wait(0.02)

    def run(self, stop) -> None:
        """Loop until ``stop()`` is true."""
        while not stop():
            self.step()
            time.sleep(self.config.tick_seconds)

    def step(self) -> None:
        now = self.clock()
        exits, self._early_exits = self._early_exits + self.executor.poll(), []
        for exit_ in exits:
            self._on_exit(exit_, now)
        for attempt in list(self.attempts.values()):
            self._tick_attempt(attempt, now)
        if now - self._last_schedule >= self.config.schedule_every:
            self._last_schedule = now
            self._resolve_waiting()
            self._update_array_parents()
            self._apply(schedule(self.snapshot(now)), now)
        self._enforce_deadlines(now)
        self._pump_logs()

    # ---- user requests ---------------------------------------------------------------------------

    def cancel(self, job_id: str) -> bool:
        """Cancel a job that has not started (AWS Batch: cancel); False if it already runs."""
        job = self.store.get_job(job_id)
        ids = [job_id] + ([c.id for c in self.store.list_jobs(parent=job_id, limit=100_000)]
                          if job.is_array_parent else [])
        done = False
        for jid in ids:
            for status in (JobStatus.SUBMITTED, JobStatus.PENDING, JobStatus.RUNNABLE):
                if self.store.transition(jid, status, JobStatus.FAILED, "cancelled by user",
                                         stopped_at=self.clock()):
                    done = True
                    break
        return done

    def terminate(self, job_id: str) -> None:
        """Stop a job whatever its state (AWS Batch: terminate); it ends FAILED, not retried."""
        self.cancel(job_id)
        job = self.store.get_job(job_id)
        targets = [job_id] + ([c.id for c in self.store.list_jobs(parent=job_id, limit=100_000)]
                              if job.is_array_parent else [])
        for jid in targets:
            attempt = self.attempts.get(jid)
            if attempt is not None:
                attempt.terminated = True
                self._stop_all(attempt, "terminated by user")

    # ---- capacity and the scheduler --------------------------------------------------------------

    def available_slots(self, now: float) -> dict[str, int]:
        traces = self.store.capacity_traces()
        out = {}
        for ce in self.store.list_compute_environments():
            if ce.name in traces:
                csv, started, loop = traces[ce.name]
                trace = parse_trace(csv, source=f"{ce.name} trace", loop=loop)
                out[ce.name] = min(trace.at(now - started).slots, ce.spec.max_slots)
            else:
                out[ce.name] = ce.spec.desired_slots
        return out

    def snapshot(self, now: float) -> Snapshot:
        slots = self.available_slots(now)
        active = self.store.list_workers(active=True)
        running: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        leaving: dict[str, int] = defaultdict(int)
        for w in active:
            if w.state == WORKER_RUNNING:
                running[w.job_id][w.compute_environment] += 1
            else:
                leaving[w.compute_environment] += 1  # still holds its slot until it exits
        in_use: dict[str, int] = defaultdict(int)
        for placement in running.values():
            for env, count in placement.items():
                in_use[env] += count

        def usable(name: str) -> int:
            # A leaving worker still holds its slot (nothing new may start there), but it is
            # already on its way out: it must not make the scheduler shrink a second worker.
            have = slots.get(name, 0)  # an environment created since slots were read: none yet
            return max(0, have - leaving[name], min(have, in_use[name]))

        envs = tuple(
            EnvView(ce.name, ce.spec.capacity_type, ce.spec.price_per_slot_hour, ce.spec.slot,
                    usable(ce.name), ce.spec.state)
            for ce in self.store.list_compute_environments())
        queues = tuple(QueueView(q.name, q.spec.priority, q.spec.compute_environments,
                                 q.spec.state) for q in self.store.list_job_queues())
        jobs = []
        for job in self.store.list_jobs(status=[JobStatus.RUNNABLE, JobStatus.STARTING,
                                                JobStatus.RUNNING], limit=10_000_000):
            if job.is_array_parent:
                continue
            attempt = self.attempts.get(job.id)
            if job.status is not JobStatus.RUNNABLE and (attempt is None or attempt.stop_reason):
                continue  # stopping: its slots free up as its workers exit
            lo, hi = (job.min_workers, job.max_workers) if job.elastic else (1, 1)
            jobs.append(JobView(job.id, job.queue, job.created_at + (job.array_index or 0) * 1e-7,
                                job.resources, lo, hi, job.status,
                                dict(running.get(job.id, {})), preemptible=job.elastic is not None))
        return Snapshot(envs, queues, tuple(jobs))

    def _apply(self, plan: Plan, now: float) -> None:
        self.waiting = plan.waiting
        for shrink in plan.shrinks:
            self._shrink(shrink.job, shrink.env, shrink.count, shrink.reason)
        for suspend in plan.suspends:
            attempt = self.attempts.get(suspend.job)
            if attempt is not None:
                attempt.preempted = True
                self._stop_all(attempt, f"suspended: {suspend.reason}")
        for start in plan.starts:
            self._start(start.job, dict(start.placement))
        for grow in plan.grows:
            attempt = self.attempts.get(grow.job)
            if attempt is not None and attempt.stop_reason is None:
                job = self.store.get_job(grow.job)
                try:
                    self._start_workers(job, attempt, {grow.env: grow.count})
                except ExecutorError as exc:  # the job goes on with the workers it has
                    self.store.add_event(job.id, "grow.failed", {"error": str(exc)})

    # ---- starting --------------------------------------------------------------------------------

    def _start(self, job_id: str, placement: dict[str, int]) -> None:
        now = self.clock()  # not the step's start: a long pass would date the start too early
        if not self.store.transition(job_id, JobStatus.RUNNABLE, JobStatus.STARTING,
                                     "starting workers", started_at=now):
            return  # someone else moved it first
        job = self.store.get_job(job_id)
        number = len(self.store.list_attempts(job_id)) + 1
        self.store.add_attempt(job_id, number, now)
        attempt = Attempt(job_id, number, now)
        if job.elastic is not None:
            attempt.host = ElasticHost(self.store, job_id, self.run_dir(job_id), job.min_workers,
                                       job.max_workers, expected=sum(placement.values()),
                                       failure_timeout=self.config.failure_timeout,
                                       attempt=number)
        self.attempts[job_id] = attempt
        try:
            self._start_workers(job, attempt, placement)
        except StartError as exc:  # the command's fault: a failed attempt, counted
            self._stop_all(attempt, f"CannotStartContainerError: {exc}")
            return
        except ExecutorError as exc:  # no room after all: not the job's fault
            attempt.preempted = True
            self._stop_all(attempt, f"could not start: {exc}")
            return
        if job.elastic is None:
            self.store.transition(job_id, JobStatus.STARTING, JobStatus.RUNNING, "running")

    def _start_workers(self, job: Job, attempt: Attempt, placement: dict[str, int]) -> None:
        envs = {ce.name: ce for ce in self.store.list_compute_environments()}
        first = attempt.workers_started
        for env_name, count in placement.items():
            ce = envs.get(env_name)
            if ce is None:
                raise ExecutorError(f"compute environment {env_name} was deleted")
            for _ in range(count):
                index = attempt.workers_started
                attempt.workers_started += 1
                worker_id = _worker_id(job.id, attempt.number, index)
                log_path = self._log_path(job.id, worker_id)
                log_path.parent.mkdir(parents=True, exist_ok=True)
                spec = WorkerSpec(job.id, attempt.number, worker_id, list(job.command),
                                  self._worker_env(job, attempt, worker_id), job.resources, None,
                                  str(log_path))
                # Recorded before it starts: a restarted service then knows to look for it.
                self.store.add_worker(WorkerRecord(
                    worker_id, job.id, attempt.number, env_name, ce.spec.capacity_type.value,
                    ce.spec.price_per_slot_hour, None, WORKER_RUNNING, self.clock()))
                try:
                    handle = self.executor.start(spec)
                except ExecutorError:
                    self.store.update_worker(worker_id, state=WORKER_EXITED,
                                             stopped_at=self.clock(), leave_reason="never started")
                    raise
                self.store.update_worker(worker_id, handle=handle.to_dict())
                self._logs[worker_id] = _LogTail(log_path, job.id, attempt.number)
        if attempt.host is not None and first > 0:
            # workers added together join together: the group re-forms once
            started = [_worker_id(job.id, attempt.number, i)
                       for i in range(first, attempt.workers_started)]
            attempt.host.coordinator.expect_joiners(started, within=60.0)
        self._count_workers(job.id)

    def _worker_env(self, job: Job, attempt: Attempt, worker_id: str) -> dict[str, str]:
        env = {**job.environment, "DYNTRAIN_JOB_ID": job.id, "DYNTRAIN_JOB_NAME": job.name,
               "DYNTRAIN_JOB_ATTEMPT": str(attempt.number), "AWS_BATCH_JOB_ID": job.id,
               "AWS_BATCH_JOB_ATTEMPT": str(attempt.number), ENV_WORKER_ID: worker_id,
               ENV_OUT: str(self.run_dir(job.id)), "PYTHONUNBUFFERED": "1"}
        if job.array_index is not None:
            env["AWS_BATCH_JOB_ARRAY_INDEX"] = env["DYNTRAIN_ARRAY_INDEX"] = str(job.array_index)
        if attempt.host is not None:
            env[ENV_COORDINATOR] = attempt.host.address
            env[ENV_REATTACH] = f"{self.config.reattach_seconds:g}"
        return env

    def run_dir(self, job_id: str) -> Path:
        return self.config.state_dir / "jobs" / job_id.replace(":", "_")

    def _log_path(self, job_id: str, worker_id: str) -> Path:
        return self.run_dir(job_id) / "logs" / f"{worker_id}.log"

    def _count_workers(self, job_id: str) -> None:
        n = sum(1 for w in self.store.list_workers(job_id) if w.state == WORKER_RUNNING)
        self.store.update_job(job_id, current_workers=n)

    # ---- stopping --------------------------------------------------------------------------------

    def _shrink(self, job_id: str, env: str, count: int, reason: str) -> None:
        attempt = self.attempts.get(job_id)
        if attempt is None:
            return
        chosen = [w for w in self.store.list_workers(job_id)
                  if w.state == WORKER_RUNNING and w.compute_environment == env][-count:]
        for w in chosen:
            self._tell_to_leave(attempt, w, f"shrink: {reason}")
        self._count_workers(job_id)

    def _stop_all(self, attempt: Attempt, reason: str) -> None:
        attempt.stop_reason = attempt.stop_reason or reason
        for w in self.store.list_workers(attempt.job_id):
            if w.state == WORKER_RUNNING:
                self._tell_to_leave(attempt, w, reason)
        self._count_workers(attempt.job_id)

    def _tell_to_leave(self, attempt: Attempt, w: WorkerRecord, reason: str) -> None:
        """A graceful notice (SIGTERM); SIGKILL follows after the grace period."""
        if attempt.host is not None:
            attempt.host.coordinator.note_request(w.id)
        self.store.update_worker(w.id, state=WORKER_LEAVING, leave_reason=reason,
                                 leave_at=self.clock())
        try:
            self.executor.signal(w.id, "TERM")
        except ExecutorError:
            pass  # already gone; its exit is on its way

    def _enforce_deadlines(self, now: float) -> None:
        for w in self.store.list_workers(active=True):
            if w.state == WORKER_LEAVING and now - (w.leave_at or now) > self.config.grace_seconds:
                try:
                    self.executor.signal(w.id, "KILL")
                except ExecutorError:
                    pass
        for attempt in list(self.attempts.values()):
            job = self.store.get_job(attempt.job_id)
            if (job.timeout_seconds and attempt.timed_out is None
                    and now - attempt.started_at > job.timeout_seconds):
                attempt.timed_out = job.timeout_seconds
                self._stop_all(attempt, f"timeout after {job.timeout_seconds:g}s")

    # ---- exits and attempts ----------------------------------------------------------------------

    def _on_exit(self, exit_: WorkerExit, now: float) -> None:
        if exit_.ended_at is not None:
            now = min(now, exit_.ended_at)  # it may have ended while no service watched
        workers = {w.id: w for w in self.store.list_workers(active=True)}
        w = workers.get(exit_.worker_id)
        if w is None:
            return
        code = exit_.exit_code if exit_.exit_code is not None else (
            -exit_.signal if exit_.signal else None)
        self.store.update_worker(w.id, state=WORKER_EXITED, exit_code=code, stopped_at=now)
        if w.id in self._logs:
            self._logs[w.id].exited = True
        attempt = self.attempts.get(w.job_id)
        seconds = max(0.0, now - w.started_at)
        wasted = min(seconds, attempt.wasted.pop(w.id, 0.0)) if attempt else 0.0
        if seconds - wasted > 0:
            self.store.record_usage(w.job_id, w.attempt_no, w.compute_environment,
                                    w.capacity_type, seconds - wasted, w.price_per_slot_hour)
        if wasted > 0:
            self.store.record_usage(w.job_id, w.attempt_no, w.compute_environment,
                                    w.capacity_type, wasted, w.price_per_slot_hour, wasted=True)
        if attempt is None:
            return
        attempt.last_exit = exit_
        coordinator = attempt.host.coordinator if attempt.host is not None else None
        if coordinator is not None and (
                (w.state == WORKER_RUNNING and code != 0) or coordinator.awaits(w.id)):
            coordinator.mark_dead(w.id, f"exit code {code}")
        self._count_workers(w.job_id)

    def _tick_attempt(self, attempt: Attempt, now: float) -> None:
        job_id = attempt.job_id
        active = [w for w in self.store.list_workers(job_id)]
        if attempt.host is not None:
            host = attempt.host
            phase = host.tick()
            self._price_crashes(attempt)
            if host.coordinator.current is not None:
                self.store.transition(job_id, JobStatus.STARTING, JobStatus.RUNNING,
                                      f"generation {host.coordinator.current.number} running")
            if phase is Phase.DONE and attempt.stop_reason is None:
                attempt.stop_reason = "finished"  # its workers exit on their own; no growth
            if phase is Phase.FAILED and attempt.stop_reason is None:
                self._stop_all(attempt, host.coordinator.failure or "the job failed")
            if (phase is Phase.WAITING and not active and attempt.stop_reason is None):
                self._stop_all(attempt, "every worker is gone")
        if active:
            return
        self._finish_attempt(attempt, now)

    def _price_crashes(self, attempt: Attempt) -> None:
        """A crash throws away the interrupted step of every member of the old world."""
        events = attempt.host.sink.events
        for record in events[attempt.priced_events:]:
            if record["event"] == "crash":
                metrics = attempt.host.sink.last_metrics or {}
                rate = metrics.get("samples_per_s") or 0
                step_s = (attempt.host.coordinator.job_config.get("global_batch", 0) / rate
                          if rate else 0.0)
                for w in self.store.list_workers(attempt.job_id):
                    attempt.wasted[w.id] = attempt.wasted.get(w.id, 0.0) + step_s * (
                        1 + record.get("steps_redone", 0))
        attempt.priced_events = len(events)

    def _finish_attempt(self, attempt: Attempt, now: float) -> None:
        if attempt.last_exit is not None and attempt.last_exit.ended_at is not None:
            now = min(now, attempt.last_exit.ended_at)
        job = self.store.get_job(attempt.job_id)
        del self.attempts[attempt.job_id]
        exit_ = attempt.last_exit
        code = exit_.exit_code if exit_ else None
        reason = attempt.stop_reason or (exit_.reason if exit_ else "")
        if attempt.host is not None:
            phase = attempt.host.coordinator.phase
            attempt.host.close()
            code = 0 if phase is Phase.DONE else (code if code not in (0, None) else 1)
            if phase is Phase.FAILED:
                reason = attempt.host.coordinator.failure or reason
        if attempt.terminated:
            self.store.finish_attempt(job.id, attempt.number, code, "terminated by user", now)
            self.store.update_job(job.id, status=JobStatus.FAILED,
                                  status_reason="terminated by user", stopped_at=now,
                                  exit_code=code, current_workers=0)
            return
        outcome = lifecycle.after_attempt(job.id, code, reason, attempt.preempted,
                                          job.retry_strategy, job.attempts,
                                          timed_out_after=attempt.timed_out)
        self.store.finish_attempt(job.id, attempt.number, code, outcome.reason, now)
        changes = dict(status=outcome.status, status_reason=outcome.reason,
                       attempts=outcome.attempts_used, current_workers=0, exit_code=code)
        if not outcome.counted:
            changes["preemptions"] = job.preemptions + 1
        if outcome.status.is_terminal():
            changes["stopped_at"] = now
        self.store.update_job(job.id, **changes)
        self.store.add_event(job.id, "attempt", {"attempt": attempt.number, "exit_code": code,
                                                 "status": outcome.status.value,
                                                 "reason": outcome.reason})

    # ---- dependencies and arrays -----------------------------------------------------------------

    def _resolve_waiting(self) -> None:
        waiting = self.store.list_jobs(status=list(WAITING), limit=10_000_000)
        if not waiting:
            return
        parents = {}
        cache: dict[str, object] = {}

        def status_of(job_id: str):
            if job_id not in cache:
                try:
                    dep = self.store.get_job(job_id)
                except Exception:
                    cache[job_id] = None
                else:
                    cache[job_id] = (self.store.child_statuses(job_id) if dep.is_array_parent
                                     else dep.status)
            return cache[job_id]

        for job in waiting:
            if job.is_array_parent:
                continue
            deps = job.depends_on
            if job.array_parent_id is not None:
                if job.array_parent_id not in parents:
                    parents[job.array_parent_id] = self.store.get_job(job.array_parent_id)
                deps = tuple(
                    type(d)(job.array_parent_id if d.job_id in ("", job.array_parent_id)
                            else d.job_id, d.type)
                    for d in parents[job.array_parent_id].depends_on)
            statuses = {d.job_id: status_of(d.job_id) for d in deps}
            statuses = {k: v for k, v in statuses.items() if v is not None}
            move = lifecycle.resolve_dependencies(
                lifecycle.DependentJob(job.id, deps, job.array_index), statuses)
            if move.status is not job.status or move.reason != job.status_reason:
                extra = {"stopped_at": self.clock()} if move.status.is_terminal() else {}
                self.store.transition(job.id, job.status, move.status, move.reason, **extra)

    def _update_array_parents(self) -> None:
        parents = self.store.list_jobs(status=[JobStatus.SUBMITTED, JobStatus.PENDING,
                                               JobStatus.RUNNABLE, JobStatus.RUNNING],
                                       top_level=True, limit=10_000_000)
        for parent in parents:
            if not parent.is_array_parent:
                continue
            status = lifecycle.array_parent_status(self.store.child_statuses(parent.id))
            if status is not parent.status:
                extra = {"stopped_at": self.clock()} if status.is_terminal() else {}
                if status is JobStatus.RUNNING and parent.started_at is None:
                    extra["started_at"] = self.clock()
                self.store.transition(parent.id, parent.status, status,
                                      f"children: {status.value.lower()}", **extra)

    # ---- logs ------------------------------------------------------------------------------------

    def _pump_logs(self) -> None:
        """Copy complete new lines of each live worker's log file into the store."""
        for worker_id, tail in list(self._logs.items()):
            try:
                with open(tail.path, "rb") as f:
                    f.seek(tail.offset)
                    data = f.read()
            except OSError:
                data = b""
            complete = data[: data.rfind(b"\n") + 1]
            if complete:
                tail.offset += len(complete)
                lines = [x.decode(errors="replace") for x in complete[:-1].split(b"\n")]
                self.store.append_log(tail.job_id, tail.attempt_no, worker_id, lines)
            if tail.exited and len(complete) == len(data):
                del self._logs[worker_id]


def _after_lines(path: Path, n: int) -> int:
    """The byte offset just past the first ``n`` lines of a log file (its size if shorter)."""
    offset = 0
    try:
        with open(path, "rb") as f:
            for _ in range(n):
                line = f.readline()
                if not line.endswith(b"\n"):
                    break
                offset += len(line)
    except OSError:
        pass
    return offset


def _worker_id(job_id: str, attempt: int, index: int) -> str:
    return f"{job_id.replace(':', '_')}-a{attempt}-w{index}"


@dataclass
class _LogTail:
    path: Path
    job_id: str
    attempt_no: int
    offset: int = 0
    exited: bool = False
