"""The ``fair`` and ``goodput`` allocation policies (``dyntrain.service.core.allocation``).

Both start a job with its min workers and then share the slots themselves, in three phases:

1. **Room for waiting jobs** (the fairness floor: no job starves). For each queue head that
   could not start, running jobs of the same or a lower priority give up workers on the
   environments it can use, never below their floor, if that is enough to start it; it starts
   in the next pass, in the slots its reservation keeps.
2. **Growth** into free slots, higher priority first.
3. **Rebalancing**: a worker moves from one running job to another of the same or a higher
   priority when that is worth it.

``FairShare`` splits evenly: the fair share is the pool's slots over its running and waiting
jobs (at least 1); a job's floor is its share (or its min), growth goes to the jobs with the
fewest workers, and a worker moves when two jobs differ by two or more.

``Goodput`` gives each worker where it adds the most useful throughput per dollar, using each
job's speed-up model (``JobView.profile``, ``dyntrain.service.core.speedup``; a job not yet measured
is assumed to scale perfectly). A worker's value is ``model.marginal(w)``: what it adds, in
units of one worker's throughput. Because the global batch is fixed, throughput is goodput: no
allocation changes any job's result.

* It is worth its price when ``marginal >= min_gain * price / cheapest``, ``cheapest`` being the
  lowest positive price in the pool: an on-demand worker three times the spot price must add
  three times as much. Workers worth less than half that are released (once the job's curve
  was measured at two sizes or more), which is where goodput saves money.
* A job grows at most to ``explore`` times the largest world size it was measured at (times
  its min before any measurement), so a curve is learned before it is trusted.
* Hysteresis: a change re-forms the job (both jobs, for a move), which costs its measured
  ``reform_s`` of training (``default_reform_s`` before any was measured), and a new worker
  trains only ``start_s`` after it was started. A change is made only if what it gains over
  ``min(horizon_s, the job's remaining time)``, less the start-up, is at least
  ``reform_margin`` times what its re-formations cost; a worker moves from one running job to
  another only when the move gains at least ``move_gain`` (a dead band: measurements are noisy,
  and a worker must not go back and forth).
* Fairness floor: a running job keeps at least ``fair_floor`` of its fair share (and its min)
  when others need room.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dyntrain.service.core.allocation import AllocationPolicy, Holding, Move, Pool
from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.speedup import SpeedupModel

PERFECT = SpeedupModel()


class _Plan:
    """The working state of one allocation: workers per job and environment, free slots."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.placement = {h.job.id: dict(h.placement) for h in pool.holdings}
        self.count = {h.job.id: h.workers for h in pool.holdings}
        self.free = dict(pool.free)
        self.changed: set[str] = set()
        self.moves: dict[tuple[str, str], int] = {}
        self.reasons: dict[tuple[str, str], str] = {}
        total = sum(pool.slots.values())
        self.share = max(1, total // max(1, len(pool.holdings) + len(pool.waiters)))
        positive = [p for p in pool.prices.values() if p > 0]
        self.cheapest = min(positive) if positive else None  # None: every slot is free

    def workers(self, h: Holding) -> int:
        return self.count[h.job.id]

    def add(self, h: Holding, env: str, n: int, reason: str, *, to_free: bool = True) -> None:
        """``n`` > 0: grow on ``env`` from its free slots; < 0: shrink there (the slot goes
        back to the free ones unless ``to_free`` is False: a waiter's reservation keeps it)."""
        self.placement[h.job.id][env] = self.placement[h.job.id].get(env, 0) + n
        self.count[h.job.id] += n
        if n > 0 or to_free:
            self.free[env] -= n
        key = (h.job.id, env)
        self.moves[key] = self.moves.get(key, 0) + n
        if n < 0:
            self.reasons[key] = reason
        self.changed.add(h.job.id)

    def free_env(self, h: Holding, prices=None) -> str | None:
        """Where ``h`` would take its next worker: a free slot in its environments, the
        cheapest first when ``prices`` is given, else in its queue's order."""
        envs = [e for e in h.envs if self.free.get(e, 0) > 0]
        if not envs:
            return None
        return min(envs, key=lambda e: prices[e]) if prices is not None else envs[0]

    def result(self) -> list[Move]:
        moves = [Move(job, env, n, self.reasons.get((job, env), ""))
                 for (job, env), n in self.moves.items() if n != 0]
        return sorted(moves, key=lambda m: (m.count > 0, m.job, m.env))  # shrinks first


def _make_room(plan: _Plan, floor, donor_key) -> None:
    """Phase 1: for each waiter, take workers from jobs of its priority or lower (never below
    ``floor(h)``), in ``donor_key`` order, if that is enough to start it."""
    for waiter in plan.pool.waiters:
        envs = set(waiter.envs)
        donors = [h for h in plan.pool.holdings
                  if h.priority <= waiter.priority and h.job.preemptible
                  and any(plan.placement[h.job.id].get(e, 0) for e in envs)]
        spare = {h.job.id: max(0, plan.workers(h) - floor(h)) for h in donors}
        if sum(min(spare[h.job.id], sum(plan.placement[h.job.id].get(e, 0) for e in envs))
               for h in donors) < waiter.short:
            continue
        need = waiter.short
        reason = f"making room for {waiter.job.id} (fair share {plan.share})"
        while need > 0:
            h = min((d for d in donors if spare[d.job.id] > 0
                     and any(plan.placement[d.job.id].get(e, 0) for e in envs)),
                    key=lambda d: donor_key(d, plan))
            env = next(e for e in waiter.envs if plan.placement[h.job.id].get(e, 0) > 0)
            plan.add(h, env, -1, reason, to_free=False)
            spare[h.job.id] -= 1
            need -= 1


class FairShare(AllocationPolicy):
    """Even shares (module doc).

    Args:
        max_moves: workers moved between running jobs per pass, at most.
    """

    name = "fair"
    reallocates = True

    def __init__(self, max_moves: int = 8) -> None:
        self.max_moves = max_moves

    def start_workers(self, job) -> int:
        return job.min_workers

    def allocate(self, pool: Pool) -> Sequence[Move]:
        plan = _Plan(pool)

        def floor(h: Holding) -> int:
            return max(h.job.min_workers, plan.share)

        _make_room(plan, floor, lambda h, p: (-p.workers(h), -h.job.created, h.job.id))
        heap = [(-h.priority, plan.workers(h), h.job.created, h.job.id, i)
                for i, h in enumerate(pool.holdings)]
        heapq.heapify(heap)
        while heap:
            order, w, created, jid, i = heapq.heappop(heap)
            h = pool.holdings[i]
            env = plan.free_env(h)
            if env is None or w >= h.job.max_workers:
                continue
            plan.add(h, env, 1, "")
            heapq.heappush(heap, (order, w + 1, created, jid, i))
        for _ in range(self.max_moves):
            if not self._move_one(plan):
                break
        return plan.result()

    def _move_one(self, plan: _Plan) -> bool:
        """Move one worker from the job with the most to one with two fewer, if any."""
        holdings = plan.pool.holdings
        for r in sorted(holdings, key=lambda h: (-h.priority, plan.workers(h), h.job.created)):
            wr = plan.workers(r)
            if wr >= r.job.max_workers:
                continue
            for d in sorted(holdings, key=lambda h: (-plan.workers(h), -h.job.created)):
                if (d is r or d.priority > r.priority or not d.job.preemptible
                        or plan.workers(d) < wr + 2 or plan.workers(d) <= d.job.min_workers):
                    continue
                env = next((e for e in r.envs if plan.placement[d.job.id].get(e, 0) > 0), None)
                if env is None:
                    continue
                plan.add(d, env, -1, f"fair share: a worker moves to {r.job.id}")
                plan.add(r, env, 1, "")
                return True
        return False


@dataclass(frozen=True)
class GoodputConfig:
    """Settings of ``Goodput`` (module doc)."""

    min_gain: float = 0.25
    fair_floor: float = 0.5
    horizon_s: float = 3600.0
    reform_margin: float = 2.0
    default_reform_s: float = 2.0
    start_s: float = 10.0
    move_gain: float = 0.25
    explore: float = 2.0
    max_moves: int = 8

    def __post_init__(self) -> None:
        for name in ("min_gain", "fair_floor", "horizon_s", "reform_margin", "default_reform_s",
                     "start_s", "move_gain"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValidationError(f"goodput: {name} must be a finite number >= 0, "
                                      f"got {value!r}")
        if not self.explore >= 1:
            raise ValidationError(f"goodput: explore must be >= 1, got {self.explore!r}")


class Goodput(AllocationPolicy):
    """Workers where they add the most useful throughput per dollar (module doc).

    Args:
        config: its settings (``GoodputConfig``'s defaults when None).
    """

    name = "goodput"
    reallocates = True

    def __init__(self, config: GoodputConfig | None = None) -> None:
        self.config = config or GoodputConfig()

    def start_workers(self, job) -> int:
        return job.min_workers

    # ---- what a job knows about itself -----------------------------------------------------------

    @staticmethod
    def model(h: Holding) -> SpeedupModel:
        profile = h.job.profile
        return profile.model if profile is not None else PERFECT

    def cap(self, h: Holding) -> int:
        """The most workers ``h`` may have now: its max, and ``explore`` x the largest size it
        was measured at (x its min before it was measured at all)."""
        profile = h.job.profile
        seen = max((p.world_size for p in profile.points), default=0) if profile else 0
        seen = max(seen, h.job.min_workers)
        return min(h.job.max_workers, max(h.job.min_workers, math.ceil(self.config.explore
                                                                        * seen)))

    def reform_cost(self, h: Holding, w: int) -> float:
        """Speed-up x seconds one re-formation of ``h`` at ``w`` workers costs."""
        profile = h.job.profile
        seconds = profile.reform_s if profile and profile.reform_s is not None \
            else self.config.default_reform_s
        return seconds * self.model(h).speedup(w) if w > 0 else 0.0

    def horizon(self, h: Holding, w: int) -> float:
        left = h.job.profile.remaining_seconds(w) if h.job.profile else None
        return self.config.horizon_s if left is None else min(self.config.horizon_s, left)

    def measured(self, h: Holding) -> bool:
        return h.job.profile is not None and len(h.job.profile.points) >= 2

    # ---- the allocation --------------------------------------------------------------------------

    def allocate(self, pool: Pool) -> Sequence[Move]:
        plan = _Plan(pool)

        share = int(self.config.fair_floor * plan.share)

        def floor(h: Holding) -> int:
            return max(h.job.min_workers, share)

        def loss(h: Holding, p: _Plan) -> tuple:
            w = p.workers(h)
            return (self.model(h).speedup(w) - self.model(h).speedup(w - 1), h.job.id)

        _make_room(plan, floor, loss)
        self._release(plan)
        self._grow(plan)
        for _ in range(self.config.max_moves):
            if not self._move_one(plan, floor):
                break
        return plan.result()

    def threshold(self, price: float, plan: _Plan) -> float:
        """The least a worker at ``price`` must add (units of one worker's throughput); where
        no slot has a price, ``min_gain`` everywhere."""
        if plan.cheapest is None:
            return self.config.min_gain
        return self.config.min_gain * price / plan.cheapest

    def _worth(self, h: Holding, w: int, gain: float, plan: _Plan) -> bool:
        """Hysteresis: does ``gain`` (speed-up) over the horizon beat re-forming ``h``?"""
        if h.job.id in plan.changed:  # it re-forms anyway: workers added together join once
            return True
        useful = max(0.0, self.horizon(h, w + 1) - self.config.start_s)
        return gain * useful >= self.config.reform_margin * self.reform_cost(h, w)

    def _release(self, plan: _Plan) -> None:
        """Give back workers a measured curve says are worth less than half their price."""
        for h in plan.pool.holdings:
            if not (h.job.preemptible and self.measured(h)):
                continue
            model = self.model(h)
            while plan.workers(h) > h.job.min_workers:
                w = plan.workers(h)
                held = plan.placement[h.job.id]
                env = max((e for e in held if held[e] > 0),
                          key=lambda e: plan.pool.prices.get(e, 0.0))
                keep = 0.5 * self.threshold(plan.pool.prices.get(env, 0.0), plan)
                if model.marginal(w - 1) >= keep:
                    break
                plan.add(h, env, -1, f"goodput: worker {w} adds "
                                     f"{model.marginal(w - 1):.2f} of one worker's throughput")

    def _grow(self, plan: _Plan) -> None:
        prices = plan.pool.prices
        heap = []

        def push(i: int) -> None:
            h = plan.pool.holdings[i]
            w = plan.workers(h)
            env = plan.free_env(h, prices)
            if env is None or w >= self.cap(h):
                return
            gain = self.model(h).marginal(w)
            if gain < self.threshold(prices.get(env, 0.0), plan) or gain <= 0:
                return
            per_dollar = gain / max(prices.get(env, 0.0), 1e-9)
            heapq.heappush(heap, (-h.priority, -per_dollar, h.job.created, h.job.id, i, env, gain))

        for i in range(len(plan.pool.holdings)):
            push(i)
        while heap:
            _, _, _, _, i, env, gain = heapq.heappop(heap)
            h = plan.pool.holdings[i]
            if plan.free.get(env, 0) <= 0:  # taken meanwhile: look again
                push(i)
                continue
            if not self._worth(h, plan.workers(h), gain, plan):
                continue
            plan.add(h, env, 1, "")
            push(i)

    def _move_one(self, plan: _Plan, floor) -> bool:
        """Move the one worker whose move gains most, if that beats both re-formations."""
        donors = []
        for d in plan.pool.holdings:
            wd = plan.workers(d)
            if d.job.preemptible and wd > floor(d):
                model = self.model(d)
                donors.append((model.speedup(wd) - model.speedup(wd - 1), d.job.id, d, wd))
        if not donors:
            return False
        donors.sort(key=lambda x: x[:2])
        receivers = []
        for r in plan.pool.holdings:
            wr = plan.workers(r)
            if wr < self.cap(r):
                receivers.append((-self.model(r).marginal(wr), r.job.id, r, wr))
        receivers.sort(key=lambda x: x[:2])
        best = None
        for neg_gain, _, r, wr in receivers:
            gain = -neg_gain
            if gain - donors[0][0] <= (best[0] if best else 0.0):
                break  # receivers come by falling gain, donors by rising loss
            for loss, _, d, wd in donors:
                net = gain - loss
                if net < self.config.move_gain or net <= (best[0] if best else 0.0):
                    break
                if d is r or d.priority > r.priority:
                    continue
                env = next((e for e in r.envs if plan.placement[d.job.id].get(e, 0) > 0), None)
                if env is None or gain < self.threshold(plan.pool.prices.get(env, 0.0), plan):
                    continue
                cost = self.reform_cost(r, wr) + self.reform_cost(d, wd)
                horizon = self.horizon(r, wr + 1)
                benefit = gain * max(0.0, horizon - self.config.start_s) - loss * horizon
                if benefit >= self.config.reform_margin * cost:
                    best = (net, r, d, env)
                    break
        if best is None:
            return False
        net, r, d, env = best
        plan.add(d, env, -1, f"goodput: a worker moves to {r.job.id} (+{net:.2f} speed-up)")
        plan.add(r, env, 1, "")
        return True
