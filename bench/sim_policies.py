"""Allocation policies on real spot capacity: static, fifo, fair and goodput, simulated.

Capacity: the public AWS spot traces of ``traces/spot/`` (16-node V100 availability every 5
minutes in us-west-2a and us-west-2c over 16.4 days, looped; Wu et al., *Can't Be Late*, NSDI
2024), one spot environment each, at $0.918 per slot-hour (spot: an assumption, 30 % of the
on-demand price). Jobs: the built-in mixed trace of ``dyntrain sim`` (50 elastic jobs arriving
over 10 days: ResNet-50-like, transformer-like, a CIFAR-sized CNN and a small job that stops
scaling at 4 workers; 4-200 hours of one GPU each), for several seeds. ``static`` runs each job
at its max on a fixed on-demand cluster of 32 slots at $3.06: the fixed cluster that elastic
training is compared with.

Also: goodput's ``min_gain`` (the least a worker must add to be worth its price) from 0 to 0.5,
goodput with every job's true curve (``--oracle``: what measuring costs), and the simulator's
speed (simulated seconds per second; the goal is a two-week trace with 50 jobs in under a
minute).

    .venv/bin/python bench/sim_policies.py              # ~5-15 minutes (5 seeds)
    .venv/bin/python bench/sim_policies.py --seeds 1

Writes ``bench/results/sim_policies.json`` and the seed-0 figures into ``docs/benchmarks/``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, write_result  # noqa: E402
from dyntrain.service.core.goodput import Goodput, GoodputConfig  # noqa: E402
from dyntrain.service.core.trace_files import load_capacity  # noqa: E402
from dyntrain.sim.compare import POLICIES, SPOT_PRICE, compare  # noqa: E402
from dyntrain.sim.engine import EnvSpec, SimConfig, run_simulation  # noqa: E402
from dyntrain.sim.jobs import builtin_jobs  # noqa: E402
from dyntrain.sim.plots import plot_comparison, plot_policy  # noqa: E402
from dyntrain.sim.results import format_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces" / "spot"
ZONES = ("us-west-2a", "us-west-2c")
RESULT = ROOT / "bench" / "results" / "sim_policies.json"
FIGURES = ROOT / "docs" / "benchmarks"
MIN_GAINS = (0.0, 0.1, 0.25, 0.5)
METRICS = ("avg_jct_s", "p95_jct_s", "makespan_s", "cost", "utilisation", "reformations")


def spot_envs() -> list[EnvSpec]:
    return [EnvSpec(zone, load_capacity(TRACES / f"availability_16-node_aws-08-27-2023_{zone}"
                                                  ".json", loop=True), price=SPOT_PRICE)
            for zone in ZONES]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="built-in job traces 0..N-1")
    ap.add_argument("--out", default=str(RESULT))
    ap.add_argument("--no-figures", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()
    started = time.perf_counter()
    envs = spot_envs()
    seeds: list[dict] = []
    for seed in range(args.seeds):
        jobs = builtin_jobs(seed=seed)
        record = seed == 0 and not args.no_figures
        results = compare(POLICIES, envs, jobs, SimConfig(record=record))
        summaries = [r.summary() for r in results]
        variants = []
        for gain in MIN_GAINS:
            r = run_simulation(envs, jobs, Goodput(GoodputConfig(min_gain=gain)), SimConfig(),
                               f"goodput min_gain={gain:g}")
            variants.append(r.summary())
        oracle = run_simulation(envs, jobs, Goodput(), SimConfig(learn=False), "goodput oracle")
        variants.append(oracle.summary())
        print(f"\nseed {seed}: {len(jobs.jobs)} jobs, "
              f"{sum(j.samples * j.model.seconds_per_sample(1) for j in jobs.jobs) / 3600:,.0f} "
              "GPU-hours of work at one GPU each")
        for line in format_table(summaries + variants):
            print(line)
        seeds.append({"seed": seed, "policies": summaries, "variants": variants})
        if record:
            FIGURES.mkdir(parents=True, exist_ok=True)
            for r in results:
                plot_policy(r, FIGURES / f"sim-policies-{r.policy}.png")
            plot_comparison(summaries, FIGURES / "sim-policies-compare.png")
    names = [s["policy"] for s in seeds[0]["policies"]] + \
        [s["policy"] for s in seeds[0]["variants"]]
    mean = {}
    for name in names:
        rows = [s for seed in seeds for s in seed["policies"] + seed["variants"]
                if s["policy"] == name]
        mean[name] = {m: statistics.fmean(r[m] for r in rows) for m in METRICS}
        mean[name]["wall_s"] = statistics.fmean(r["wall_s"] for r in rows)
        mean[name]["simulated_s_per_s"] = statistics.fmean(r["simulated_s_per_s"] for r in rows)
    ratio = {name: {m: [s2[m] / s1[m] for seed in seeds
                        for s1 in seed["policies"] if s1["policy"] == "fifo"
                        for s2 in seed["policies"] + seed["variants"] if s2["policy"] == name]
                    for m in ("avg_jct_s", "cost")} for name in names}
    vs_fifo = {name: {m: statistics.fmean(v) for m, v in r.items()} for name, r in ratio.items()}
    print("\nmean over seeds, relative to fifo (avg JCT, cost):")
    for name in names:
        print(f"  {name:<24} {vs_fifo[name]['avg_jct_s']:.2f}  {vs_fifo[name]['cost']:.2f}")
    speed = [r for seed in seeds for r in seed["policies"]]
    result = {
        "benchmark": "sim_policies",
        "command": "bench/sim_policies.py" + (f" --seeds {args.seeds}" if args.seeds != 5
                                              else ""),
        "machine": {**machine_info(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "capacity": [f"traces/spot/availability_16-node_aws-08-27-2023_{z}.json" for z in ZONES],
        "spot_price": SPOT_PRICE,
        "seeds": seeds,
        "mean": mean,
        "vs_fifo": vs_fifo,
        "per_run_wall_s": {"median": statistics.median(r["wall_s"] for r in speed),
                           "max": max(r["wall_s"] for r in speed)},
        "simulated_s_per_s_median": statistics.median(r["simulated_s_per_s"] for r in speed),
        "total_seconds": time.perf_counter() - started,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
