"""The fair-share policy, pure: AWS's weights, prefixes and ranges, entitlements with the
compute reservation, usage decay, admission order, and the ``fairshare`` allocation (growth by
share, taking slots back by shrinking elastic jobs, hysteresis)."""

from __future__ import annotations

import pytest

from dyntrain.service.core.allocation import policy_by_name
from dyntrain.service.core.fairshare import (
    FairsharePolicy,
    ShareAttributes,
    ShareUsage,
    check_share,
    entitlements,
    fair_order,
)
from dyntrain.service.core.fairshare_alloc import shed_by_share
from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.plan import EnvView, JobView, QueueView, Snapshot
from dyntrain.service.core.scheduler import schedule

POLICY = FairsharePolicy(0, 0, (ShareAttributes("blue", 0.5), ShareAttributes("red*", 1.0)))


def queue(policy: FairsharePolicy = POLICY) -> QueueView:
    return QueueView("q", 1, ("e",), fairshare=policy)


def running(job_id: str, share: str, workers: int, lo: int = 1, hi: int = 8,
            created: float = 1.0) -> JobView:
    return JobView(job_id, "q", created, min_workers=lo, max_workers=hi, status="RUNNING",
                   placement={"e": workers}, share=share)


def queued(job_id: str, share: str, created: float, priority: int = 0, lo: int = 1,
           hi: int = 8) -> JobView:
    return JobView(job_id, "q", created, min_workers=lo, max_workers=hi, share=share,
                   scheduling_priority=priority)


def test_weights_prefixes_and_aws_ranges():
    assert POLICY.weight("blue") == 2.0
    assert POLICY.weight("red7") == 1.0 and POLICY.weight("green") == 1.0
    longest = FairsharePolicy(shares=(ShareAttributes("a*", 2.0), ShareAttributes("b", 4.0)))
    assert longest.weight_factor("ab") == 2.0
    for bad, text in (({"compute_reservation": 100}, "computeReservation"),
                      ({"share_decay_seconds": 604801}, "shareDecaySeconds"),
                      ({"shares": (ShareAttributes("a*"), ShareAttributes("ab"))}, "overlaps")):
        with pytest.raises(ValidationError, match=text):
            FairsharePolicy(**bad)
    with pytest.raises(ValidationError, match="weightFactor"):
        ShareAttributes("a", 0.0)
    with pytest.raises(ValidationError, match="needs a shareIdentifier"):
        check_share("q", "teams", None, None)
    with pytest.raises(ValidationError, match="no fair share"):
        check_share("q", None, "blue", None)
    with pytest.raises(ValidationError, match="between 0 and 9999"):
        check_share("q", "teams", "blue", 10000)


def test_entitlements_keep_the_compute_reservation():
    half = FairsharePolicy(0, 50, POLICY.shares)
    assert entitlements(half, ["blue"], 8) == {"blue": 4.0}  # 50 % kept for others
    got = entitlements(half, ["blue", "red1"], 8)  # 25 % kept; blue twice red
    assert got == pytest.approx({"blue": 4.0, "red1": 2.0})


def test_usage_decays_over_the_window():
    usage = ShareUsage()
    usage.update(0.0, {"a": 4}, {"a": 100.0})
    assert usage.update(100.0, {"a": 4}, {"a": 100.0})["a"] == pytest.approx(4 * (1 - 1 / 2.7183),
                                                                             rel=1e-4)
    later = usage.update(1000.0, {}, {"a": 100.0})
    assert later["a"] < 0.01


def test_admission_interleaves_shares_by_weight_and_priority_within_a_share():
    jobs = [queued("r1", "red1", 1.0), queued("r2", "red1", 2.0, priority=9),
            queued("r3", "red1", 3.0), queued("b1", "blue", 4.0), queued("b2", "blue", 5.0)]
    order = [j.id for j in fair_order(jobs, POLICY, {}, {})]
    assert order == ["b1", "r2", "b2", "r1", "r3"]
    # a share that used much lately waits behind one that did not
    assert [j.id for j in fair_order(jobs, POLICY, {}, {"blue": 10.0})][:2] == ["r2", "r1"]


def test_the_scheduler_admits_in_fair_share_order_and_keeps_the_reservation():
    policy = FairsharePolicy(0, 50, POLICY.shares)
    envs = (EnvView("e", available_slots=4),)
    jobs = (running("a", "red1", 2, lo=2, hi=2), queued("r2", "red1", 2.0, lo=1, hi=1),
            queued("b1", "blue", 3.0, lo=1, hi=1))
    plan = schedule(Snapshot(envs, (queue(policy),), jobs))
    assert [s.job for s in plan.starts] == ["b1"]  # blue is not active yet: it may start
    assert "computeReservation 50" in plan.waiting["r2"].reason


def test_a_new_share_takes_its_entitlement_back_by_shrinking_elastic_jobs():
    envs = (EnvView("e", available_slots=6),)
    fairshare = policy_by_name("fairshare")
    first = schedule(Snapshot(envs, (queue(),), (running("a", "red1", 6),
                                                queued("b", "blue", 2.0))), fairshare)
    assert [(s.job, s.count) for s in first.shrinks] == [("a", 1)]  # room for b's min
    assert "making room for b" in first.shrinks[0].reason
    second = schedule(Snapshot(envs, (queue(),), (running("a", "red1", 5),
                                                 running("b", "blue", 1, created=2.0))),
                      fairshare)
    assert [(s.job, s.count) for s in second.shrinks] == [("a", 3)]
    assert [(g.job, g.count) for g in second.grows] == [("b", 3)]  # blue: 2/3 of 6 slots
    settled = schedule(Snapshot(envs, (queue(),), (running("a", "red1", 2),
                                                  running("b", "blue", 4, created=2.0))),
                       fairshare)
    assert not settled.shrinks and not settled.grows  # nothing moves back


def test_hysteresis_keeps_a_worker_from_going_back_and_forth():
    envs = (EnvView("e", available_slots=3),)
    even = FairsharePolicy()
    fairshare = policy_by_name("fairshare")
    for a, b in ((2, 1), (1, 2)):  # entitled to 1.5 each: neither state moves
        plan = schedule(Snapshot(envs, (queue(even),), (running("a", "x", a),
                                                        running("b", "y", b, created=2.0))),
                        fairshare)
        assert not plan.shrinks and not plan.grows


def test_plain_jobs_are_not_shrunk_and_free_slots_go_to_the_share_of_least_use():
    envs = (EnvView("e", available_slots=6),)
    plain = JobView("p", "q", 1.0, status="RUNNING", placement={"e": 1}, share="red1",
                    preemptible=False)
    plan = schedule(Snapshot(envs, (queue(),), (plain, running("a", "red1", 3, hi=3),
                                                running("b", "blue", 1, created=2.0))),
                    policy_by_name("fairshare"))
    # blue (entitled to 4) takes the free slot, then two of a's workers; red keeps 2
    assert [(g.job, g.count) for g in plan.grows] == [("b", 3)]
    assert [(s.job, s.count) for s in plan.shrinks] == [("a", 2)]
    assert all(s.job != "p" for s in plan.shrinks)


def test_capacity_loss_sheds_the_share_most_over_its_entitlement_first():
    envs = (EnvView("e", available_slots=6),)  # 8 workers held: 2 must go
    jobs = (running("a", "red1", 5), running("b", "blue", 3, created=2.0))
    fifo = schedule(Snapshot(envs, (queue(),), jobs))
    assert [(s.job, s.count) for s in fifo.shrinks] == [("b", 2)]  # newest first
    fair = schedule(Snapshot(envs, (queue(),), jobs), policy_by_name("fairshare"))
    # red (entitled to 2 of 6) gives both; blue (entitled to 4) keeps its 3 (and then
    # takes one more from red, as the allocation's take-back does)
    assert (fair.shrinks[0].job, fair.shrinks[0].count) == ("a", 2)
    assert "most over its entitlement" in fair.shrinks[0].reason
    assert all(s.job == "a" for s in fair.shrinks) and not fair.suspends


def test_shedding_by_share_alternates_as_the_shares_even_out():
    jobs = [running("a", "x", 4), running("b", "y", 4, created=2.0),
            running("c", "y", 2, lo=2, created=3.0)]
    spare = [(jobs[0], 3), (jobs[1], 3), (jobs[2], 0)]
    # y holds 6 of 3 entitled, x 4 of 3: y gives until it is as far over as x, then both
    assert shed_by_share(4, spare, {"x": 4, "y": 6}, {"x": 3.0, "y": 3.0}) == {"b": 3, "a": 1}
    assert shed_by_share(7, spare, {"x": 4, "y": 6}, {"x": 3.0, "y": 3.0}) is None


def test_when_shrinking_is_not_enough_the_capacity_loss_rule_suspends_newest_first():
    envs = (EnvView("e", available_slots=1),)  # 4 workers held, 2 could shrink
    jobs = (running("a", "red1", 2), running("b", "blue", 2, created=2.0))
    plan = schedule(Snapshot(envs, (queue(),), jobs), policy_by_name("fairshare"))
    assert [s.job for s in plan.suspends] == ["b"]
    assert [(s.job, s.count) for s in plan.shrinks] == [("a", 1)]


def test_a_waiting_job_of_an_over_entitled_share_does_not_freeze_the_take_back():
    envs = (EnvView("e", available_slots=6),)
    jobs = (running("a", "red1", 5), running("b", "blue", 1, created=2.0),
            queued("r2", "red1", 3.0, lo=2))
    plan = schedule(Snapshot(envs, (queue(),), jobs), policy_by_name("fairshare"))
    # red holds 5 of its 2: r2 waits without reserving the environment, and blue grows
    assert [(s.job, s.count) for s in plan.shrinks] == [("a", 3)]
    assert [(g.job, g.count) for g in plan.grows] == [("b", 3)]
    assert "r2" in plan.waiting and not plan.starts


def plain(job_id: str, share: str, created: float) -> JobView:
    return JobView(job_id, "q", created, status="RUNNING", placement={"e": 1}, share=share,
                   preemptible=False)


def test_a_plain_job_is_preempted_only_where_its_queue_allows_it():
    envs = (EnvView("e", available_slots=4),)
    jobs = tuple(plain(f"p{i}", "red1", float(i)) for i in range(1, 5)) + (
        queued("b", "blue", 9.0, lo=1),)
    fairshare = policy_by_name("fairshare")
    strict = schedule(Snapshot(envs, (queue(),), jobs), fairshare)
    assert not strict.suspends and "b" in strict.waiting
    allows = QueueView("q", 1, ("e",), fairshare=POLICY, preempt_plain_jobs=True)
    plan = schedule(Snapshot(envs, (allows,), jobs), fairshare)
    # red holds 4 of its 1.3 slots, blue 0 of 2.7: the newest plain job of red goes back
    assert [s.job for s in plan.suspends] == ["p4"]
    assert "preempted (its queue allows it) for b" in plan.suspends[0].reason
    assert not plan.shrinks and not plan.grows
    # once b runs no blue job waits: nothing more is preempted (a plain job is never shrunk)
    after = jobs[:3] + (running("b", "blue", 1, lo=1, hi=1, created=9.0),)
    assert not schedule(Snapshot(envs, (allows,), after), fairshare).suspends


def test_an_elastic_job_shrinks_before_any_plain_job_is_preempted():
    envs = (EnvView("e", available_slots=4),)
    allows = QueueView("q", 1, ("e",), fairshare=POLICY, preempt_plain_jobs=True)
    jobs = (plain("p1", "red1", 1.0), running("a", "red1", 3, created=2.0),
            queued("b", "blue", 9.0))
    plan = schedule(Snapshot(envs, (allows,), jobs), policy_by_name("fairshare"))
    assert not plan.suspends and [(s.job, s.count) for s in plan.shrinks] == [("a", 1)]
