"""Fair share on real spot capacity: three teams of different weights, simulated.

Capacity: the public AWS spot traces of ``traces/spot/`` (16-node V100 availability every 5
minutes in us-west-2a and us-west-2c, looped; Wu et al., *Can't Be Late*, NSDI 2024), one spot
environment each, from hour 210 of the traces (before it, capacity is almost always 0). Jobs:
one fair-share queue (AWS Batch's ``fairsharePolicy``) shared by three teams, ``alpha``
(weightFactor 1), ``beta`` (0.5) and ``gamma`` (0.25): weights 1, 2 and 4 (a lower factor gets
more). Each team submits three elastic jobs (1-16 workers, ResNet-50-like scaling, 20-60 hours
of one GPU each), ``alpha`` first, ``beta`` two hours later, ``gamma`` two hours after that.

Measured under ``fairshare``, over every interval where capacity exists: each active team's
share of the slots against its entitlement (its weight over the active teams' weights, but
never more than its unfinished jobs can hold: the rest goes to the others by weight), the
time each newly active team takes to get within 10 points of its entitlement, and the share of
time every active team is within 10 points once it has been active 5 minutes; the same jobs
without fair share under ``goodput`` (one first in, first out queue) give the JCT that fairness
costs. The stored time series (``series``) holds time-weighted means over 5 simulated
minutes: the slots, and each active team's share and entitlement.

    .venv/bin/python bench/sim_fairshare.py            # ~1-3 minutes

Writes ``bench/results/fairshare.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, write_result  # noqa: E402
from dyntrain.service.core.allocation import policy_by_name  # noqa: E402
from dyntrain.service.core.fairshare import FairsharePolicy, ShareAttributes  # noqa: E402
from dyntrain.service.core.trace_files import load_capacity  # noqa: E402
from dyntrain.sim.compare import SPOT_PRICE  # noqa: E402
from dyntrain.sim.engine import EnvSpec, SimConfig, run_simulation  # noqa: E402
from dyntrain.sim.jobs import JobSpec, JobTrace, QueueSpec, parse_curve  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces" / "spot"
ZONES = ("us-west-2a", "us-west-2c")
RESULT = ROOT / "bench" / "results" / "fairshare.json"
HOUR = 3600.0
START_H = 210.0
TEAMS = {"alpha": (1.0, 0.0), "beta": (0.5, 2.0), "gamma": (0.25, 4.0)}  # factor, arrival h
GPU_HOURS = (20, 40, 60)
BAND = 0.10  # the goal: within 10 points of the entitlement
SETTLE_S = 300.0  # ... once a team has been active 5 minutes
SERIES_S = 300.0  # the stored time series: time-weighted means over 5 simulated minutes
# ResNet-50-like: 747 images/s on one V100, 92 % efficiency at 64 (Scalable multi-node
# training on GPUs)
CURVE = parse_curve({"one_worker": 747, "efficiency": 0.92, "at": 64}, "resnet")


def spot_envs() -> list[EnvSpec]:
    return [EnvSpec(zone, load_capacity(TRACES / f"availability_16-node_aws-08-27-2023_{zone}"
                                                  ".json", loop=True), price=SPOT_PRICE)
            for zone in ZONES]


def job_trace() -> JobTrace:
    policy = FairsharePolicy(shares=tuple(ShareAttributes(team, factor)
                                          for team, (factor, _) in TEAMS.items()))
    jobs = []
    for team, (_, arrival_h) in TEAMS.items():
        for i, gpu_hours in enumerate(GPU_HOURS):
            jobs.append(JobSpec(f"{team}-{i}", (START_H + arrival_h) * HOUR + 60.0 * i,
                                747.0 * HOUR * gpu_hours, CURVE, 1, 16, 60.0, 5.0, "teams",
                                True, team))
    return JobTrace(tuple(jobs), (QueueSpec("teams", 1, policy),), "three teams")


def entitled_shares(weights: dict[str, float], demand: dict[str, int], total: int
                    ) -> dict[str, float]:
    """Each active team's entitlement as a fraction of ``total`` slots: its weight over the
    active teams' weights, except that a team is never entitled to more slots than its
    unfinished jobs can hold (their max workers together); what it cannot use is divided
    between the others by weight (water-filling)."""
    out: dict[str, float] = {}
    left, open_ = float(total), dict(weights)
    while open_:
        weight = sum(open_.values())
        capped = {t: demand[t] for t, w in open_.items() if demand[t] < left * w / weight}
        if not capped:
            out.update({t: left * w / weight / total for t, w in open_.items()})
            break
        for t, d in capped.items():
            out[t] = d / total
            left -= d
            del open_[t]
    return out


def shares(result, trace: JobTrace, envs: list[EnvSpec]) -> dict:
    """Per team: time-weighted share of the slots against its entitlement, time to reach it."""
    policy = trace.queues[0].fairshare
    team_of = {j.id: j.share for j in trace.jobs}
    arrived = {team: min(j.arrival_s for j in trace.jobs if j.share == team) for team in TEAMS}
    finished = {team: max(r.finished_s or float("inf") for r in result.jobs
                          if team_of[r.id] == team) for team in TEAMS}
    end = {r.id: r.finished_s or float("inf") for r in result.jobs}
    spans = [(j.share, j.arrival_s, end[j.id], j.max_workers) for j in trace.jobs]
    out = {team: {"weight": policy.weight(team), "seconds": 0.0, "share_x_s": 0.0,
                  "entitled_x_s": 0.0, "within_s": 0.0, "settled_s": 0.0, "reached_after_s": None,
                  "abs_error_x_s": 0.0} for team in TEAMS}
    buckets: dict[int, dict] = {}
    rows = result.timeline
    for (t, slots, held), (t_next, _, _) in zip(rows, rows[1:], strict=False):
        total = sum(slots.values())
        dt = t_next - t
        active = [team for team in TEAMS if arrived[team] <= t < finished[team]]
        if total <= 0 or dt <= 0 or not active:
            continue
        demand = dict.fromkeys(active, 0)
        for team, start, end, most in spans:
            if team in demand and start <= t < end:
                demand[team] += most
        entitled_of = entitled_shares({team: policy.weight(team) for team in active}, demand,
                                      total)
        by_team = dict.fromkeys(TEAMS, 0)
        for job_id, n in held.items():
            by_team[team_of[job_id]] += n
        point = buckets.setdefault(int((t - START_H * HOUR) // SERIES_S),
                                   {"s": 0.0, "slots": 0.0})
        point["s"] += dt
        point["slots"] += total * dt
        for team in active:
            share = by_team[team] / total
            entitled = entitled_of[team]
            o = out[team]
            o["seconds"] += dt
            o["share_x_s"] += share * dt
            o["entitled_x_s"] += entitled * dt
            o["abs_error_x_s"] += abs(share - entitled) * dt
            close = abs(share - entitled) <= BAND
            if t - arrived[team] >= SETTLE_S:
                o["settled_s"] += dt
                o["within_s"] += dt if close else 0.0
            if close and o["reached_after_s"] is None:
                o["reached_after_s"] = t - arrived[team]
            sums = point.setdefault(team, {"s": 0.0, "share": 0.0, "entitled": 0.0})
            sums["s"] += dt
            sums["share"] += share * dt
            sums["entitled"] += entitled * dt
    series = []
    for i, point in sorted(buckets.items()):
        row = {"t_h": round(i * SERIES_S / HOUR, 4), "slots": round(point["slots"] / point["s"], 2)}
        for team in TEAMS:
            if team in point:
                sums = point[team]
                row[team] = {"share": round(sums["share"] / sums["s"], 4),
                             "entitled": round(sums["entitled"] / sums["s"], 4)}
        series.append(row)
    summary = {}
    for team, o in out.items():
        s = o["seconds"] or 1.0
        summary[team] = {"weight": o["weight"], "active_h": o["seconds"] / HOUR,
                         "mean_share": o["share_x_s"] / s, "mean_entitled": o["entitled_x_s"] / s,
                         "mean_abs_error": o["abs_error_x_s"] / s,
                         "within_10_points_after_5_min": (o["within_s"] / o["settled_s"]
                                                          if o["settled_s"] else None),
                         "reached_after_s": o["reached_after_s"]}
    return {"teams": summary, "series": series}


def jct(result) -> dict:
    done = [r.jct_s for r in result.jobs if r.jct_s is not None]
    return {"avg_jct_s": statistics.mean(done) if done else None, "finished": len(done),
            "jobs": len(result.jobs), "reformations": sum(r.reformations for r in result.jobs),
            "per_job_jct_s": {r.id: r.jct_s for r in result.jobs}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULT))
    ap.add_argument("--pass-every", type=float, default=30.0)
    args = ap.parse_args()
    load_before = os.getloadavg()
    started = time.monotonic()
    envs, trace = spot_envs(), job_trace()
    config = SimConfig(pass_every_s=args.pass_every, record=True)
    fair = run_simulation(envs, trace, policy_by_name("fairshare"), config)
    plain = replace(trace, jobs=tuple(replace(j, share=None) for j in trace.jobs),
                    queues=(QueueSpec("teams", 1),))
    alone = run_simulation(envs, plain, policy_by_name("goodput"), config)
    measured = shares(fair, trace, envs)
    result = {
        "command": "bench/sim_fairshare.py" + (f" --pass-every {args.pass_every:g}"
                                               if args.pass_every != 30.0 else ""),
        "settings": {"start_h": START_H, "teams": {t: {"weight_factor": f, "arrival_h": a}
                                                   for t, (f, a) in TEAMS.items()},
                     "gpu_hours": list(GPU_HOURS), "band": BAND, "settle_s": SETTLE_S,
                     "pass_every_s": args.pass_every, "zones": list(ZONES)},
        "fairshare": {**measured, **jct(fair)},
        "goodput": {**shares(alone, trace, envs), **jct(alone)},
        "total_seconds": time.monotonic() - started,
        "machine": {**machine_info(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
    }
    for name in ("fairshare", "goodput"):
        print(name, f"avg JCT {result[name]['avg_jct_s'] / HOUR:.1f} h")
        for team, s in result[name]["teams"].items():
            print(f"  {team}: share {s['mean_share']:.1%} vs entitled {s['mean_entitled']:.1%}, "
                  f"within 10 points {s['within_10_points_after_5_min'] or 0:.0%} of the time "
                  f"after 5 min, reached after {s['reached_after_s']} s")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
