"""The scheduling policy: snapshots in, plans out (no processes, no store)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyntrain.service.core.model import CapacityType, JobStatus, Resources, State, ValidationError
from dyntrain.service.core.plan import (
    EnvView,
    Grow,
    JobView,
    QueueView,
    Shrink,
    Snapshot,
    Start,
    Suspend,
    WaitInfo,
)
from dyntrain.service.core.scheduler import schedule

SMALL = Resources(cpus=1, gpus=0, memory_mib=1024)
GPU = Resources(cpus=4, gpus=1, memory_mib=8192)


def env(name, slots, slot=GPU, state=State.ENABLED, capacity=CapacityType.ON_DEMAND):
    return EnvView(name, capacity, 1.0, slot, slots, state)


def queue(name, priority, *envs, state=State.ENABLED):
    return QueueView(name, priority, envs, state)


def queued(job_id, q, created, lo=1, hi=None, resources=SMALL):
    return JobView(job_id, q, created, resources, lo, hi or lo)


def running(job_id, q, created, placement, lo=1, hi=None, preemptible=True, resources=SMALL):
    return JobView(job_id, q, created, resources, lo, hi or lo, JobStatus.RUNNING, placement,
                   preemptible)


def plan_of(envs, queues, jobs):
    return schedule(Snapshot(tuple(envs), tuple(queues), tuple(jobs)))


# --- admission -------------------------------------------------------------------------------

def test_a_job_the_executor_refused_waits_with_its_reason_blocks_its_queue_and_shrinks_nobody():
    reason = "waiting for room on the executor: worker w needs cpus=1; free: cpus=0"
    jobs = [running("low", "lo", 0, {"e": 3}, lo=1, hi=3), queued("held", "hi", 1),
            queued("behind", "hi", 2)]
    queues = [queue("lo", 1, "e"), queue("hi", 10, "e")]
    plan = schedule(Snapshot((env("e", 4),), tuple(queues), tuple(jobs), held={"held": reason}))
    assert (plan.starts, plan.shrinks, plan.grows) == ((), (), ())
    assert plan.waiting["held"] == WaitInfo(reason, 1)
    assert plan.waiting["behind"] == WaitInfo(f"queued behind held, which is {reason}", 2)
    # once no longer held, it starts in the free slot
    assert plan_of([env("e", 4)], queues, jobs).starts[0] == Start("held", {"e": 1})


def test_higher_priority_queue_starts_first_even_when_submitted_later():
    plan = plan_of([env("e", 2)], [queue("lo", 1, "e"), queue("hi", 10, "e")],
                   [queued("old-lo", "lo", 0, 2), queued("new-hi", "hi", 1, 2)])
    assert plan.starts == (Start("new-hi", {"e": 2}),)
    assert plan.waiting["old-lo"].position == 1
    assert "waiting for 2 more slots in lo's environments (e: 0 free of 2)" in (
        plan.waiting["old-lo"].reason)


def test_fifo_within_a_queue_by_created_then_id():
    jobs = [queued("c", "q", 3), queued("b", "q", 1), queued("a", "q", 1), queued("d", "q", 2)]
    plan = plan_of([env("e", 2)], [queue("q", 1, "e")], jobs)
    assert [s.job for s in plan.starts] == ["a", "b"]
    assert plan.waiting["d"].position == 1
    assert plan.waiting["c"].position == 2


def test_fills_the_first_environment_then_spills_to_the_next():
    envs = [env("first", 2), env("second", 5)]
    plan = plan_of(envs, [queue("q", 1, "first", "second")], [queued("j", "q", 0, 3)])
    assert plan.starts == (Start("j", {"first": 2, "second": 1}),)
    plan = plan_of(envs, [queue("q", 1, "second", "first")], [queued("j", "q", 0, 3)])
    assert plan.starts == (Start("j", {"second": 3}),)


def test_gang_admission_waits_until_min_fits_at_once():
    plan = plan_of([env("a", 2), env("b", 1)], [queue("q", 1, "a", "b")],
                   [queued("big", "q", 0, 4, 6)])
    assert plan.starts == ()
    info = plan.waiting["big"]
    assert info.position == 1
    assert info.reason == ("waiting for 1 more slot in q's environments (a: 2 free of 2, "
                           "b: 1 free of 1); it needs 4 at once")


def test_starts_with_as_many_workers_as_fit_up_to_max():
    plan = plan_of([env("e", 5)], [queue("q", 1, "e")], [queued("j", "q", 0, 2, 8)])
    assert plan.starts == (Start("j", {"e": 5}),)
    plan = plan_of([env("e", 10)], [queue("q", 1, "e")], [queued("j", "q", 0, 2, 8)])
    assert plan.starts == (Start("j", {"e": 8}),)


def test_head_of_line_blocks_later_jobs_of_the_same_queue():
    plan = plan_of([env("e", 2)], [queue("q", 1, "e")],
                   [queued("big", "q", 0, 3), queued("small", "q", 1, 1)])
    assert plan.starts == ()
    assert plan.waiting["small"] == WaitInfo(
        "queued behind big, which is " + plan.waiting["big"].reason, 2)


def test_job_that_can_never_fit_gets_a_reason_and_blocks_nobody():
    huge = Resources(cpus=8, gpus=0, memory_mib=1024)
    plan = plan_of([env("e", 2)], [queue("q", 1, "e")],
                   [queued("huge", "q", 0, resources=huge), queued("ok", "q", 1)])
    assert plan.starts == (Start("ok", {"e": 1}),)
    assert plan.waiting["huge"] == WaitInfo(
        "needs cpus=8, gpus=0, memory_mib=1024 per worker, but the largest slot of queue q's "
        "compute environments is cpus=4, gpus=1, memory_mib=8192 (e): it can never run", 1)


def test_waiting_positions_and_shared_reason_behind_a_blocked_head():
    huge = Resources(cpus=64)
    jobs = [queued(f"j{i}", "q", i) for i in range(6)]
    jobs[4] = queued("j4", "q", 4, resources=huge)
    plan = plan_of([env("e", 2)], [queue("q", 1, "e")], jobs)
    assert [s.job for s in plan.starts] == ["j0", "j1"]
    assert {k: v.position for k, v in plan.waiting.items()} == {"j2": 1, "j3": 2, "j4": 3,
                                                                 "j5": 4}
    assert plan.waiting["j3"].reason.startswith("queued behind j2, which is waiting for 1 more")
    assert "can never run" in plan.waiting["j4"].reason
    assert plan.waiting["j5"].reason == plan.waiting["j3"].reason
    assert len(plan.waiting) == 4 and "j0" not in plan.waiting and "j4" in plan.waiting
    assert dict(plan.waiting) == {k: plan.waiting[k] for k in ("j2", "j3", "j4", "j5")}


def test_waiting_of_a_job_by_its_place_matches_the_id_lookup():
    # of() binary-searches the tails (what the API uses); it must agree with plan.waiting[id]
    jobs = [queued(f"j{i:03d}", "q", i // 3) for i in range(60)]  # ties in created go by id
    jobs[40] = queued("j040", "q", 40 // 3, resources=Resources(cpus=64))
    plan = plan_of([env("e", 2)], [queue("q", 1, "e")], jobs)
    for job in jobs:
        assert plan.waiting.of(job.id, job.created) == plan.waiting.get(job.id)
    assert plan.waiting.of("j000", 0) is None and plan.waiting.of("j005", 1).position == 4
    assert plan.waiting.of("nope", 1.0) is None


def test_disabled_queue_starts_nothing_and_its_running_jobs_do_not_grow():
    jobs = [queued("a", "q", 1), queued("b", "q", 2),
            running("r", "q", 0, {"e": 1}, 1, 4)]
    plan = plan_of([env("e", 4)], [queue("q", 1, "e", state=State.DISABLED)], jobs)
    assert plan.starts == () and plan.grows == () and plan.shrinks == ()
    assert plan.waiting["a"] == WaitInfo("queue q is DISABLED", 1)
    assert plan.waiting["b"] == WaitInfo("queue q is DISABLED", 2)


def test_disabled_environment_takes_no_new_workers_but_keeps_running_ones():
    envs = [env("off", 4, state=State.DISABLED), env("on", 1)]
    jobs = [running("r", "q", 0, {"off": 2}, 1, 4), queued("a", "q", 1), queued("b", "q", 2)]
    plan = plan_of(envs, [queue("q", 1, "off", "on")], jobs)
    assert plan.starts == (Start("a", {"on": 1}),)
    assert plan.shrinks == () and plan.suspends == () and plan.grows == ()
    assert "(off: DISABLED, on: 0 free of 1)" in plan.waiting["b"].reason


def test_unknown_queue_waits_with_a_reason():
    plan = plan_of([env("e", 1)], [queue("q", 1, "e")], [queued("j", "gone", 0)])
    assert plan.waiting["j"] == WaitInfo("queue gone does not exist", 1)


# --- backfill across queues -------------------------------------------------------------------

def test_blocked_head_reserves_its_environments_and_lower_queues_backfill_the_rest():
    envs = [env("gpu", 2), env("cpu", 4, slot=SMALL)]
    queues = [queue("hi", 10, "gpu"), queue("lo", 1, "gpu", "cpu"), queue("lo2", 0, "gpu")]
    jobs = [queued("train", "hi", 0, 3, resources=GPU), queued("etl", "lo", 1, 2),
            queued("eval", "lo2", 2, 1)]
    plan = plan_of(envs, queues, jobs)
    assert plan.starts == (Start("etl", {"cpu": 2}),)  # not on gpu: hi's head needs it
    assert "(gpu: held for queue hi)" in plan.waiting["eval"].reason
    assert "waiting for 1 more slot in hi's environments (gpu: 2 free of 2)" in (
        plan.waiting["train"].reason)


def test_lower_queue_backfills_an_environment_whose_slots_are_too_small_for_the_head():
    envs = [env("small", 3, slot=SMALL), env("big", 1)]
    queues = [queue("hi", 10, "small", "big"), queue("lo", 1, "small")]
    jobs = [queued("head", "hi", 0, 2, resources=GPU), queued("filler", "lo", 1, 3)]
    plan = plan_of(envs, queues, jobs)
    assert plan.starts == (Start("filler", {"small": 3}),)
    assert "small: slots too small, big: 1 free of 1" in plan.waiting["head"].reason


def test_running_jobs_do_not_grow_into_a_blocked_heads_reservation():
    jobs = [running("low", "lo", 0, {"e": 1}, 1, 4), queued("head", "hi", 1, 4)]
    plan = plan_of([env("e", 3)], [queue("hi", 10, "e"), queue("lo", 1, "e")], jobs)
    assert plan.grows == () and plan.starts == ()
    assert plan.waiting["head"].reason.startswith("waiting for 2 more slots")


# --- growth -------------------------------------------------------------------------------

def test_running_elastic_job_grows_into_free_slots_cheapest_environment_first():
    envs = [env("cheap", 2, capacity=CapacityType.SPOT), env("dear", 5)]
    plan = plan_of(envs, [queue("q", 1, "cheap", "dear")],
                   [running("r", "q", 0, {"dear": 1}, 1, 5)])
    assert plan.grows == (Grow("r", "cheap", 2), Grow("r", "dear", 2))


def test_growth_goes_to_higher_priority_first_then_oldest():
    queues = [queue("hi", 10, "e"), queue("lo", 1, "e")]
    jobs = [running("lo-old", "lo", 0, {"e": 1}, 1, 4), running("hi-new", "hi", 5, {"e": 1}, 1, 2),
            running("hi-old", "hi", 1, {"e": 1}, 1, 3)]
    plan = plan_of([env("e", 5)], queues, jobs)
    assert plan.grows == (Grow("hi-old", "e", 2),)
    plan = plan_of([env("e", 7)], queues, jobs)
    assert plan.grows == (Grow("hi-old", "e", 2), Grow("hi-new", "e", 1), Grow("lo-old", "e", 1))


def test_queued_jobs_are_admitted_before_running_jobs_grow():
    plan = plan_of([env("e", 3)], [queue("q", 1, "e")],
                   [running("r", "q", 0, {"e": 1}, 1, 4), queued("new", "q", 1, 1)])
    assert plan.starts == (Start("new", {"e": 1}),)
    assert plan.grows == (Grow("r", "e", 1),)


# --- capacity loss --------------------------------------------------------------------------

def test_capacity_loss_shrinks_an_elastic_job_gracefully():
    plan = plan_of([env("spot", 2, capacity=CapacityType.SPOT)], [queue("q", 1, "spot")],
                   [running("r", "q", 0, {"spot": 4}, 1, 4)])
    assert plan.shrinks == (Shrink("r", "spot", 2, "capacity lost on spot: 2 slots left for 4 "
                                                   "workers"),)
    assert plan.suspends == ()


def test_capacity_loss_takes_lowest_priority_then_newest_first():
    queues = [queue("hi", 10, "spot"), queue("lo", 1, "spot")]
    jobs = [running("hi", "hi", 0, {"spot": 3}, 1, 3),
            running("lo-old", "lo", 1, {"spot": 3}, 1, 3),
            running("lo-new", "lo", 2, {"spot": 3}, 1, 3)]
    plan = plan_of([env("spot", 6)], queues, jobs)
    assert [(s.job, s.count) for s in plan.shrinks] == [("lo-new", 2), ("lo-old", 1)]


def test_capacity_loss_never_shrinks_below_min_and_suspends_instead():
    plan = plan_of([env("spot", 2)], [queue("q", 1, "spot")],
                   [running("r", "q", 0, {"spot": 4}, 3, 4)])
    assert plan.shrinks == ()
    assert plan.suspends == (Suspend("r", "capacity lost on spot: 2 slots left for 4 workers; "
                                          "shrinking the jobs there to their min is not enough"),)


def test_non_elastic_job_on_lost_capacity_is_suspended():
    plan = plan_of([env("spot", 0)], [queue("q", 1, "spot")], [running("r", "q", 0, {"spot": 1})])
    assert [s.job for s in plan.suspends] == ["r"]


def test_capacity_loss_prefers_shrinking_to_suspending():
    queues = [queue("hi", 10, "spot"), queue("lo", 1, "spot")]
    jobs = [running("lo", "lo", 1, {"spot": 2}, 2, 2), running("hi", "hi", 0, {"spot": 4}, 1, 4)]
    plan = plan_of([env("spot", 3)], queues, jobs)  # 3 workers must go; hi can shed 3
    assert [(s.job, s.count) for s in plan.shrinks] == [("hi", 3)] and plan.suspends == ()
    plan = plan_of([env("spot", 2)], queues, jobs)  # 4 must go: suspend lo, then shrink hi by 2
    assert [s.job for s in plan.suspends] == ["lo"]
    assert [(s.job, s.count) for s in plan.shrinks] == [("hi", 2)]


def test_suspended_jobs_slots_elsewhere_go_to_queued_jobs_in_the_same_pass():
    envs = [env("spot", 0), env("od", 2)]
    jobs = [running("r", "q", 0, {"spot": 1, "od": 2}, 3, 3), queued("next", "q", 1, 2)]
    plan = plan_of(envs, [queue("q", 1, "spot", "od")], jobs)
    assert [s.job for s in plan.suspends] == ["r"] and plan.shrinks == ()
    assert plan.starts == (Start("next", {"od": 2}),)


def test_capacity_loss_shrink_then_growth_moves_workers_to_another_environment():
    envs = [env("spot", 1), env("od", 3)]
    plan = plan_of(envs, [queue("q", 1, "spot", "od")], [running("r", "q", 0, {"spot": 3}, 1, 3)])
    assert [(s.env, s.count) for s in plan.shrinks] == [("spot", 2)]
    assert plan.grows == (Grow("r", "od", 2),)


def test_environment_that_disappeared_counts_as_lost_capacity():
    plan = plan_of([env("e", 1)], [queue("q", 1, "e")], [running("r", "q", 0, {"gone": 1})])
    assert plan.suspends == (Suspend("r", "capacity lost on gone: 0 slots left for 1 workers; "
                                          "shrinking the jobs there to their min is not enough"),)


# --- preemption for priority ----------------------------------------------------------------

def test_lower_priority_elastic_job_shrinks_to_admit_a_higher_priority_job():
    queues = [queue("hi", 10, "e"), queue("lo", 1, "e")]
    jobs = [running("low", "lo", 0, {"e": 4}, 1, 4), queued("urgent", "hi", 1, 2, 3)]
    plan = plan_of([env("e", 4)], queues, jobs)
    assert plan.shrinks == (Shrink("low", "e", 2, "making room for higher-priority job urgent "
                                                  "(queue hi, priority 10)"),)
    assert plan.starts == (Start("urgent", {"e": 2}),)
    assert plan.grows == ()


def test_preemption_takes_newest_lowest_priority_first_and_only_the_missing_slots():
    queues = [queue("hi", 10, "e"), queue("mid", 5, "e"), queue("lo", 1, "e")]
    jobs = [running("mid", "mid", 2, {"e": 2}, 1, 2), running("lo-old", "lo", 0, {"e": 2}, 1, 2),
            running("lo-new", "lo", 1, {"e": 2}, 1, 2), queued("urgent", "hi", 3, 3)]
    plan = plan_of([env("e", 6)], queues, jobs)
    assert [(s.job, s.count) for s in plan.shrinks] == [("lo-new", 1), ("lo-old", 1), ("mid", 1)]
    assert plan.starts == (Start("urgent", {"e": 3}),)


def test_consecutive_heads_preempt_until_lower_priority_spare_runs_out():
    queues = [queue("hi", 10, "e"), queue("lo", 1, "e")]
    jobs = [running("lo-old", "lo", 0, {"e": 2}, 1, 2), running("lo-new", "lo", 1, {"e": 2}, 1, 2),
            queued("h1", "hi", 2), queued("h2", "hi", 3), queued("h3", "hi", 4)]
    plan = plan_of([env("e", 4)], queues, jobs)
    assert [(s.job, s.count) for s in plan.shrinks] == [("lo-new", 1), ("lo-old", 1)]
    assert [s.job for s in plan.starts] == ["h1", "h2"]
    assert plan.waiting["h3"].position == 1


def test_no_preemption_when_it_would_not_free_enough():
    queues = [queue("hi", 10, "e"), queue("lo", 1, "e")]
    jobs = [running("low", "lo", 0, {"e": 4}, 3, 4), queued("urgent", "hi", 1, 2)]
    plan = plan_of([env("e", 4)], queues, jobs)
    assert plan.shrinks == () and plan.starts == ()
    assert plan.waiting["urgent"].reason.startswith("waiting for 2 more slots")


@pytest.mark.parametrize("victim", [
    running("low", "lo", 0, {"e": 4}, 1, 4, preemptible=False),
    running("low", "peer", 0, {"e": 4}, 1, 4),
])
def test_no_preemption_of_non_preemptible_or_equal_priority_jobs(victim):
    queues = [queue("hi", 10, "e"), queue("peer", 10, "e"), queue("lo", 1, "e")]
    plan = plan_of([env("e", 4)], queues, [victim, queued("urgent", "hi", 1, 1)])
    assert plan.shrinks == () and plan.starts == ()


# --- validation, determinism, scale ---------------------------------------------------------

@pytest.mark.parametrize("kwargs", [dict(min_workers=3, max_workers=2),
                                    dict(status=JobStatus.SUCCEEDED),
                                    dict(placement={"e": -1})])
def test_job_view_rejects_what_the_scheduler_cannot_handle(kwargs):
    with pytest.raises(ValidationError):
        JobView("j", "q", 0, **kwargs)


def test_snapshot_rejects_duplicate_environment_names():
    with pytest.raises(ValidationError, match="appears twice"):
        Snapshot((env("e", 1), env("e", 2)), (), ())


def test_same_snapshot_in_any_job_order_gives_the_same_plan():
    rng = random.Random(7)
    envs = [env("spot", 3), env("od", 4, slot=SMALL), env("res", 2)]
    queues = [queue("hi", 5, "spot", "res"), queue("lo", 1, "od", "spot")]
    jobs = [queued(f"q{i}", rng.choice(["hi", "lo"]), rng.randrange(5), rng.randint(1, 2),
                   rng.randint(2, 4)) for i in range(30)]
    jobs += [running("r1", "lo", -1, {"spot": 3}, 1, 4), running("r2", "hi", -2, {"res": 1}, 1, 3)]
    first = plan_of(envs, queues, jobs)
    assert first == plan_of(envs, queues, jobs)
    assert first == plan_of(envs, queues, list(reversed(jobs)))
    assert first.starts or first.grows


def test_presorted_queues_give_the_plan_of_unsorted_jobs():
    rng = random.Random(11)
    envs = [env("spot", 3), env("od", 4, slot=SMALL)]
    queues = [queue("hi", 5, "spot"), queue("lo", 1, "od", "spot")]
    waiting = [queued(f"q{i}", rng.choice(["hi", "lo"]), rng.randrange(5), rng.randint(1, 2),
                      rng.randint(2, 4)) for i in range(40)]
    active = [running("r1", "lo", -1, {"spot": 2}, 1, 4)]
    by_queue: dict[str, list[JobView]] = {}
    for job in sorted(waiting, key=lambda j: (j.created, j.id)):
        by_queue.setdefault(job.queue, []).append(job)
    presorted = schedule(Snapshot(tuple(envs), tuple(queues), tuple(active),
                                  {q: tuple(js) for q, js in by_queue.items()}))
    plain = plan_of(envs, queues, waiting + active)
    assert presorted.starts == plain.starts and presorted.grows == plain.grows
    assert dict(presorted.waiting.items()) == dict(plain.waiting.items())


def test_a_pass_over_many_queued_jobs_is_cheap_once_capacity_is_exhausted():
    jobs = [queued(f"j{i}", f"q{i % 3}", i) for i in range(30_000)]
    queues = [queue(f"q{k}", k, "e") for k in range(3)]
    plan = plan_of([env("e", 10)], queues, jobs)
    assert sum(s.workers for s in plan.starts) == 10
    assert len(plan.waiting) == 30_000 - 10
    assert plan.waiting["j29999"].position == 10_000 - 10  # q2 runs first; 10 of it started


# --- invariants on random snapshots ---------------------------------------------------------

SIZES = [SMALL, SMALL, Resources(cpus=2, gpus=0, memory_mib=4096), GPU, Resources(cpus=16)]
SLOTS = [Resources(cpus=4, gpus=0, memory_mib=8192), Resources(cpus=8, gpus=1, memory_mib=32768)]


@st.composite
def snapshots(draw):
    """Up to 4 environments, 3 queues, 4 running and 10 queued jobs; slots near what is placed,
    so that capacity is often short (shrinks, suspensions, preemption) and sometimes free."""
    names = [f"e{i}" for i in range(draw(st.integers(1, 4)))]
    queues = [QueueView(f"q{i}", draw(st.integers(0, 3)),
                        tuple(draw(st.permutations(names))[:draw(st.integers(1, len(names)))]),
                        draw(st.sampled_from([State.ENABLED] * 5 + [State.DISABLED])))
              for i in range(draw(st.integers(1, 3)))]
    jobs, placed = [], Counter()
    for i in range(draw(st.integers(0, 4))):
        q = draw(st.sampled_from(queues))
        where = {e: draw(st.integers(1, 3)) for e in draw(st.sets(st.sampled_from(
            q.compute_environments), min_size=1))}
        placed.update(where)
        total = sum(where.values())
        lo = draw(st.integers(1, total))
        jobs.append(JobView(f"r{i}", q.name, draw(st.integers(0, 9)), SMALL, lo,
                            draw(st.integers(total, total + 3)),
                            draw(st.sampled_from([JobStatus.RUNNING, JobStatus.STARTING])),
                            where, draw(st.booleans())))
    for i in range(draw(st.integers(1, 10))):
        lo = draw(st.integers(1, 3))
        jobs.append(JobView(f"j{i}", draw(st.sampled_from(queues)).name, draw(st.integers(0, 9)),
                            draw(st.sampled_from(SIZES)), lo, draw(st.integers(lo, lo + 3))))
    envs = [EnvView(name, CapacityType.SPOT, 1.0, draw(st.sampled_from(SLOTS)),
                    max(0, placed[name] + draw(st.integers(-2, 3))),
                    draw(st.sampled_from([State.ENABLED] * 4 + [State.DISABLED])))
            for name in names]
    return Snapshot(tuple(envs), tuple(queues), tuple(jobs))


def _final_placements(snap, plan):
    """job -> Counter(env -> workers) after the plan is applied; suspended jobs are absent."""
    final = {j.id: Counter(j.placement) for j in snap.jobs if j.status is not JobStatus.RUNNABLE}
    for s in plan.shrinks:
        final[s.job][s.env] -= s.count
    for g in plan.grows:
        final[g.job][g.env] += g.count
    for s in plan.suspends:
        del final[s.job]
    for s in plan.starts:
        final[s.job] = Counter(s.placement)
    return final


def _could_use(queue, job, envs):
    return {e for e in queue.compute_environments
            if envs[e].state is State.ENABLED and job.resources.fits_in(envs[e].slot)}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_invariants_hold_on_random_snapshots(snap):
    plan = schedule(snap)
    envs = {e.name: e for e in snap.envs}
    queues = {q.name: q for q in snap.queues}
    jobs = {j.id: j for j in snap.jobs}
    final = _final_placements(snap, plan)

    # never more workers than slots on any environment; never a negative count
    used = Counter()
    for where in final.values():
        assert all(n >= 0 for n in where.values())
        used.update(where)
    for name, n in used.items():
        assert n <= (envs[name].available_slots if name in envs else 0), name

    # every job keeps within [min, max]; new workers only where its queue allows
    for job_id, where in final.items():
        job = jobs[job_id]
        assert job.min_workers <= sum(where.values()) <= job.max_workers
    for job_id, env_name in [(s.job, e) for s in plan.starts for e in s.placement] + [
            (g.job, g.env) for g in plan.grows]:
        job, q = jobs[job_id], queues[jobs[job_id].queue]
        assert q.state is State.ENABLED and env_name in _could_use(q, job, envs)

    # every queued job that did not start has a reason and a FIFO position in its queue
    started = {s.job for s in plan.starts}
    runnable = {j.id for j in snap.jobs if j.status is JobStatus.RUNNABLE}
    assert started <= runnable and set(plan.waiting) == runnable - started
    for q in queues:
        waiting = sorted((jobs[k] for k in plan.waiting if jobs[k].queue == q),
                         key=lambda j: (j.created, j.id))
        assert [plan.waiting[j.id].position for j in waiting] == list(range(1, len(waiting) + 1))

    # a higher-priority queue's first waiting job never watches a lower-priority job take
    # capacity it could have used
    taken = [(s.job, e) for s in plan.starts for e in s.placement] + [
        (g.job, g.env) for g in plan.grows]
    for q in queues.values():
        heads = sorted((jobs[k] for k, info in plan.waiting.items()
                        if jobs[k].queue == q.name and "can never run" not in info.reason),
                       key=lambda j: plan.waiting[j.id].position)
        if q.state is State.DISABLED or not heads:
            continue
        usable = _could_use(q, heads[0], envs)
        for job_id, env_name in taken:
            if queues[jobs[job_id].queue].priority < q.priority:
                assert env_name not in usable, (heads[0].id, job_id, env_name)

    # deterministic, whatever the order of the jobs in the snapshot
    assert schedule(Snapshot(snap.envs, snap.queues, snap.jobs[::-1])) == plan
