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

The controller owns its collaborators, each built with what it needs and holding its own state:
the ``Launcher`` (claims and starts), the ``Settler`` (exits and attempt ends, each one's
``Ending``), the ``Stopper`` (notices and deadlines), ``Recovery``, the ``LogPump`` and the
``AttemptTable``; the pure scheduler is handed a ``Snapshot`` and returns a ``Plan``.

Work grows with what changed, not with the queue: the index keeps each queue sorted and the
attempts keep their workers in memory, and the database writes of a phase share one transaction
(``Store.batch``). A job's start is claimed (RUNNABLE -> STARTING, a compare-and-set; attempt
and worker records) and committed before any worker starts, so even two controllers over one
database never start a job twice, and a restarted service knows every worker that may run.
Preemptions (shrink, suspend, capacity taken back) never count against a job's retry attempts; a
command that cannot be executed is a failed attempt (``CannotStartContainerError``). A start the
executor refuses for want of room is neither: the claim is taken back and the job waits RUNNABLE
with the executor's reason, held until the executor has more room (``core/placement.py``); so is
a running job's growth.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from dyntrain.elastic.runs.storage import RunStore
from dyntrain.service.core.capacity import parse_trace
from dyntrain.service.core.executor import Executor, ExecutorError, WorkerExit
from dyntrain.service.core.fairshare import ShareUsage
from dyntrain.service.core.lifecycle import Ending, EndKind
from dyntrain.service.core.model import JobStatus, WorkerState
from dyntrain.service.core.placement import still_held
from dyntrain.service.core.plan import EnvView, JobView, Plan, QueueView, Snapshot
from dyntrain.service.core.records import ComputeEnvironment, Job
from dyntrain.service.core.scheduler import schedule
from dyntrain.service.core.torchrun import restart_for_resize
from dyntrain.service.engine.attempts import AttemptTable, terminating
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.jobindex import WAITING, JobIndex, job_view
from dyntrain.service.engine.launching import Launcher
from dyntrain.service.engine.logtail import LogPump
from dyntrain.service.engine.recovery import Recovery
from dyntrain.service.engine.runfolders import ElasticHosts, RunFolders
from dyntrain.service.engine.settling import Settler
from dyntrain.service.engine.stopping import Stopper
from dyntrain.service.store import Store


class Controller:
    """One service's loop over a store and an executor.

    Args:
        store: the jobs and everything about them.
        executor: where the workers run.
        config: the run folders' root (``state_dir``), bounds and timings.
        clock: epoch seconds (tests may pass their own).
    """

    def __init__(self, store: Store, executor: Executor, config: ControllerConfig,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.executor, self.config, self.clock = store, executor, config, clock
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.folders = RunFolders(config.state_dir)
        self.attempts = AttemptTable()
        self.share_usage = ShareUsage()  # fair-share queues' shares, decayed slot use
        self.index = JobIndex(store)
        self.logs = LogPump(store)
        hosts = ElasticHosts(store, self.folders, executor, config)
        self.stopper = Stopper(store, executor, clock, config)
        self.launcher = Launcher(
            store=store, executor=executor, index=self.index, attempts=self.attempts,
            logs=self.logs, folders=self.folders, hosts=hosts, stopper=self.stopper,
            clock=clock, config=config)
        self.settler = Settler(store=store, executor=executor, attempts=self.attempts,
                               logs=self.logs, folders=self.folders, stopper=self.stopper)
        self.recovery = Recovery(
            store=store, executor=executor, attempts=self.attempts, logs=self.logs,
            folders=self.folders, hosts=hosts, clock=clock, config=config)
        self.plan = Plan()
        # called with each scheduling pass's duration in seconds (the dashboard's /metrics)
        self.pass_observers: list[Callable[[float], None]] = []
        self._last_schedule = 0.0
        self._changed = True  # something happened that the scheduler has not seen yet
        self._early_exits: list[WorkerExit] = []  # polled before a step could handle them
        # False in a service replica that does not lead: it runs no step, and hands the
        # terminations it is asked for to the leader (through the store)
        self.leading = True

    @property
    def waiting(self):
        """Job id -> why it waits (``WaitInfo``), as of the last scheduling pass."""
        return self.plan.waiting

    def run_dir(self, job_id: str) -> Path:
        return self.folders.run_dir(job_id)

    def log_path(self, job_id: str, worker_id: str) -> Path:
        return self.folders.log_path(job_id, worker_id)

    def run_store(self, job: Job) -> RunStore:
        """Where a job's training files go (``RunFolders.run_store``)."""
        return self.folders.run_store(job)

    # ---- lifecycle -------------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """After a (re)start: pick up the attempts a previous service left running
        (``Recovery.recover``); returns one line per job touched."""
        recovered = self.recovery.recover()
        self._early_exits += recovered.exits
        return recovered.notes

    def run(self, stop) -> None:
        """Loop until ``stop()`` is true."""
        while not stop():
            self.step()
            self.executor.wait(self.config.tick_seconds)

    def step(self) -> None:
        now = self.clock()
        if self.index.refresh(self.config.new_jobs_per_step):
            self._changed = True
        self.launcher.record_launches()
        exits = self._early_exits + self.executor.poll()
        # exits of workers whose attempt is not recorded yet (a multi-node one half answered)
        launching = self.launcher.launching_workers()
        self._early_exits = [e for e in exits if e.worker_id in launching]
        settled = self.settler.settle([e for e in exits if e.worker_id not in launching], now)
        for job, status, view in settled.moves:
            self.index.moved(job.id, job.array_parent_id, job.status, status, view)
        self._changed = self._changed or settled.changed
        if self._changed or now - self._last_schedule >= self.config.schedule_every:
            self._last_schedule, self._changed = now, False
            started = time.perf_counter()
            if self.config.replicated:  # handed over by replicas that do not lead
                for job_id, reason in self.store.leases.take_terminations():
                    self.terminate(job_id, reason)
            self._resolve_waiting()
            self._update_array_parents()
            if self.launcher.refusals:  # offered again once the executor has more room
                self.launcher.refusals = still_held(self.launcher.refusals,
                                                    self.executor.free(), now)
            envs = self.store.environments.list_compute_environments()
            self._apply(schedule(self.snapshot(now, envs), self.config.policy),
                        {ce.name: ce for ce in envs})
            seconds = time.perf_counter() - started
            for observe in self.pass_observers:
                observe(seconds)
        self.stopper.enforce_deadlines(self.attempts.values(), now)
        self.logs.pump()

    # ---- user requests ---------------------------------------------------------------------------

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> bool:
        """Cancel a job that has not started (AWS Batch: cancel); False if it already runs.

        For an array job, every child that has not started is cancelled with one statement per
        status; children already running go on (``terminate`` stops them).
        """
        job = self.store.jobs.get_job(job_id)
        done = False
        now = self.clock()
        self.launcher.refusals.pop(job_id, None)  # no longer waits for room
        if job.is_array_parent:
            moved = []
            for status in (*WAITING, JobStatus.RUNNABLE):
                moved += [(i, status) for i in self.store.scheduling.transition_children(
                    job_id, status, JobStatus.FAILED, reason, stopped_at=now)]
            self.index.drop_children(job_id, moved, JobStatus.FAILED)
            done = bool(moved)
        for status in (*WAITING, JobStatus.RUNNABLE):
            if self.store.jobs.transition(job_id, status, JobStatus.FAILED, reason, stopped_at=now):
                self.index.moved(job_id, job.array_parent_id, status, JobStatus.FAILED)
                done = True
                break
        self._changed = True
        return done

    def terminate(self, job_id: str, reason: str = "terminated by user") -> None:
        """Stop a job whatever its state (AWS Batch: terminate); it ends FAILED, not retried.
        Running workers get their notice now and end in the background."""
        self.cancel(job_id, reason)
        if not self.leading:  # its workers are the leader's
            self.store.leases.request_termination(job_id, reason)
            return
        for attempt in self.attempts.values():
            if attempt.job_id == job_id or attempt.job.array_parent_id == job_id:
                attempt.claim(Ending(EndKind.TERMINATED, reason=reason))
                self.stopper.stop_all(attempt, reason)
                # until its workers are gone it stays RUNNING: say that it is on its way out
                if attempt.host is not None:
                    attempt.host.mark_stopping()  # membership news no longer says why
                self.store.jobs.update_job(attempt.job_id, status_reason=terminating(reason))

    # ---- capacity and the scheduler --------------------------------------------------------------

    def available_slots(self, now: float) -> dict[str, int]:
        return self._available(now, self.store.environments.list_compute_environments())

    def _available(self, now: float, envs: Sequence[ComputeEnvironment]) -> dict[str, int]:
        traces = self.store.environments.capacity_traces()
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

    def snapshot(self, now: float, ces: Sequence[ComputeEnvironment] | None = None) -> Snapshot:
        """What the scheduler sees now: ``ces`` (default: the store's compute environments)
        with the slots each offers, the queues, the running attempts and the queued jobs."""
        if ces is None:
            ces = self.store.environments.list_compute_environments()
        slots = self._available(now, ces)
        running: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        leaving: dict[str, int] = defaultdict(int)
        in_use: dict[str, int] = defaultdict(int)
        for attempt in self.attempts.values():
            for w in attempt.workers.values():
                if w.state == WorkerState.RUNNING:
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
        job_queues = self.store.environments.list_job_queues()
        policies = ({p.name: p.fairshare for p in self.store.policies.list()}
                    if any(q.spec.scheduling_policy for q in job_queues) else {})
        queues = tuple(QueueView(q.name, q.spec.priority, q.spec.compute_environments,
                                 q.spec.state, policies.get(q.spec.scheduling_policy or ""),
                                 q.spec.preempt_plain_jobs)
                       for q in job_queues)
        active = []
        for attempt in self.attempts.values():
            job = attempt.job
            if attempt.stop_reason:
                continue  # stopping: its slots free up as its workers exit
            lo, hi = job.workers_range
            if job.elastic is None:  # a plain or multi-node job never grows back
                lo = hi = max(1, sum(running.get(job.id, {}).values()))
            status = JobStatus.RUNNING if attempt.workers else JobStatus.STARTING
            profile = (attempt.host.speedup_profile() if attempt.host is not None
                       and self.config.policy.reallocates else None)
            active.append(JobView(job.id, job.queue, job.created_at, job.resources, lo, hi,
                                  status, dict(running.get(job.id, {})),
                                  preemptible=job.elastic is not None, profile=profile,
                                  share=job.share, scheduling_priority=job.scheduling_priority))
        held = {job: r.reason for job, r in self.launcher.refusals.items()}
        usage = self._share_usage(now, queues, active) if policies else {}
        return Snapshot(envs, queues, tuple(active), self.index.queues(), held, usage)

    def _share_usage(self, now: float, queues: Sequence[QueueView],
                     active: Sequence[JobView]) -> dict[str, float]:
        """Advance each fair-share queue's shares' decayed slot use to ``now``."""
        windows = {q.name: q.fairshare.window_s for q in queues if q.fairshare is not None}
        held: dict[str, int] = defaultdict(int)
        window: dict[str, float] = {}
        for job in active:
            if job.share is not None and job.queue in windows:
                held[job.share] += sum(job.placement.values())
                window[job.share] = windows[job.queue]
        return self.share_usage.update(now, held, window)

    def _apply(self, plan: Plan, envs: dict[str, ComputeEnvironment]) -> None:
        """Carry out a pass's decisions; ``envs``: the compute environments it saw, by name."""
        self.plan = plan
        restarted = self._restart_resized(plan)
        for shrink in plan.shrinks:
            attempt = self.attempts.get(shrink.job)
            if attempt is not None and shrink.job not in restarted:
                self.stopper.shrink(attempt, shrink.env, shrink.count, shrink.reason)
        for suspend in plan.suspends:
            attempt = self.attempts.get(suspend.job)
            if attempt is not None:
                attempt.claim(Ending(EndKind.PREEMPTED))
                self.stopper.stop_all(attempt, f"suspended: {suspend.reason}")
        starts = plan.starts[:self.config.starts_per_step]
        if len(starts) < len(plan.starts):
            self._changed = True  # the rest start in the next step
        if starts:
            self.launcher.start(starts, envs)
        for grow in plan.grows:
            attempt = self.attempts.get(grow.job)
            if (attempt is not None and attempt.stop_reason is None and grow.job not in restarted
                    and grow.job not in self.launcher.refusals
                    and all(w.handle is not None for w in attempt.workers.values())):
                # (a start still unanswered: the grow waits for a later pass, or the pending
                # worker would be started a second time)
                try:
                    self.launcher.grow(attempt, {grow.env: grow.count}, envs)
                except ExecutorError as exc:  # the job goes on with the workers it has
                    self.store.logs.add_event(grow.job, "grow.failed", {"error": str(exc)})

    def _restart_resized(self, plan: Plan) -> set[str]:
        """Stop each torchrun gang the plan resizes (SIGTERM, the grace period, SIGKILL): it is
        queued again once its workers are gone, and the next pass starts it at the size it
        admits. Returns the torchrun jobs the plan named: their grows and shrinks are not
        carried out one worker at a time."""
        change: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for grow in plan.grows:
            change[grow.job][0] += grow.count
        for shrink in plan.shrinks:
            change[shrink.job][1] += shrink.count
        restarted = set()
        for job_id, (grown, shrunk) in change.items():
            attempt = self.attempts.get(job_id)
            if attempt is None or not attempt.job.torchrun:
                continue
            restarted.add(job_id)
            if attempt.stop_reason:
                continue  # already stopping
            reason = restart_for_resize(len(attempt.running()), grown, shrunk)
            if reason is not None:
                attempt.claim(Ending(EndKind.RESTARTED))
                self.stopper.stop_all(attempt, reason)
                self.store.jobs.update_job(job_id, status_reason=f"{reason}: its workers were "
                                                            "told to stop")
        return restarted

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
            moved = set(
                self.store.scheduling.transition_many(
                    [e.id for e in entries], old, new, reason, **extra
                )
            )
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
            if self.store.jobs.transition(parent_id, parent.status, status,
                                     f"children: {status.value.lower()}", **extra):
                self.index.parents[parent_id] = dataclasses.replace(parent, status=status)
                self.index.moved(parent_id, None, parent.status, status)
