"""The scheduling policy of the job service: an observed snapshot in, a plan of decisions out.

``schedule(snapshot)`` is pure. It reads frozen views of the compute environments, job queues and
jobs and returns a ``Plan``: ``Start``, ``Grow``, ``Shrink`` and ``Suspend`` decisions and, for
every queued job that does not start, why it waits (those values are in ``plan.py``). It starts,
signals and writes nothing; the controller applies the plan and asks again with the next
snapshot.

The model: an environment has ``available_slots`` slots of one size right now (for spot capacity
this follows what the provider grants). A worker takes one whole slot and fits when its resources
fit the slot. A job runs with ``min_workers`` to ``max_workers`` workers (1 and 1 when it is not
elastic), possibly spread over several environments of its queue.

One pass applies these rules, in this order:

1. Capacity loss. Where an environment holds more workers than it has slots (spot reclaimed,
   reserved slots taken back, environment gone), the jobs on it are visited lowest priority first,
   newest first. Shrinking is preferred to suspending: if shrinking them to their min frees enough,
   they are shrunk in that order (``Shrink``: a graceful notice to that many workers there).
   Otherwise jobs are suspended in that order (``Suspend``: checkpoint and re-queue, a preemption
   and not a failure) until shrinking the rest frees enough. No job is taken below its min, so a
   non-elastic job on lost capacity is suspended. Under a policy that ``share_aware``
   (``fairshare``), when shrinking is enough the workers leave from the share most over its
   entitlement first (``fairshare_alloc.shed_by_share``).
2. Admission. Queues by priority, higher first (equal priorities by queue name); within a queue
   strictly first in, first out by ``(created, id)``, or, in a queue with a fair-share policy
   (``QueueView.fairshare``), the next job from the share of least load, by scheduling priority
   within a share (``core/fairshare.py``); there a job of an active share does not start in
   the slots ``computeReservation`` keeps for shares not active yet. A job starts only if its
   ``min_workers`` fit at once in the free slots of its queue's environments (ENABLED, slots
   big enough); it takes as many as fit up to ``max_workers``, filling the environments in the
   queue's order (the first, then spilling to the next, as AWS Batch does). A job whose
   resources fit no slot of any of its queue's environments can never run: it waits with that
   reason and blocks nobody.
3. Preemption for priority. When a queue's first waiting job cannot start, preemptible jobs of
   strictly lower priority that run above their min are shrunk (never below it) on environments
   that job can use: lowest priority first, newest first, only the missing slots, and only if that
   is enough to start it now, which it then does (with its min).
4. Head of line. Otherwise that job blocks its queue for this pass: no later job of the queue
   starts, so small jobs behind it cannot starve it. It also reserves every environment it could
   use: queues later in the order neither start nor grow jobs there. They backfill only what the
   blocked job cannot use (environments outside its queue, DISABLED, or with slots too small).
   Under a share-aware policy (``fairshare``) a fair-share queue's head whose share already
   holds its entitlement reserves nothing, so the other shares still take their slots back.
   A job the executor refused to place (``Snapshot.held``: no room there, whatever the slots
   say) waits with the executor's reason and blocks its queue the same way; no job is shrunk
   for it, since the slots it misses are not the scheduler's to free.
5. Growth. Running jobs below ``max_workers`` grow into the free slots left, higher priority first,
   then first in, first out, filling their queue's environments in order (cheapest first), never
   where a blocked job of their own or an earlier queue holds a reservation.

An allocation policy (``core/allocation.py``) may change two things: how many workers a job
takes when it starts (rule 2: up to its max by default), and rule 5, which it may replace with its
own moves (``fair``, ``goodput``). The default policy keeps every rule above as it is.

A DISABLED queue starts and grows nothing; a DISABLED environment gets no new workers; running
workers stay on both. Slots released by ``Shrink`` and ``Suspend`` count as free in the same pass:
the controller starts the new workers once the notified ones have left.

Every RUNNABLE job that does not start gets a ``WaitInfo``: a reason and its 1-based position among
its queue's jobs that did not start. The jobs behind a blocked head share one reason, so
``Plan.waiting`` keeps them as a slice of the sorted queue and builds their entries when read. A
pass over 100,000 queued jobs thus costs one partition and one sort, plus work that grows with the
jobs that start or run, not with the queue; given queues already sorted (``Snapshot.queued``, as
the controller keeps them), not even the partition and the sort. Every order above is an
explicit sort key, so the same snapshot always gives the same plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import islice
from operator import attrgetter

from dyntrain.service.core.allocation import FIFO as FIFO_POLICY
from dyntrain.service.core.allocation import AllocationPolicy, Waiter, reallocate
from dyntrain.service.core.fairshare import fair_order
from dyntrain.service.core.fairshare_alloc import entitled_slots, shed_by_share
from dyntrain.service.core.model import JobStatus, Resources, State
from dyntrain.service.core.plan import (
    FIFO,
    Grow,
    JobView,
    Plan,
    QueueView,
    Shrink,
    SlotFit,
    Snapshot,
    Start,
    Suspend,
    WaitInfo,
    WaitingJobs,
    WaitingTail,
)

_CREATED = attrgetter("created")


def schedule(snapshot: Snapshot, policy: AllocationPolicy = FIFO_POLICY) -> Plan:
    """Decide one pass: capacity loss, admission (with preemption), then growth (``policy``'s
    allocation, when it has one; the default policy keeps rule 5)."""
    state = _Pass(snapshot, policy)
    _shed_lost_capacity(state)
    for queue_name, jobs in state.queued_in_order():
        queue = state.queues.get(queue_name)
        if queue is not None and queue.fairshare is not None:
            jobs = fair_order(jobs, queue.fairshare, state.held_by_share(queue_name),
                              state.share_usage)
        elif queue_name in state.unsorted:
            _fifo(jobs)
        _admit(state, queue_name, jobs)
    _grow(state)
    return state.plan()


class _Pass:
    """The working state of one pass: placements and free slots as decisions are taken."""

    def __init__(self, snapshot: Snapshot, policy: AllocationPolicy = FIFO_POLICY) -> None:
        self.policy = policy
        self.blocked: list[Waiter] = []  # queue heads that could not start (rule 4)
        self.envs = {env.name: env for env in snapshot.envs}
        self.queues = {queue.name: queue for queue in snapshot.queues}
        order = sorted(snapshot.queues, key=lambda q: (-q.priority, q.name))
        self.rank = {queue.name: i for i, queue in enumerate(order)}
        self.queued, self.running = _partition(snapshot.jobs)
        self.held = snapshot.held
        self.share_usage = snapshot.share_usage
        self.unsorted = set(self.queued)  # queues whose jobs came unsorted in snapshot.jobs
        for name, jobs in snapshot.queued.items():
            if not jobs:
                continue
            if name in self.queued:
                self.queued[name] += jobs
            else:
                self.queued[name] = jobs
        self.placement = {job.id: {env: n for env, n in job.placement.items() if n > 0}
                          for job in self.running}
        self.free = {name: env.available_slots for name, env in self.envs.items()}
        for where in self.placement.values():
            for env, n in where.items():
                self.free[env] = self.free.get(env, 0) - n
        by_age = sorted(self.running, key=FIFO, reverse=True)
        self.lowest_first = sorted(by_age, key=self.priority)  # stable: newest first within
        self.victims = [job for job in self.lowest_first if job.preemptible]
        self.first_victim = 0  # victims before it have nothing left to give
        self.reserved: dict[str, tuple[int, str]] = {}  # env -> (rank, queue) of a blocked job
        self.starts: list[Start] = []
        self.started: dict[str, JobView] = {}
        self.grows: list[Grow] = []
        self.shrinks: list[Shrink] = []
        self.suspends: dict[str, Suspend] = {}
        self.single: dict[str, WaitInfo] = {}
        self.tails: list[WaitingTail] = []

    def priority(self, job: JobView) -> float:
        queue = self.queues.get(job.queue)
        return queue.priority if queue is not None else -math.inf

    def queued_in_order(self) -> list[tuple[str, Sequence[JobView]]]:
        unknown = len(self.rank)
        return sorted(self.queued.items(), key=lambda kv: (self.rank.get(kv[0], unknown), kv[0]))

    def workers(self, job: JobView) -> int:
        return sum(self.placement[job.id].values())

    def held_by_share(self, queue: str) -> dict[str, int]:
        """Slots the running jobs of ``queue`` hold now, and those started this pass, by
        share."""
        out: dict[str, int] = {}
        for job in self.running:
            if job.queue == queue and job.id not in self.suspends:
                out[job.share or ""] = out.get(job.share or "", 0) + self.workers(job)
        for start in self.starts:
            job = self.started.get(start.job)
            if job is not None and job.queue == queue:
                out[job.share or ""] = out.get(job.share or "", 0) + start.workers
        return out

    def held_and_weights(self) -> tuple[dict[str, int], dict[str, float]]:
        """Slots the running jobs hold by share (all queues) and each share's weight."""
        held: dict[str, int] = {}
        weights: dict[str, float] = {}
        for job in self.running:
            if job.id in self.suspends:
                continue
            share = job.share or ""
            held[share] = held.get(share, 0) + self.workers(job)
            queue = self.queues.get(job.queue)
            if queue is not None and queue.fairshare is not None and job.share is not None:
                weights[share] = queue.fairshare.weight(job.share)
        return held, weights

    def spare(self, job: JobView) -> int:
        """Workers the job can give up without going below its min (0 once suspended)."""
        return max(0, self.workers(job) - job.min_workers)

    def usable(self, queue: QueueView, rank: int, resources: Resources) -> list[str]:
        """The queue's environments, in order, where this queue may place a worker of this size."""
        out = []
        for name in queue.compute_environments:
            env = self.envs.get(name)
            if (env is not None and env.state is State.ENABLED and resources.fits_in(env.slot)
                    and self.reserved.get(name, (math.inf,))[0] > rank):
                out.append(name)
        return out

    def start(self, job: JobView, placement: dict[str, int]) -> None:
        for env, n in placement.items():
            self.free[env] -= n
        self.starts.append(Start(job.id, placement))
        self.started[job.id] = job

    def grow(self, job: JobView, env: str, n: int) -> None:
        self.free[env] -= n
        self.placement[job.id][env] = self.placement[job.id].get(env, 0) + n
        self.grows.append(Grow(job.id, env, n))

    def shrink(self, job: JobView, env: str, n: int, reason: str) -> None:
        self.free[env] += n
        self.placement[job.id][env] -= n
        self.shrinks.append(Shrink(job.id, env, n, reason))

    def suspend(self, job: JobView, reason: str) -> None:
        for env, n in self.placement[job.id].items():
            self.free[env] += n
        self.placement[job.id] = {}
        self.suspends[job.id] = Suspend(job.id, reason)

    def plan(self) -> Plan:
        shrinks = tuple(s for s in self.shrinks if s.job not in self.suspends)
        return Plan(tuple(self.starts), tuple(self.grows), shrinks,
                    tuple(self.suspends.values()), WaitingJobs(self.single, self.tails))


def _partition(jobs: Sequence[JobView]) -> tuple[dict[str, list[JobView]], list[JobView]]:
    """Queued jobs by queue name, and the active ones."""
    queued: dict[str, list[JobView]] = {}
    running = []
    runnable = JobStatus.RUNNABLE
    for job in jobs:
        if job.status is runnable:
            jobs_of_queue = queued.get(job.queue)
            if jobs_of_queue is None:
                jobs_of_queue = queued[job.queue] = []
            jobs_of_queue.append(job)
        else:
            running.append(job)
    return queued, running


def _fifo(jobs: list[JobView]) -> list[JobView]:
    """Sort in place by (created, id). A number key sorts twice as fast as a tuple key, so the
    tuple key is only used when two jobs share a ``created`` value."""
    jobs.sort(key=_CREATED)
    if len(set(map(_CREATED, jobs))) < len(jobs):
        jobs.sort(key=FIFO)
    return jobs


def _shed_lost_capacity(state: _Pass) -> None:
    """Rule 1: bring every environment back within its slots (shrink first, then suspend)."""
    for env in sorted(state.free):
        over = -state.free[env]
        if over <= 0:
            continue
        slots = state.envs[env].available_slots if env in state.envs else 0
        what = f"capacity lost on {env}: {slots} slots left for {slots + over} workers"
        on_env = [job for job in state.lowest_first if state.placement[job.id].get(env, 0) > 0]
        spare = {job.id: min(state.placement[job.id][env], state.spare(job)) for job in on_env}
        if state.policy.share_aware:
            held, weights = state.held_and_weights()
            taken = shed_by_share(over, [(job, spare[job.id]) for job in on_env], held,
                                  entitled_slots(held, weights, sum(
                                      e.available_slots for e in state.envs.values())))
            if taken is not None:
                for job in on_env:
                    if taken.get(job.id):
                        state.shrink(job, env, taken[job.id], f"{what}; the share most over "
                                                              f"its entitlement gives first")
                continue
        can_shrink = sum(spare.values())
        for job in on_env:
            if can_shrink >= over:
                break
            can_shrink -= spare[job.id]
            over -= state.placement[job.id][env]
            state.suspend(job, f"{what}; shrinking the jobs there to their min is not enough")
        for job in on_env:
            n = min(spare[job.id], over) if job.id not in state.suspends else 0
            if n > 0:
                state.shrink(job, env, n, what)
                over -= n


def _admit(state: _Pass, queue_name: str, jobs: Sequence[JobView]) -> None:
    """Rules 2-4 for one queue: start jobs in order until one cannot start."""
    queue = state.queues.get(queue_name)
    if queue is None:
        state.tails.append(WaitingTail(jobs, 0, 1, f"queue {queue_name} does not exist", None))
        return
    fit = SlotFit(queue, state.envs)
    if queue.state is State.DISABLED:
        state.tails.append(WaitingTail(jobs, 0, 1, f"queue {queue.name} is DISABLED", fit))
        return
    rank = state.rank[queue.name]
    usable_by_size: dict[Resources, list[str]] = {}
    ahead = 0  # jobs of this queue before this one that did not start
    by_share = state.held_by_share(queue.name) if queue.fairshare is not None else {}
    for i, job in enumerate(jobs):
        never = fit.never_reason(job.resources)
        if never:
            state.single[job.id] = WaitInfo(never, ahead + 1)
            ahead += 1
            continue
        reserved = _reservation(state, queue, job, by_share)
        if reserved:
            state.single[job.id] = WaitInfo(reserved, ahead + 1)
            ahead += 1
            continue
        held = state.held.get(job.id)
        if held is not None:
            _block(state, queue, rank, jobs, i, ahead, fit, held)
            return
        usable = usable_by_size.get(job.resources)
        if usable is None:
            usable = usable_by_size[job.resources] = state.usable(queue, rank, job.resources)
        placement = _fill(state.free, usable, job.min_workers, state.policy.start_workers(job))
        if placement is None and _make_room(state, job, queue, usable):
            placement = _fill(state.free, usable, job.min_workers, state.policy.start_workers(job))
        if placement is None:
            _block(state, queue, rank, jobs, i, ahead, fit)
            return
        state.start(job, placement)
        if queue.fairshare is not None:
            by_share[job.share or ""] = by_share.get(job.share or "", 0) + sum(placement.values())


def _reservation(state: _Pass, queue: QueueView, job: JobView, held: dict[str, int]) -> str:
    """Why ``job`` may not start in a fair-share queue's slots that ``computeReservation``
    keeps for shares not active yet ('' when it may; a job of an inactive share always may)."""
    policy = queue.fairshare
    active = sum(1 for n in held.values() if n > 0)
    if policy is None or not held.get(job.share or "", 0) or not policy.compute_reservation:
        return ""
    slots = sum(state.envs[e].available_slots for e in queue.compute_environments
                if e in state.envs and state.envs[e].state is State.ENABLED)
    allowed = math.floor(slots * (1.0 - policy.reserved_fraction(active)) + 1e-9)
    if sum(held.values()) + job.min_workers <= allowed:
        return ""
    return (f"share {job.share} waits: computeReservation {policy.compute_reservation} keeps "
            f"{slots - allowed} of {queue.name}'s {slots} slots for shares not active yet")


def _fill(free: Mapping[str, int], usable: list[str], lo: int, hi: int) -> dict[str, int] | None:
    """Up to ``hi`` workers over the environments in order, or None when ``lo`` do not fit."""
    if sum(free[env] for env in usable) < lo:
        return None
    placement, want = {}, hi
    for env in usable:
        take = min(free[env], want)
        if take > 0:
            placement[env] = take
            want -= take
        if want == 0:
            break
    return placement


def _make_room(state: _Pass, job: JobView, queue: QueueView, usable: list[str]) -> bool:
    """Rule 3: shrink lower-priority jobs for ``job``'s missing slots, if that is enough."""
    short = job.min_workers - sum(state.free[env] for env in usable)
    victims = state.victims
    while state.first_victim < len(victims) and not state.spare(victims[state.first_victim]):
        state.first_victim += 1  # spare only shrinks during admission: skip these for good
    takes = []
    for victim in islice(victims, state.first_victim, None):
        if short == 0 or state.priority(victim) >= queue.priority:
            break
        spare, where = state.spare(victim), state.placement[victim.id]
        for env in usable:
            n = min(where.get(env, 0), spare, short)
            if n > 0:
                takes.append((victim, env, n))
                spare -= n
                short -= n
    if short > 0:
        return False
    for victim, env, n in takes:
        state.shrink(victim, env, n, f"making room for higher-priority job {job.id} "
                                     f"(queue {queue.name}, priority {queue.priority})")
    return True


def _block(state: _Pass, queue: QueueView, rank: int, jobs: Sequence[JobView], i: int, ahead: int,
           fit: SlotFit, held: str | None = None) -> None:
    """Rule 4: ``jobs[i]`` cannot start; it and the jobs behind it wait, and it reserves.
    ``held``: why the executor refused it (then no slot it misses is the scheduler's to free)."""
    head = jobs[i]
    usable = state.usable(queue, rank, head.resources)
    short = head.min_workers - sum(state.free[env] for env in usable)
    if held is not None:
        reason = held
    else:
        details = ", ".join(_env_detail(state, name, head.resources, rank)
                            for name in queue.compute_environments)
        reason = (f"waiting for {short} more slot{'s' if short != 1 else ''} in {queue.name}'s "
                  f"environments ({details}); it needs {head.min_workers} at once")
        state.blocked.append(Waiter(head, tuple(usable), short, queue.priority))
    state.single[head.id] = WaitInfo(reason, ahead + 1)
    for name in queue.compute_environments if not _over_entitled(state, queue, head) else ():
        env = state.envs.get(name)
        if env is not None and env.state is State.ENABLED and head.resources.fits_in(env.slot):
            state.reserved[name] = min(state.reserved.get(name, (rank, queue.name)),
                                       (rank, queue.name))
    behind = f"queued behind {head.id}, which is {reason}"
    if queue.fairshare is None:
        state.tails.append(WaitingTail(jobs, i + 1, ahead + 2, behind, fit))
        return
    for k, job in enumerate(jobs[i + 1:]):  # not in (created, id) order: one entry each
        state.single[job.id] = WaitInfo(fit.never_reason(job.resources) or behind, ahead + 2 + k)


def _over_entitled(state: _Pass, queue: QueueView, head: JobView) -> bool:
    """Under a share-aware policy, a fair-share queue's head whose share already holds its
    entitlement waits without reserving: it would only keep the other shares' jobs from
    taking their slots back."""
    if queue.fairshare is None or not state.policy.share_aware:
        return False
    held, weights = state.held_and_weights()
    entitled = entitled_slots({head.share or "": 0, **held}, weights,
                              sum(e.available_slots for e in state.envs.values()))
    return held.get(head.share or "", 0) >= entitled[head.share or ""]


def _env_detail(state: _Pass, name: str, resources: Resources, rank: int) -> str:
    env = state.envs.get(name)
    if env is None:
        return f"{name}: does not exist"
    if env.state is State.DISABLED:
        return f"{name}: DISABLED"
    if not resources.fits_in(env.slot):
        return f"{name}: slots too small"
    held = state.reserved.get(name)
    if held is not None and held[0] < rank:
        return f"{name}: held for queue {held[1]}"
    return f"{name}: {state.free[name]} free of {env.available_slots}"


def _grow(state: _Pass) -> None:
    """Rule 5: running jobs below max take free slots, higher priority first, then FIFO (or
    the allocation policy's moves)."""
    if reallocate(state):
        return
    unknown = len(state.rank)
    for job in sorted(state.running, key=lambda j: (state.rank.get(j.queue, unknown), *FIFO(j))):
        queue = state.queues.get(job.queue)
        if job.id in state.suspends or queue is None or queue.state is State.DISABLED:
            continue
        want = job.max_workers - state.workers(job)
        if want <= 0:
            continue
        for env in state.usable(queue, state.rank[queue.name], job.resources):
            take = min(state.free[env], want)
            if take > 0:
                state.grow(job, env, take)
                want -= take
            if want == 0:
                break
