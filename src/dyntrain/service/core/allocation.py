"""Allocation policies: how the scheduler shares slots between running elastic jobs.

``schedule(snapshot, policy)`` (``dyntrain.service.core.scheduler``) asks its policy two things:

* ``start_workers(job)``: how many workers at most a job takes when it starts (it always needs
  its ``min_workers`` at once);
* when its ``reallocates`` is true, ``allocate(pool)`` after capacity loss and admission:
  ``Move`` decisions that grow running jobs into free slots or shrink them (to make room for a
  queue's blocked head, or to give a worker to a job that does more with it), instead of the
  scheduler's own growth rule (rule 5: higher priority first, then first in, first out, each
  job up to its max).

``AllocationPolicy`` itself is today's rule: a starting job takes up to its max, and growth is
rule 5. It is the service's default. ``FairShare`` and ``Goodput`` (``core/goodput.py``) and
``ShareGoodput`` (``fairshare``, ``core/fairshare_alloc.py``: the shares of fair-share queues by
weight, ``Pool.weights``) start jobs at their min and allocate everything themselves.
Policies are pure: a ``Pool`` in, moves out; the same pool always gives the same moves.

A ``Pool`` sees only what rules 1-4 left: every running job's placement after shrinks and
suspensions, the environments it may still take workers in (its queue's, in order, without the
ones a blocked head of its own or an earlier queue holds), the queue heads that could not start
(``Waiter``: how many slots each still misses) and the free slots. A move that shrinks a job
for a waiter frees a slot the waiter's reservation keeps for it: it starts in the next pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dyntrain.service.core.model import State, ValidationError

if TYPE_CHECKING:  # the scheduler imports this module
    from dyntrain.service.core.plan import JobView


@dataclass(frozen=True, slots=True)
class Holding:
    """A running job as an allocation policy sees it."""

    job: JobView
    placement: Mapping[str, int]  # environment -> workers, after rules 1-4
    envs: tuple[str, ...]  # where it may take new workers, in its queue's order
    priority: int  # its queue's (higher goes first)
    may_preempt: bool = False  # its queue lets a policy preempt it whole though it is plain

    @property
    def workers(self) -> int:
        return sum(self.placement.values())


@dataclass(frozen=True, slots=True)
class Waiter:
    """A queue's first job that could not start: it misses ``short`` slots in ``envs``."""

    job: JobView
    envs: tuple[str, ...]
    short: int
    priority: int  # its queue's


@dataclass(frozen=True, slots=True)
class Pool:
    """What one allocation looks at (module doc)."""

    holdings: tuple[Holding, ...]  # by priority (higher first), then first in, first out
    waiters: tuple[Waiter, ...]  # in queue order
    free: Mapping[str, int]  # environment -> free slots
    slots: Mapping[str, int]  # environment -> slots that exist now
    prices: Mapping[str, float]  # environment -> price per slot-hour
    weights: Mapping[str, float] = field(default_factory=dict)  # share -> weight (default 1)


@dataclass(frozen=True, slots=True)
class Move:
    """Grow (``count`` > 0) or shrink (``count`` < 0) a running job on one environment; or,
    with ``suspend``, preempt the whole job (it is queued again, the attempt not counted;
    ``env`` and ``count`` unused): only a plain job whose queue allows it
    (``Holding.may_preempt``)."""

    job: str
    env: str
    count: int
    reason: str = ""
    suspend: bool = False


class AllocationPolicy:
    """Today's rule, the service's default: a starting job takes up to its max, and free slots
    go to running jobs by priority, then first in, first out (the scheduler's rule 5)."""

    name = "fifo"
    reallocates = False  # True: ``allocate`` replaces the scheduler's rule 5
    share_aware = False  # True: capacity loss and head of line by share (``fairshare_alloc``)

    def start_workers(self, job: JobView) -> int:
        """How many workers at most ``job`` takes when it starts (>= its min)."""
        return job.max_workers

    def allocate(self, pool: Pool) -> Sequence[Move]:
        """The moves of this pass (called only when ``reallocates``)."""
        return ()


FIFO = AllocationPolicy()


def policy_by_name(name: str) -> AllocationPolicy:
    """``fifo``, ``fair``, ``goodput`` or ``fairshare`` (each with its default settings)."""
    from dyntrain.service.core.fairshare_alloc import ShareGoodput
    from dyntrain.service.core.goodput import FairShare, Goodput

    policies = {"fifo": AllocationPolicy, "fair": FairShare, "goodput": Goodput,
                "fairshare": ShareGoodput}
    try:
        return policies[name]()
    except KeyError:
        raise ValidationError(f"unknown allocation policy {name!r}; choose from "
                              f"{', '.join(policies)}") from None


POLICY_NAMES = ("fifo", "fair", "goodput", "fairshare")


def reallocate(state) -> bool:
    """Let ``state.policy`` allocate in a scheduling pass; False when it leaves growth to the
    scheduler's rule 5.

    ``state`` is the scheduler's pass (``scheduler._Pass``); this reads its ``running``,
    ``suspends``, ``queues``, ``rank``, ``placement``, ``free``, ``envs`` and ``blocked`` and
    calls its ``usable``, ``grow`` and ``shrink``. A move that breaks the rules (a grow beyond
    the free slots, the job's max or its environments; a shrink below its min or of a job that
    may not be shrunk) is a policy's bug and raises ValidationError.
    """
    if not state.policy.reallocates:
        return False
    holdings = []
    views = {}
    for job in state.running:
        queue = state.queues.get(job.queue)
        if job.id in state.suspends or queue is None or queue.state is State.DISABLED:
            continue
        rank = state.rank[queue.name]
        views[job.id] = job
        holdings.append(Holding(job, dict(state.placement[job.id]),
                                tuple(state.usable(queue, rank, job.resources)), queue.priority,
                                queue.preempt_plain_jobs and not job.preemptible))
    holdings.sort(key=lambda h: (-h.priority, h.job.created, h.job.id))
    weights = {}
    for job in [h.job for h in holdings] + [w.job for w in state.blocked]:
        queue = state.queues.get(job.queue)
        if queue is not None and queue.fairshare is not None and job.share is not None:
            weights[job.share] = queue.fairshare.weight(job.share)
    pool = Pool(tuple(holdings), tuple(state.blocked), dict(state.free),
                {name: env.available_slots for name, env in state.envs.items()},
                {name: env.price_per_slot_hour for name, env in state.envs.items()}, weights)
    moves = state.policy.allocate(pool)
    allowed = {h.job.id: set(h.envs) for h in holdings}
    may_preempt = {h.job.id for h in holdings if h.may_preempt}
    for move in moves:
        job = views.get(move.job)
        if job is None:
            raise ValidationError(f"policy {state.policy.name}: {move.job} is not a running job")
        if move.suspend:
            if job.id not in may_preempt:
                raise ValidationError(f"policy {state.policy.name}: {job.id}'s queue does not "
                                      "allow preempting it")
            state.suspend(job, move.reason or state.policy.name)
            continue
        have = sum(state.placement[job.id].values())
        if move.count > 0:
            if (move.env not in allowed[job.id] or state.free.get(move.env, 0) < move.count
                    or have + move.count > job.max_workers):
                raise ValidationError(f"policy {state.policy.name}: cannot grow {job.id} by "
                                      f"{move.count} on {move.env}")
            state.grow(job, move.env, move.count)
        elif move.count < 0:
            if (not job.preemptible or state.placement[job.id].get(move.env, 0) < -move.count
                    or have + move.count < job.min_workers):
                raise ValidationError(f"policy {state.policy.name}: cannot shrink {job.id} by "
                                      f"{-move.count} on {move.env}")
            state.shrink(job, move.env, -move.count, move.reason or state.policy.name)
    return True
