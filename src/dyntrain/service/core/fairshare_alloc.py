"""The ``fairshare`` allocation policy: shares first, goodput within a share.

It starts every job with its min workers and then allocates the slots of the pool between
shares (``JobView.share``; jobs without one form the share ``""``), each entitled to
``weight / sum of the active shares' weights`` of the pool's slots (``Pool.weights``: a
fair-share queue's ``1 / weightFactor``, ``core/fairshare.py``; 1 when not given). A share is
active while it has a job running or a queue head waiting. Three phases:

1. **Room for waiting jobs.** A queue head that could not start, of a share below its
   entitlement, gets the slots it misses from elastic jobs of shares above theirs (the most
   over-entitled share first, its job with the most workers first, never below a job's min),
   if that is enough to start it; the slots stay reserved for it and it starts in the next
   pass.
2. **Growth.** Free slots go to the share of least slots per weight that can use one, and
   within that share to the job whose next worker adds the most (the goodput policy's speed-up
   model, ``JobView.profile``; perfect scaling before any measurement), fewest workers first on
   ties. Growth is work-conserving: a share may exceed its entitlement while nobody else
   wants the slots.
   Where no elastic job can give enough, a plain job of an over-entitled share is preempted
   whole if its queue allows it (``Holding.may_preempt``, the queue's
   ``preempt_plain_jobs``): it is queued again and the attempt is not counted.
3. **Taking capacity back.** While a share below its entitlement has a job that can grow, an
   elastic job of a share above its own gives it a worker: a graceful preemption notice to one
   worker (the scheduler's ``Shrink``), so no work is lost and, the global batch being fixed,
   no result changes. At most ``max_moves`` workers move per pass.

Hysteresis: a worker moves from share ``o`` to share ``u`` only when
``(held_o - entitled_o) - (held_u - entitled_u) >= 2`` slots. A move lowers that difference by
exactly 2, so the reverse move is never justified right after, and shares settle within one
slot of their entitlements instead of trading a worker back and forth. A job whose workers
are still starting neither grows nor gives a worker until they run.

Capacity loss (``shed_by_share``, the scheduler's rule 1 under this policy): when an
environment loses slots and shrinking its jobs to their min frees enough, the workers leave
one at a time from the share most over its entitlement (of the slots left), its job with the
most spare workers there first, so no share pays for another's surplus; when shrinking is not
enough, the scheduler's own rule (suspend lowest priority, newest first) applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dyntrain.service.core.allocation import AllocationPolicy, Holding, Move, Pool
from dyntrain.service.core.model import JobStatus
from dyntrain.service.core.plan import JobView
from dyntrain.service.core.speedup import SpeedupModel

PERFECT = SpeedupModel()
BAND = 2.0 - 1e-9  # the hysteresis band, in slots


def share_of(h: Holding) -> str:
    return h.job.share or ""


def starting(h: Holding) -> bool:
    """A job whose workers are still starting: it neither grows nor gives a worker until they
    run (its placement is not known yet)."""
    return h.job.status is JobStatus.STARTING


def entitled_slots(held: Mapping[str, int], weights: Mapping[str, float], slots: int
                   ) -> dict[str, float]:
    """Each share of ``held`` (the active shares) entitled to ``slots * weight / total weight``
    (weight 1 when ``weights`` does not name it)."""
    weight = {s: weights.get(s, 1.0) for s in held}
    total = sum(weight.values()) or 1.0
    return {s: slots * w / total for s, w in weight.items()}


def shed_by_share(over: int, spare: Sequence[tuple[JobView, int]], held: Mapping[str, int],
                  entitled: Mapping[str, float]) -> dict[str, int] | None:
    """Workers each job gives up when ``over`` workers must leave an environment (module doc):
    ``spare`` the jobs there with the workers each can give up without going below its min,
    ``held`` each share's slots now, ``entitled`` its entitlement. None when shrinking every
    job to its min there is not enough. Ties: most spare workers, then the newest job."""
    if sum(n for _, n in spare) < over:
        return None
    left = {job.id: n for job, n in spare}
    held = dict(held)
    taken: dict[str, int] = {}
    for _ in range(over):
        job = min((job for job, _ in spare if left[job.id] > 0),
                  key=lambda j: (-(held[j.share or ""] - entitled.get(j.share or "", 0.0)),
                                 -left[j.id], -j.created, j.id))
        left[job.id] -= 1
        held[job.share or ""] -= 1
        taken[job.id] = taken.get(job.id, 0) + 1
    return taken


class _Shares:
    """The working state of one allocation: workers per job and environment, slots per share."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.placement = {h.job.id: dict(h.placement) for h in pool.holdings}
        self.count = {h.job.id: h.workers for h in pool.holdings}
        self.free = dict(pool.free)
        self.moves: dict[tuple[str, str], int] = {}
        self.preempted: dict[str, str] = {}  # plain job -> why it is preempted
        self.reasons: dict[tuple[str, str], str] = {}
        active = {share_of(h) for h in pool.holdings} | {w.job.share or "" for w in pool.waiters}
        self.weight = {s: pool.weights.get(s, 1.0) for s in active}
        total_weight = sum(self.weight.values()) or 1.0
        slots = sum(pool.slots.values())
        self.entitled = {s: slots * w / total_weight for s, w in self.weight.items()}
        self.held = dict.fromkeys(active, 0)
        for h in pool.holdings:
            self.held[share_of(h)] += h.workers

    def over(self, share: str) -> float:
        return self.held[share] - self.entitled[share]

    def add(self, h: Holding, env: str, n: int, reason: str = "", *, to_free: bool = True
            ) -> None:
        self.placement[h.job.id][env] = self.placement[h.job.id].get(env, 0) + n
        self.count[h.job.id] += n
        self.held[share_of(h)] += n
        if n > 0 or to_free:
            self.free[env] -= n
        key = (h.job.id, env)
        self.moves[key] = self.moves.get(key, 0) + n
        if n < 0:
            self.reasons[key] = reason

    def free_on(self, envs: Sequence[str]) -> int:
        return sum(max(0, self.free.get(e, 0)) for e in envs)

    def undo_reserve(self, h: Holding, env: str) -> None:
        """Give back a worker taken with ``add(h, env, -1, to_free=False)``."""
        self.placement[h.job.id][env] += 1
        self.count[h.job.id] += 1
        self.held[share_of(h)] += 1
        self.moves[(h.job.id, env)] += 1

    def donor(self, receiver: str, envs: Sequence[str]) -> tuple[Holding, str] | None:
        """An elastic job of the most over-entitled share that may give ``receiver``'s share a
        worker on one of ``envs`` (the hysteresis band holds), and where."""
        best = None
        for h in self.pool.holdings:
            s = share_of(h)
            if (s == receiver or not h.job.preemptible or starting(h)
                    or self.count[h.job.id] <= h.job.min_workers
                    or self.over(s) - self.over(receiver) < BAND):
                continue
            env = next((e for e in envs if self.placement[h.job.id].get(e, 0) > 0), None)
            if env is None:
                continue
            key = (-self.over(s), -self.count[h.job.id], -h.job.created, h.job.id)
            if best is None or key < best[0]:
                best = (key, h, env)
        return None if best is None else (best[1], best[2])

    def result(self) -> list[Move]:
        moves = [Move(job, env, n, self.reasons.get((job, env), ""))
                 for (job, env), n in self.moves.items() if n != 0]
        moves.sort(key=lambda m: (m.count > 0, m.job, m.env))  # shrinks first
        return [Move(job, "", 0, why, suspend=True)
                for job, why in sorted(self.preempted.items())] + moves


class ShareGoodput(AllocationPolicy):
    """Shares first, goodput within a share (module doc).

    Args:
        max_moves: workers taken back from over-entitled shares per pass, at most.
    """

    name = "fairshare"
    reallocates = True
    share_aware = True

    def __init__(self, max_moves: int = 8) -> None:
        self.max_moves = max_moves

    def start_workers(self, job) -> int:
        return job.min_workers

    def allocate(self, pool: Pool) -> Sequence[Move]:
        plan = _Shares(pool)
        for waiter in self._make_room(plan):
            self._preempt_plain(plan, waiter)
        self._grow(plan)
        for _ in range(self.max_moves):
            if not self._take_back(plan):
                break
        return plan.result()

    @staticmethod
    def _gain(h: Holding, w: int) -> float:
        model = h.job.profile.model if h.job.profile is not None else PERFECT
        return model.marginal(w)

    def _make_room(self, plan: _Shares) -> list:
        """Phase 1; returns the waiters it could not make room for."""
        missed = []
        for waiter in plan.pool.waiters:
            share = waiter.job.share or ""
            taken: list[tuple[Holding, str]] = []
            for _ in range(waiter.short):
                found = plan.donor(share, waiter.envs)
                if found is None:
                    break
                plan.add(found[0], found[1], -1, to_free=False)
                plan.held[share] += 1  # counted as the waiter's from now on
                taken.append(found)
            if len(taken) < waiter.short:  # not enough: give every slot back
                for h, env in taken:
                    plan.undo_reserve(h, env)
                    plan.held[share] -= 1
                missed.append(waiter)
                continue
            for h, env in taken:
                plan.reasons[(h.job.id, env)] = (
                    f"fair share: making room for {waiter.job.id} of share {share or '-'} "
                    f"(entitled to {plan.entitled[share]:.1f} slots)")
        return missed

    @staticmethod
    def _preempt_plain(plan: _Shares, waiter) -> None:
        """Phase 1b: a waiter of a share below its entitlement for which no elastic job could
        shrink may have a plain job of an over-entitled share preempted whole, where that
        job's queue allows it (``Holding.may_preempt``): the most over-entitled share first,
        then its smallest job that frees enough on the waiter's environments, the newest on
        ties. Hysteresis as for a worker: freeing ``n`` slots needs ``(held_o - entitled_o) -
        (held_u - entitled_u) >= 2 n``, so the slots never come straight back."""
        share = waiter.job.share or ""
        if plan.over(share) >= 0:
            return
        best = None
        for h in plan.pool.holdings:
            s = share_of(h)
            n = plan.count[h.job.id]
            there = sum(plan.placement[h.job.id].get(e, 0) for e in waiter.envs)
            if (not h.may_preempt or s == share or starting(h) or h.job.id in plan.preempted
                    or there + plan.free_on(waiter.envs) < waiter.job.min_workers
                    or plan.over(s) - plan.over(share) < BAND * n):
                continue
            key = (-plan.over(s), n, -h.job.created, h.job.id)
            if best is None or key < best[0]:
                best = (key, h, s, n)
        if best is None:
            return
        _, h, s, n = best
        plan.preempted[h.job.id] = (
            f"fair share: preempted (its queue allows it) for {waiter.job.id} of share "
            f"{share or '-'}, entitled to {plan.entitled[share]:.1f} slots; share {s or '-'} "
            f"holds {plan.held[s]} of {plan.entitled[s]:.1f}")
        plan.held[s] -= n
        plan.held[share] += n
        plan.count[h.job.id] = 0

    def _grow(self, plan: _Shares) -> None:
        while True:
            best = None
            for h in plan.pool.holdings:
                w = plan.count[h.job.id]
                if w >= h.job.max_workers or starting(h) or h.job.id in plan.preempted:
                    continue
                env = next((e for e in h.envs if plan.free.get(e, 0) > 0), None)
                if env is None:
                    continue
                s = share_of(h)
                key = (plan.held[s] / plan.weight[s], -self._gain(h, w), w, h.job.created,
                       h.job.id)
                if best is None or key < best[0]:
                    best = (key, h, env)
            if best is None:
                return
            plan.add(best[1], best[2], 1)

    def _take_back(self, plan: _Shares) -> bool:
        """Phase 3: one worker from an over-entitled share's elastic job to the job of the
        share furthest below its entitlement that can grow on the same environment."""
        receivers = sorted((h for h in plan.pool.holdings
                            if plan.count[h.job.id] < h.job.max_workers and not starting(h)
                            and h.job.id not in plan.preempted),
                           key=lambda h: (plan.over(share_of(h)) / plan.weight[share_of(h)],
                                          -self._gain(h, plan.count[h.job.id]),
                                          plan.count[h.job.id], h.job.created, h.job.id))
        for r in receivers:
            found = plan.donor(share_of(r), r.envs)
            if found is None:
                continue
            donor, env = found
            plan.add(donor, env, -1, f"fair share: a worker goes back to share "
                                     f"{share_of(r) or '-'} ({r.job.id}), entitled to "
                                     f"{plan.entitled[share_of(r)]:.1f} slots")
            plan.add(r, env, 1)
            return True
        return False
