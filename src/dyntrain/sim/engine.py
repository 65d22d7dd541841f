"""The simulator: capacity and job traces through the service's real scheduler, on a simulated
clock.

Every pass builds the scheduler's ``Snapshot`` as the service's controller does and asks
``schedule(snapshot, policy)`` (``dyntrain.service.core.scheduler``) for a ``Plan``; the simulator
only plays the plan out. Nothing of the scheduling rules is copied here. What the simulator adds is
the world the controller would observe:

* **capacity**: each environment's slots (and price) follow its trace; a worker told to leave
  holds its slot for ``leave_s`` (the controller counts it as leaving, as here);
* **workers**: a started worker trains after ``start_s`` (the job's); workers that become ready
  together join together, and each change of a running group pauses the job for its
  ``reform_s``; a suspended job keeps its progress (it checkpointed) and starts again later;
* **progress**: between two events a job trains at ``model.throughput(w)`` samples/s, ``w`` its
  formed group; it ends when its ``samples`` are done;
* **what the policy knows**: with ``learn`` (the default) a job's ``JobProfile`` holds only the
  throughputs at world sizes it has trained at, fitted as the service's ``SpeedupTracker``
  would (without the job's chunk count, which the service does not know; a job not yet
  measured has none), its re-formation cost once it has re-formed, and the work it has left.

Time jumps from event to event (an arrival, a capacity change, a worker ready, a pause ending,
a job ending, a slot released) and a pass runs at each, and at least every ``pass_every_s``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from dyntrain.service.core.allocation import AllocationPolicy
from dyntrain.service.core.capacity import CapacityTrace
from dyntrain.service.core.fairshare import ShareUsage
from dyntrain.service.core.model import CapacityType, JobStatus, Resources, ValidationError
from dyntrain.service.core.plan import EnvView, JobView, Plan, QueueView, Snapshot
from dyntrain.service.core.scheduler import schedule
from dyntrain.service.core.speedup import JobProfile, ThroughputPoint, fit_speedup
from dyntrain.sim.jobs import JobSpec, JobTrace
from dyntrain.sim.results import JobRecord, SimResult

SECONDS_PER_HOUR = 3600.0
_DONE = 1e-9  # relative work left at which a job counts as done (float sums)


@dataclass(frozen=True)
class EnvSpec:
    """A simulated compute environment: its slots over time and their price per slot-hour
    (``price`` where the trace has none)."""

    name: str
    trace: CapacityTrace
    capacity_type: CapacityType = CapacityType.SPOT
    price: float = 0.0

    def price_at(self, t: float) -> float:
        price = self.trace.at(t).price
        return self.price if price is None else price


@dataclass(frozen=True)
class SimConfig:
    """How the simulation runs.

    Args:
        pass_every_s: the longest time between two passes.
        until_s: the simulation stops here (jobs not done are reported unfinished); None: a
            generous bound from the traces (the last arrival plus 100 periods of the longest).
        learn: the policy sees only what the service would have measured (module doc); False:
            every job's true curve at every size (an oracle).
        leave_s: seconds a worker told to leave keeps its slot; None: its job's ``reform_s``.
        record: keep the timeline (for plots).
    """

    pass_every_s: float = 300.0
    until_s: float | None = None
    learn: bool = True
    leave_s: float | None = None
    record: bool = False


class _Job:
    """A job's simulated state."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.status = JobStatus.SUBMITTED  # SUBMITTED (not arrived), RUNNABLE, RUNNING, done
        self.done = 0.0
        self.workers: dict[str, list[float]] = {}  # env -> ready times, in start order
        self.formed = 0  # the group that trains (0: none formed yet)
        self.paused_until = 0.0
        self.record = JobRecord(spec.id, spec.arrival_s, spec.samples)
        self.seen: set[int] = set()
        self.fitted: tuple | None = None  # (sizes, model, points) the profile was fitted on

    def held(self) -> int:
        return sum(len(v) for v in self.workers.values())

    def ready(self, t: float) -> int:
        return sum(1 for v in self.workers.values() for r in v if r <= t)

    def left(self) -> float:
        return self.spec.samples - self.done

    def training(self, t: float) -> bool:
        return self.status is JobStatus.RUNNING and self.formed > 0 and t >= self.paused_until


class Simulation:
    """One policy over one capacity set and one job trace (module doc).

    Args:
        envs: the compute environments, in the queues' order.
        jobs: the job trace.
        policy: the allocation policy the scheduler is given.
        config: how to run.
        name: the policy's name in the results (default: ``policy.name``).
    """

    def __init__(self, envs: list[EnvSpec], jobs: JobTrace, policy: AllocationPolicy,
                 config: SimConfig | None = None, name: str | None = None) -> None:
        if not envs:
            raise ValidationError("a simulation needs at least one capacity trace")
        self.envs, self.trace, self.policy = list(envs), jobs, policy
        self.config = config or SimConfig()
        self.name = name or policy.name
        most = sum(e.trace.max_slots for e in self.envs)
        for spec in jobs.jobs:
            if spec.min_workers > most:
                raise ValidationError(f"job {spec.id} needs {spec.min_workers} workers at once "
                                      f"but the capacity never exceeds {most} slots")
        self.jobs = [_Job(s) for s in sorted(jobs.jobs, key=lambda s: (s.arrival_s, s.id))]
        self.by_id = {j.spec.id: j for j in self.jobs}
        self.active: list[_Job] = []  # arrived and not done, in arrival order
        self.queues = tuple(QueueView(q.name, q.priority, tuple(e.name for e in self.envs),
                                      fairshare=q.fairshare) for q in jobs.queues)
        self.windows = {q.name: q.fairshare.window_s for q in jobs.queues if q.fairshare}
        self.share_usage = ShareUsage()
        self.leaving: dict[str, list[tuple[float, _Job]]] = defaultdict(list)
        self.timeline: list = []
        self.cost = self.used = self.available = 0.0
        self.passes = 0
        self._arrived = 0

    # ---- the loop --------------------------------------------------------------------------------

    def run(self) -> SimResult:
        started = time.perf_counter()
        t = self.jobs[0].spec.arrival_s if self.jobs else 0.0
        until = self._until()
        while True:
            self._events(t)
            if (not self.active and self._arrived == len(self.jobs)) or t >= until:
                break
            self._apply(schedule(self._snapshot(t), self.policy), t)
            self._reclaim(t)
            self._form(t)
            self.passes += 1
            if self.config.record:
                self.timeline.append((t, {e.name: e.trace.at(t).slots for e in self.envs},
                                      {j.spec.id: j.held() for j in self.active if j.held()}))
            nxt = min(self._next_event(t), until)
            self._advance(t, nxt)
            t = nxt
        return SimResult(self.name, [j.record for j in self.jobs], self.cost, self.used,
                         self.available, self.passes, t, time.perf_counter() - started,
                         self.timeline)

    def _until(self) -> float:
        if self.config.until_s is not None:
            return self.config.until_s
        period = max(max(e.trace.duration for e in self.envs), 3600.0)
        return max(j.spec.arrival_s for j in self.jobs) + 100 * period if self.jobs else 0.0

    def _events(self, t: float) -> None:
        """Arrivals, jobs done, slots released and groups formed at ``t``."""
        while self._arrived < len(self.jobs) and self.jobs[self._arrived].spec.arrival_s <= t:
            self.jobs[self._arrived].status = JobStatus.RUNNABLE
            self.active.append(self.jobs[self._arrived])
            self._arrived += 1
        for job in self.active:
            if job.status is JobStatus.RUNNING and job.left() <= _DONE * job.spec.samples:
                job.status = JobStatus.SUCCEEDED
                job.record.finished_s = t
                job.workers, job.formed = {}, 0  # its workers exit: their slots free at once
        self.active = [j for j in self.active if j.status is not JobStatus.SUCCEEDED]
        for env in self.leaving:
            self.leaving[env] = [(at, j) for at, j in self.leaving[env] if at > t]
        self._form(t)

    def _form(self, t: float) -> None:
        """Workers ready at ``t`` join their job's group (one re-formation per batch)."""
        for job in self.active:
            if job.status is not JobStatus.RUNNING:
                continue
            ready = job.ready(t)
            if ready > job.formed:
                if job.formed > 0:  # a running group re-forms with the joiners
                    job.paused_until = max(job.paused_until, t + job.spec.reform_s)
                    job.record.reformations += 1
                job.formed = ready
                job.seen.add(ready)

    def _next_event(self, t: float) -> float:
        times = [t + self.config.pass_every_s]
        if self._arrived < len(self.jobs):
            times.append(self.jobs[self._arrived].spec.arrival_s)
        for env in self.envs:
            change = env.trace.next_change_after(t)
            if change is not None:
                times.append(change)
        times += [at for rows in self.leaving.values() for at, _ in rows]
        for job in self.active:
            if job.status is not JobStatus.RUNNING:
                continue
            times += [r for v in job.workers.values() for r in v if r > t]
            if job.paused_until > t:
                times.append(job.paused_until)
            elif job.formed > 0:
                times.append(t + job.left() / job.spec.model.throughput(job.formed))
        return max(t + 1e-6, min(x for x in times if x > t))

    def _advance(self, t0: float, t1: float) -> None:
        """Progress, cost and slot use over ``[t0, t1)``, where nothing changes."""
        dt = t1 - t0
        price = {e.name: e.price_at(t0) for e in self.envs}
        self.available += sum(e.trace.at(t0).slots for e in self.envs) * dt
        for env, rows in self.leaving.items():
            for _, job in rows:
                self._charge(job, price[env], dt, 1)
        for job in self.active:
            for env, ready in job.workers.items():
                if ready:
                    self._charge(job, price[env], dt, len(ready))
            if job.training(t0):
                job.done = min(job.spec.samples,
                               job.done + job.spec.model.throughput(job.formed) * dt)
                job.record.sizes[job.formed] = job.record.sizes.get(job.formed, 0.0) + dt

    def _charge(self, job: _Job, price: float, dt: float, workers: int) -> None:
        money = workers * price * dt / SECONDS_PER_HOUR
        job.record.cost += money
        job.record.worker_seconds += workers * dt
        self.cost += money
        self.used += workers * dt

    # ---- the scheduler's view and its plan -------------------------------------------------------

    def _snapshot(self, t: float) -> Snapshot:
        in_use: dict[str, int] = defaultdict(int)
        for job in self.active:
            for env, ready in job.workers.items():
                in_use[env] += len(ready)
        envs = []
        for e in self.envs:
            have, leaving = e.trace.at(t).slots, len(self.leaving.get(e.name, ()))
            usable = max(0, have - leaving, min(have, in_use[e.name]))  # as the controller
            envs.append(EnvView(e.name, e.capacity_type, e.price_at(t), Resources(), usable))
        views = []
        for job in self.active:
            spec = job.spec
            lo, hi = (spec.min_workers, spec.max_workers) if spec.elastic else \
                (spec.max_workers, spec.max_workers)
            if job.status is JobStatus.RUNNABLE:
                views.append(JobView(spec.id, spec.queue, spec.arrival_s, Resources(), lo, hi,
                                     JobStatus.RUNNABLE, preemptible=spec.elastic,
                                     share=spec.share,
                                     scheduling_priority=spec.scheduling_priority))
            elif job.status is JobStatus.RUNNING:
                status = JobStatus.RUNNING if job.formed else JobStatus.STARTING
                views.append(JobView(spec.id, spec.queue, spec.arrival_s, Resources(), lo, hi,
                                     status, {k: len(v) for k, v in job.workers.items() if v},
                                     spec.elastic, self._profile(job), spec.share,
                                     spec.scheduling_priority))
        return Snapshot(tuple(envs), self.queues, tuple(views), share_usage=self._usage(t))

    def _usage(self, t: float) -> dict[str, float]:
        """Each share's slots, decayed over its queue's window (as the controller keeps it)."""
        if not self.windows:
            return {}
        held: dict[str, int] = defaultdict(int)
        window: dict[str, float] = {}
        for job in self.active:
            if job.spec.share is not None and job.spec.queue in self.windows:
                held[job.spec.share] += job.held()
                window[job.spec.share] = self.windows[job.spec.queue]
        return self.share_usage.update(t, held, window)

    def _profile(self, job: _Job) -> JobProfile | None:
        model = job.spec.model
        sizes = frozenset(job.seen) if self.config.learn else \
            frozenset(range(1, job.spec.max_workers + 1))
        if not sizes:
            return None
        if job.fitted is None or job.fitted[0] != sizes:
            points = tuple(ThroughputPoint(w, model.throughput(w)) for w in sorted(sizes))
            # as the service's tracker: it does not know a job's chunks per step
            job.fitted = (sizes, fit_speedup(points) if self.config.learn else model, points)
        reform = job.spec.reform_s if job.record.reformations else None
        return JobProfile(job.fitted[1], job.fitted[2], reform, job.left())

    def _apply(self, plan: Plan, t: float) -> None:
        for shrink in plan.shrinks:
            self._take(self.by_id[shrink.job], shrink.env, shrink.count, t)
        for suspend in plan.suspends:
            job = self.by_id[suspend.job]
            for env, ready in job.workers.items():
                self._leave(job, env, len(ready), t)
            job.status, job.workers, job.formed = JobStatus.RUNNABLE, {}, 0
            job.record.suspensions += 1
        for start in plan.starts:
            job = self.by_id[start.job]
            job.status, job.formed = JobStatus.RUNNING, 0
            job.workers = {env: [t + job.spec.start_s] * n for env, n in start.placement.items()}
            if job.record.started_s is None:
                job.record.started_s = t
        for grow in plan.grows:
            job = self.by_id[grow.job]
            job.workers.setdefault(grow.env, []).extend([t + job.spec.start_s] * grow.count)

    def _leave(self, job: _Job, env: str, count: int, t: float) -> None:
        """The newest ``count`` workers of ``job`` on ``env`` leave; their slots stay taken
        for ``leave_s``."""
        ready = job.workers.get(env, [])
        gone, job.workers[env] = ready[len(ready) - count:], ready[:len(ready) - count]
        hold = self.config.leave_s if self.config.leave_s is not None else job.spec.reform_s
        self.leaving[env] += [(t + hold, job)] * len(gone)

    def _reclaim(self, t: float) -> None:
        """A worker told to leave keeps its slot only while the environment still has it: when
        the capacity takes slots back, the workers leaving on them are gone with them (the
        newest first), so that no more slots are held than exist."""
        for e in self.envs:
            rows = self.leaving.get(e.name)
            if not rows:
                continue
            running = sum(len(j.workers.get(e.name, ())) for j in self.active)
            room = max(0, e.trace.at(t).slots - running)
            if len(rows) > room:
                del rows[room:]

    def _take(self, job: _Job, env: str, count: int, t: float) -> None:
        """Shrink: ``_leave``, and the group re-forms without them."""
        self._leave(job, env, count, t)
        now_ready = job.ready(t)
        if now_ready < job.formed:
            job.formed = now_ready
            if now_ready > 0 and job.status is JobStatus.RUNNING:
                job.paused_until = max(job.paused_until, t + job.spec.reform_s)
                job.record.reformations += 1
                job.seen.add(now_ready)


def run_simulation(envs: list[EnvSpec], jobs: JobTrace, policy: AllocationPolicy,
                   config: SimConfig | None = None, name: str | None = None) -> SimResult:
    """``Simulation(...).run()``."""
    return Simulation(envs, jobs, policy, config, name).run()

