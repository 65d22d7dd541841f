"""Allocation policies through the real scheduler: fifo (the default), fair and goodput."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyntrain.service.core.allocation import FIFO, AllocationPolicy, Move, policy_by_name
from dyntrain.service.core.goodput import FairShare, Goodput, GoodputConfig
from dyntrain.service.core.model import CapacityType, JobStatus, Resources, ValidationError
from dyntrain.service.core.plan import EnvView, Grow, JobView, QueueView, Shrink, Snapshot
from dyntrain.service.core.scheduler import schedule
from dyntrain.service.core.speedup import JobProfile, SpeedupModel, ThroughputPoint

SLOT = Resources(cpus=1, gpus=0, memory_mib=1024)
LINEAR = SpeedupModel(parallel=1.0)
SATURATES_AT_2 = SpeedupModel(parallel=1.0, chunks=2)  # a third worker adds nothing


def env(name, slots, price=1.0, capacity=CapacityType.SPOT):
    return EnvView(name, capacity, price, SLOT, slots)


def profile(model, sizes=(1, 2, 4), reform_s=0.1, remaining=None):
    points = tuple(ThroughputPoint(w, model.throughput(w)) for w in sizes)
    return JobProfile(model, points, reform_s, remaining)


def running(job_id, placement, lo=1, hi=8, created=0.0, prof=None, q="q", preemptible=True):
    return JobView(job_id, q, created, SLOT, lo, hi, JobStatus.RUNNING, placement, preemptible,
                   prof)


def queued(job_id, created, lo=1, hi=8, q="q"):
    return JobView(job_id, q, created, SLOT, lo, hi)


def plan_of(envs, jobs, policy, queues=None):
    queues = queues or [QueueView("q", 1, tuple(e.name for e in envs))]
    return schedule(Snapshot(tuple(envs), tuple(queues), tuple(jobs)), policy)


def grown(plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in plan.grows:
        out[g.job] = out.get(g.job, 0) + g.count
    for s in plan.shrinks:
        out[s.job] = out.get(s.job, 0) - s.count
    return out


# --- the default -------------------------------------------------------------------------------

def test_fifo_starts_at_max_and_grows_the_oldest_first():
    jobs = [running("old", {"e": 1}, created=0), running("new", {"e": 1}, created=1),
            queued("waiting", 2, lo=1, hi=3)]
    plan = plan_of([env("e", 8)], jobs, FIFO)
    assert plan.starts[0].placement == {"e": 3}  # a start takes up to its max
    assert grown(plan) == {"old": 3}  # then rule 5: the oldest to its max, and so on
    assert plan_of([env("e", 8)], jobs, AllocationPolicy()) == plan
    assert schedule(Snapshot((env("e", 8),), (QueueView("q", 1, ("e",)),), tuple(jobs))) == plan


def test_policies_are_found_by_name():
    assert isinstance(policy_by_name("goodput"), Goodput)
    assert isinstance(policy_by_name("fair"), FairShare)
    assert policy_by_name("fifo").name == "fifo"
    with pytest.raises(ValidationError, match="unknown allocation policy 'srtf'"):
        policy_by_name("srtf")


# --- goodput -----------------------------------------------------------------------------------

def test_goodput_starts_jobs_at_their_min():
    plan = plan_of([env("e", 8)], [queued("a", 0, lo=2, hi=8)], Goodput())
    assert plan.starts[0].placement == {"e": 2}


def test_free_slots_go_where_the_next_worker_adds_most():
    jobs = [running("flat", {"e": 2}, created=0, prof=profile(SATURATES_AT_2)),
            running("linear", {"e": 2}, created=1, prof=profile(LINEAR))]
    plan = plan_of([env("e", 12)], jobs, Goodput())
    # fifo fills the older job first; goodput gives the flat job nothing (2 slots stay free)
    assert grown(plan_of([env("e", 12)], jobs, FIFO)) == {"flat": 6, "linear": 2}
    assert grown(plan) == {"linear": 6}


def test_a_job_not_yet_measured_grows_to_twice_its_min_first():
    plan = plan_of([env("e", 16)], [running("new", {"e": 1}, hi=16)], Goodput())
    assert grown(plan) == {"new": 1}
    plan = plan_of([env("e", 16)], [running("new", {"e": 2}, hi=16)], Goodput())
    assert grown(plan) == {}  # the next pass, still not measured: no further
    measured = profile(LINEAR, sizes=(2, 4))
    plan = plan_of([env("e", 16)], [running("new", {"e": 4}, hi=16, prof=measured)], Goodput())
    assert grown(plan) == {"new": 4}  # measured at 4: up to 8


def test_the_max_and_min_are_kept():
    jobs = [running("a", {"e": 3}, lo=3, hi=4, prof=profile(LINEAR))]
    assert grown(plan_of([env("e", 16)], jobs, Goodput())) == {"a": 1}
    flat = profile(SpeedupModel(serial=1.0, parallel=0.001), sizes=(1, 2, 3))
    jobs = [running("b", {"e": 3}, lo=2, hi=4, prof=flat)]
    assert grown(plan_of([env("e", 16)], jobs, Goodput())) == {"b": -1}  # released to its min


def test_higher_priority_grows_first_whatever_the_gain():
    queues = [QueueView("hi", 10, ("e",)), QueueView("lo", 1, ("e",))]
    model = SpeedupModel(serial=0.2, parallel=0.8)  # worker 2 adds 0.67, worker 3 0.48
    jobs = [running("important", {"e": 1}, q="hi", prof=profile(model, (1, 2))),
            running("linear", {"e": 1}, q="lo", prof=profile(LINEAR))]
    plan = plan_of([env("e", 4)], jobs, Goodput(), queues)
    assert grown(plan) == {"important": 2}
    same = [QueueView("hi", 1, ("e",)), QueueView("lo", 1, ("e",))]
    assert grown(plan_of([env("e", 4)], jobs, Goodput(), same)) == {"linear": 2}


def test_the_price_of_a_slot_counts():
    cheap = env("spot", 4, price=1.0)
    dear = env("od", 8, price=3.0, capacity=CapacityType.ON_DEMAND)
    queues = [QueueView("q", 1, ("od", "spot"))]  # even listed first, the dear one waits
    half = SpeedupModel(serial=0.5, parallel=0.5)  # worker 2 adds 0.33, worker 3 0.17, ...
    jobs = [running("good", {"spot": 1}, created=0, prof=profile(LINEAR)),
            running("poor", {"spot": 1}, created=1, prof=profile(half, (1, 2)))]
    plan = plan_of([cheap, dear], jobs, Goodput(), queues)
    by_env = {(g.job, g.env): g.count for g in plan.grows}
    assert by_env[("good", "spot")] == 2  # the best value per dollar takes the cheap slots
    assert ("poor", "spot") not in by_env
    assert ("poor", "od") not in by_env  # adds 0.33 < 0.25 x 3: not worth an on-demand slot
    assert by_env[("good", "od")] == 5  # a linear worker is worth even that, up to its max


def test_a_waiting_job_gets_room_down_to_the_fairness_floor():
    jobs = [running("big", {"e": 8}, created=0, prof=profile(LINEAR, (1, 2, 4, 8))),
            queued("late", 1, lo=2, hi=8)]
    first = plan_of([env("e", 8)], jobs, Goodput())
    assert first.starts == ()
    assert "late" in first.waiting
    assert [(s.job, s.count) for s in first.shrinks] == [("big", 2)]
    assert "making room for late" in first.shrinks[0].reason
    # fifo never shrinks a job of the same priority for a waiting one: it waits for the end
    assert plan_of([env("e", 8)], jobs, FIFO).shrinks == ()
    # next pass: the freed slots are there and it starts with its min
    jobs[0] = running("big", {"e": 6}, created=0, prof=profile(LINEAR, (1, 2, 4, 8)))
    second = plan_of([env("e", 8)], jobs, Goodput())
    assert second.starts[0].placement == {"e": 2}


def test_no_room_is_made_when_it_would_not_be_enough():
    jobs = [running("a", {"e": 3}, lo=3, prof=profile(LINEAR)),
            running("b", {"e": 1}, lo=1, preemptible=False),
            queued("wide", 1, lo=4, hi=4)]
    plan = plan_of([env("e", 4)], jobs, Goodput())
    assert plan.shrinks == () and plan.starts == ()


def test_hysteresis_moves_a_worker_only_when_the_gain_beats_the_reformation():
    flat = SpeedupModel(serial=0.5, parallel=0.5)  # its workers 4, 3, 2 add 0.1, 0.17, 0.33
    jobs = [running("flat", {"e": 4}, lo=1, hi=4, prof=profile(flat, (1, 2, 4), reform_s=60,
                                                              remaining=1e9)),
            running("linear", {"e": 4}, lo=1, hi=8, prof=profile(LINEAR, (1, 2, 4), reform_s=60,
                                                                remaining=1e9))]
    config = GoodputConfig(min_gain=0.0, fair_floor=0.0)
    plan = plan_of([env("e", 8)], jobs, Goodput(config))
    assert grown(plan) == {"flat": -3, "linear": 3}  # down to its min: each move gains
    # the same move with 2 minutes of work left does not pay for two re-formations of 60 s
    short = [running(j.id, j.placement, j.min_workers, j.max_workers, j.created,
                     JobProfile(j.profile.model, j.profile.points, 60, 120 * j.profile.model
                                .throughput(5)))
             for j in jobs]
    assert grown(plan_of([env("e", 8)], short, Goodput(config))) == {}


def test_a_buggy_policy_is_stopped_by_the_scheduler():
    class Greedy(AllocationPolicy):
        name = "greedy"
        reallocates = True

        def allocate(self, pool):
            return [Move("a", "e", 5)]

    with pytest.raises(ValidationError, match="policy greedy: cannot grow a by 5 on e"):
        plan_of([env("e", 4)], [running("a", {"e": 1})], Greedy())


# --- fair share --------------------------------------------------------------------------------

def test_fair_share_splits_evenly():
    jobs = [running("a", {"e": 1}, created=0), running("b", {"e": 3}, created=1),
            running("c", {"e": 1}, created=2, hi=2)]
    plan = plan_of([env("e", 9)], jobs, FairShare())
    assert grown(plan) == {"a": 3, "c": 1}  # 4, 3, 2 (c's max): water-filling
    crowded = [running("a", {"e": 6}, created=0), running("b", {"e": 1}, created=1),
               running("c", {"e": 1}, created=2)]
    plan = plan_of([env("e", 8)], crowded, FairShare())
    assert grown(plan) == {"a": -3, "b": 1, "c": 2} or grown(plan) == {"a": -3, "b": 2, "c": 1}


# --- every policy keeps the rules --------------------------------------------------------------

@st.composite
def snapshots(draw):
    envs = [env(f"e{i}", draw(st.integers(0, 12)), price=draw(st.sampled_from([0.0, 1.0, 3.0])))
            for i in range(draw(st.integers(1, 3)))]
    free = {e.name: e.available_slots for e in envs}
    jobs = []
    for i in range(draw(st.integers(0, 6))):
        lo = draw(st.integers(1, 3))
        hi = draw(st.integers(lo, 10))
        if draw(st.booleans()):
            jobs.append(queued(f"q{i}", float(i), lo, hi))
            continue
        placement = {}
        for e in envs:
            n = min(free[e.name], draw(st.integers(0, 3)))
            if n:
                placement[e.name] = n
                free[e.name] -= n
        n = sum(placement.values())
        if not lo <= n <= hi:
            continue
        model = draw(st.sampled_from([LINEAR, SATURATES_AT_2, SpeedupModel(0.3, 0.7, 0.05)]))
        prof = draw(st.sampled_from([None, profile(model, (1,)), profile(model, (1, 2, 4))]))
        jobs.append(running(f"r{i}", placement, lo, hi, float(i), prof,
                            preemptible=draw(st.booleans())))
    return envs, jobs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.sampled_from(["fifo", "fair", "goodput"]))
def test_every_policy_keeps_slots_min_max_and_unshrinkable_jobs(snap, name):
    envs, jobs = snap
    plan = plan_of(envs, jobs, policy_by_name(name))
    held = {e.name: 0 for e in envs}
    views = {j.id: j for j in jobs}
    after = {j.id: dict(j.placement) for j in jobs if j.status is JobStatus.RUNNING}
    for s in plan.starts:
        after[s.job] = dict(s.placement)
        assert views[s.job].min_workers <= s.workers <= views[s.job].max_workers
    for d in plan.grows + plan.shrinks:
        sign = 1 if isinstance(d, Grow) else -1
        assert isinstance(d, (Grow, Shrink)) and d.count > 0
        after[d.job][d.env] = after[d.job].get(d.env, 0) + sign * d.count
        if sign < 0:
            assert views[d.job].preemptible
    for s in plan.suspends:
        after.pop(s.job)
    for job_id, placement in after.items():
        n = sum(placement.values())
        assert views[job_id].min_workers <= n <= views[job_id].max_workers
        assert all(v >= 0 for v in placement.values())
        for e, v in placement.items():
            held[e] += v
    for e in envs:
        assert held[e.name] <= e.available_slots


def test_a_worker_does_not_move_for_a_small_gain():
    # a's workers 4, 3 and 2 add 0.58, 0.68 and 0.82; b's next worker adds 1.0
    slightly = SpeedupModel(serial=0.0, parallel=1.0, comm=0.0)
    a = SpeedupModel(serial=0.1, parallel=0.9)
    jobs = [running("a", {"e": 4}, lo=1, hi=8, prof=profile(a, (1, 2, 4), remaining=1e9)),
            running("b", {"e": 4}, lo=1, hi=8, created=1,
                    prof=profile(slightly, (1, 2, 4), remaining=1e9))]
    config = GoodputConfig(min_gain=0.0, fair_floor=0.0, move_gain=0.6)
    assert grown(plan_of([env("e", 8)], jobs, Goodput(config))) == {}
    config = GoodputConfig(min_gain=0.0, fair_floor=0.0, move_gain=0.3)  # 0.42, 0.32: moved
    assert grown(plan_of([env("e", 8)], jobs, Goodput(config))) == {"a": -2, "b": 2}
