"""The simulator: exact timings on small traces, the real scheduler's rules, the policies."""

from __future__ import annotations

import pytest

from dyntrain.service.core.allocation import FIFO, policy_by_name
from dyntrain.service.core.capacity import trace_from_points
from dyntrain.service.core.goodput import Goodput
from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.speedup import SpeedupModel
from dyntrain.sim.compare import StaticCluster, compare, parse_policies, run_policy
from dyntrain.sim.engine import EnvSpec, SimConfig, run_simulation
from dyntrain.sim.jobs import JobSpec, JobTrace, QueueSpec, builtin_jobs
from dyntrain.sim.results import format_table, percentile

TEN_PER_WORKER = SpeedupModel(parallel=0.1)  # 10 samples/s per worker, perfectly linear


def spot(points, name="spot", price=3600.0):
    """An environment whose slots follow ``points``; a price of 3600 makes cost = seconds."""
    return EnvSpec(name, trace_from_points(points, source=name), price=price)


def job(job_id, samples, lo=1, hi=4, arrival=0.0, model=TEN_PER_WORKER, start_s=5.0,
        reform_s=2.0, elastic=True):
    return JobSpec(job_id, arrival, samples, model, lo, hi, start_s, reform_s, elastic=elastic)


def trace(*jobs):
    return JobTrace(tuple(jobs), (QueueSpec(),))


def test_one_job_on_constant_capacity():
    result = run_simulation([spot([(0, 4)])], trace(job("a", 4000)), FIFO)
    (a,) = result.jobs
    assert a.started_s == 0.0
    assert a.finished_s == pytest.approx(5.0 + 4000 / 40)  # start-up, then 40 samples/s
    assert a.worker_seconds == pytest.approx(4 * 105.0)
    assert result.cost == pytest.approx(4 * 105.0)
    assert result.utilisation == pytest.approx(1.0)
    assert a.reformations == 0


def test_capacity_taken_back_and_returned():
    env = spot([(0, 4), (55, 2), (100, 4)])
    result = run_simulation([env], trace(job("a", 4000)), FIFO)
    (a,) = result.jobs
    # 5-55 s: 4 workers (2000 samples); shrunk to 2 at 55, re-formed at 57; 57-105 s at 20/s
    # (960); 2 workers grow at 100, ready at 105, re-formed at 107; the last 1040 at 40/s
    assert a.finished_s == pytest.approx(107 + 1040 / 40)
    assert a.reformations == 2
    # the two that left at 55 lost their slots with the capacity: they hold nothing after it
    assert a.worker_seconds == pytest.approx(4 * 55 + 2 * (133 - 55) + 2 * (133 - 100))
    # every slot that existed was held, and never more than existed
    assert result.slot_seconds_available == pytest.approx(4 * 55 + 2 * 45 + 4 * 33)
    assert result.utilisation == pytest.approx(1.0)


def test_a_worker_told_to_leave_holds_its_slot_while_the_capacity_still_has_it():
    """Fair shares give the job that arrives at 50 s half of the 4 slots: the first job's two
    workers told to leave hold theirs ``leave_s`` more, so the newcomer starts 10 s later."""
    jobs = trace(job("a", 20_000), job("c", 4000, arrival=50.0))
    result = run_simulation([spot([(0, 4)])], jobs, policy_by_name("fair"),
                            SimConfig(leave_s=10.0))
    a, c = result.jobs
    assert a.sizes[4] > 0 and c.started_s == pytest.approx(60.0)
    assert result.slot_seconds_used <= result.slot_seconds_available


def test_a_job_below_its_min_is_suspended_and_resumes_where_it_was():
    env = spot([(0, 4), (55, 1), (200, 4)])
    (a,) = run_simulation([env], trace(job("a", 4000, lo=2, hi=4)), FIFO).jobs
    assert a.suspensions == 1
    # 2000 done by 55; back at 200 with 4 workers, training again at 205
    assert a.finished_s == pytest.approx(205 + 2000 / 40)


def test_the_simulator_keeps_the_schedulers_head_of_line_rule():
    # b needs 3 at once and heads the queue: c (1 worker) may not pass it, though a slot is free
    jobs = trace(job("a", 3000, lo=3, hi=3, start_s=0), job("b", 300, lo=3, hi=3, arrival=1,
                                                           start_s=0),
                 job("c", 10, lo=1, hi=1, arrival=2, start_s=0))
    result = run_simulation([spot([(0, 4)])], jobs, FIFO)
    a, b, c = result.jobs
    assert a.finished_s == pytest.approx(100.0)
    assert b.started_s == c.started_s == pytest.approx(100.0)


def test_static_runs_each_job_at_a_fixed_size_on_on_demand_slots():
    result = run_policy("static", [spot([(0, 0), (1000, 8)])], trace(job("a", 4000, hi=8)),
                        cluster=StaticCluster(4, price=7200.0))
    (a,) = result.jobs
    assert a.finished_s == pytest.approx(5 + 100.0)  # the spot trace plays no part
    assert result.cost == pytest.approx(2 * 4 * 105.0)


def test_goodput_learns_that_a_job_stops_scaling_and_gives_the_slots_to_another():
    flat = SpeedupModel(parallel=0.1, chunks=2)  # a third worker adds nothing
    jobs = trace(job("flat", 20_000, hi=8, model=flat, start_s=1, reform_s=0.5),
                 job("linear", 20_000, hi=8, arrival=10, start_s=1, reform_s=0.5))
    env = [spot([(0, 8)])]
    config = SimConfig(pass_every_s=5.0)
    fifo = run_simulation(env, jobs, FIFO, config).summary()
    good = run_simulation(env, jobs, Goodput(), config)
    flat_run = good.jobs[0]
    assert max(flat_run.sizes) <= 4  # it explored to 4 at most, then stayed where it scales
    assert good.summary()["avg_jct_s"] < 0.7 * fifo["avg_jct_s"]
    assert good.summary()["cost"] < fifo["cost"]


def test_the_same_inputs_give_the_same_results():
    envs = [spot([(0, 6), (3600, 2), (7200, 8)])]
    jobs = builtin_jobs(count=8, span_s=7200, seed=3, gpu_hours=(0.2, 1.0))
    first = [r.summary() for r in compare(("fifo", "goodput"), envs, jobs)]
    second = [r.summary() for r in compare(("fifo", "goodput"), envs, jobs)]
    for a, b in zip(first, second, strict=True):
        assert {k: v for k, v in a.items() if k not in ("wall_s", "simulated_s_per_s")} == \
            {k: v for k, v in b.items() if k not in ("wall_s", "simulated_s_per_s")}


def test_a_job_wider_than_any_capacity_is_refused():
    with pytest.raises(ValidationError, match="needs 5 workers at once but the capacity"):
        run_simulation([spot([(0, 4)])], trace(job("a", 10, lo=5, hi=5)), FIFO)


def test_policies_are_parsed_and_unknown_ones_named():
    assert parse_policies("goodput, fifo,goodput") == ("goodput", "fifo")
    with pytest.raises(ValidationError, match="unknown policy 'pollux'"):
        parse_policies("fifo,pollux")


def test_the_summary_and_its_table():
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 95) == 5.0
    assert percentile(list(range(1, 101)), 95) == 95
    result = run_simulation([spot([(0, 4)])], trace(job("a", 4000), job("b", 400, arrival=1)),
                            FIFO)
    summary = result.summary()
    for key in ("avg_jct_s", "p95_jct_s", "makespan_s", "cost", "utilisation", "reformations"):
        assert key in summary
    assert summary["makespan_s"] == pytest.approx(max(j.finished_s for j in result.jobs))
    lines = format_table([summary])
    assert lines[0].split()[:4] == ["policy", "avg", "JCT", "s"]  # 2 minutes: in seconds
    assert lines[1].startswith("fifo")


def test_the_built_in_trace_is_seeded():
    a, b = builtin_jobs(seed=1), builtin_jobs(seed=1)
    assert a == b and len(a.jobs) == 50
    assert builtin_jobs(seed=2) != a
    assert all(j.arrival_s <= 10 * 86400 * 1.5 for j in a.jobs)


def test_fairshare_gives_each_team_its_weighted_share_as_teams_arrive():
    from dyntrain.sim.jobs import parse_jobs

    doc = {"queues": [{"name": "teams", "fairshare": {"shareDistribution": [
        {"shareIdentifier": "c", "weightFactor": 0.5}]}}],
        "jobs": [{"id": f"{team}{i}", "arrival_s": arrival, "samples": 1e6, "workers": "1:12",
                  "curve": {"parallel": 0.1}, "start_s": 5, "reform_s": 1, "share": team}
                 for team, arrival in (("a", 0), ("b", 600), ("c", 1200)) for i in (1, 2)]}
    jobs = parse_jobs(doc)
    result = run_simulation([spot([(0, 12)])], jobs, policy_by_name("fairshare"),
                            SimConfig(pass_every_s=30, until_s=1800, record=True))
    team_of = {j.id: j.share for j in jobs.jobs}

    def held(t):
        _, _, by_job = max((e for e in result.timeline if e[0] <= t), key=lambda e: e[0])
        out = dict.fromkeys("abc", 0)
        for job_id, n in by_job.items():
            out[team_of[job_id]] += n
        return out

    assert held(590) == {"a": 12, "b": 0, "c": 0}  # alone, a team takes every slot
    assert held(900) == {"a": 6, "b": 6, "c": 0}
    assert held(1790) == {"a": 3, "b": 3, "c": 6}  # c's weight factor 0.5: twice the others
    with pytest.raises(ValidationError, match="needs a share"):
        parse_jobs({**doc, "jobs": [{**doc["jobs"][0], "share": None}]})
