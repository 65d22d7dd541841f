"""Dynamic Training's claim on real spot capacity: an elastic ResNet-50 against fixed clusters.

The claim (*Dynamic Training for deep learning on EC2*, AWS 2018): 15-50 % lower cost and
15-30 % shorter training than a fixed cluster. Checked here by simulation on the public AWS
spot traces of ``traces/spot/`` (16-node V100 availability every 5 minutes in us-west-2a and
us-west-2c over 16.4 days; Wu et al., *Can't Be Late*, NSDI 2024), one spot environment per
zone, so at most 32 V100s (p3.2xlarge: one each).

The job: ResNet-50 on ImageNet, 90 epochs (115.3M images), with the scaling of
*Scalable multi-node training on GPUs* (AWS 2018): 44,000 images/s at 64 V100 and 92 %
efficiency (MXNet), or 41,000 and 90 % (Horovod); Amdahl's law through those figures gives 747
(712) images/s for one V100. Each worker starts in ``--start-s`` (default 120 s) and each change
of the group costs ``--reform-s`` (default 10 s): assumptions for a GPU cluster, not measured.

Each scenario is run with the job arriving at every ``--every-h`` hours over the traces (the
traces loop), because the answer depends on when the job arrives:

* static on-demand: 32 on-demand V100s at $3.06/hour (the fixed cluster of the job's max
  size), the baseline;
* static spot: the job waits for all 32 spot V100s at once, runs while it has them, checkpoints
  and waits again when one is taken back;
* elastic spot: 1-32 spot V100s, whatever the traces offer;
* elastic 16 + spot: 16 on-demand V100s always, plus whatever spot capacity there is (16-48
  V100s: the shape of *Dynamic Training*'s cluster, a fixed base that grows with cheap
  capacity).

Spot V100s cost $0.918/hour (30 % of on-demand: an assumption; the traces carry no prices).

    .venv/bin/python bench/spot_claim.py        # ~1-3 minutes

Writes ``bench/results/spot_claim.json`` and ``docs/benchmarks/spot-claim.png``.
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
from dyntrain.service.core.allocation import FIFO  # noqa: E402
from dyntrain.service.core.capacity import trace_from_points  # noqa: E402
from dyntrain.service.core.model import CapacityType  # noqa: E402
from dyntrain.service.core.speedup import SpeedupModel  # noqa: E402
from dyntrain.sim.compare import ON_DEMAND_PRICE  # noqa: E402
from dyntrain.sim.engine import EnvSpec, SimConfig, run_simulation  # noqa: E402
from dyntrain.sim.jobs import JobSpec, JobTrace, QueueSpec  # noqa: E402
from sim_policies import spot_envs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "spot_claim.json"
FIGURE = ROOT / "docs" / "benchmarks" / "spot-claim.png"
IMAGES = 90 * 1_281_167  # 90 epochs of ImageNet-1k's training set
CURVES = {"MXNet, 92 % at 64": (44_000.0, 0.92), "Horovod, 90 % at 64": (41_000.0, 0.90)}
CLAIM_COST, CLAIM_TIME = (15, 50), (15, 30)  # % lower than the fixed cluster


def on_demand(slots: int) -> EnvSpec:
    return EnvSpec("on-demand", trace_from_points([(0.0, slots)], source="on-demand"),
                   CapacityType.ON_DEMAND, ON_DEMAND_PRICE)


def scenarios(model: SpeedupModel, start_s: float, reform_s: float):
    """(name, environments, the job's min, max, elastic) of each scenario."""
    spot = spot_envs()
    base = JobSpec("resnet50", 0.0, float(IMAGES), model, 1, 32, start_s, reform_s)
    return [
        ("static on-demand, 32", [on_demand(32)], replace(base, min_workers=32, elastic=False)),
        ("static spot, wait for 32", spot, replace(base, min_workers=32, elastic=False)),
        ("elastic spot, 1-32", spot, base),
        ("elastic 16 on-demand + spot, 16-48", [*spot, on_demand(16)],
         replace(base, min_workers=16, max_workers=48)),
    ]


def run(model: SpeedupModel, arrivals: list[float], start_s: float, reform_s: float) -> dict:
    out = {}
    for name, envs, job in scenarios(model, start_s, reform_s):
        times, costs = [], []
        for t in arrivals:
            trace = JobTrace((replace(job, arrival_s=t),), (QueueSpec(),))
            result = run_simulation(envs, trace, FIFO, SimConfig())
            (record,) = result.jobs
            times.append(record.jct_s)
            costs.append(record.cost)
        out[name] = {"hours": [t / 3600 for t in times], "cost": costs}
    return out


def summarise(runs: dict) -> dict:
    base = runs["static on-demand, 32"]
    rows = {}
    for name, r in runs.items():
        time_ratio = [t / b for t, b in zip(r["hours"], base["hours"], strict=True)]
        cost_ratio = [c / b for c, b in zip(r["cost"], base["cost"], strict=True)]
        rows[name] = {
            "hours_median": statistics.median(r["hours"]),
            "hours_p10": _quantile(r["hours"], 0.1), "hours_p90": _quantile(r["hours"], 0.9),
            "cost_median": statistics.median(r["cost"]),
            "time_change_pct_median": (statistics.median(time_ratio) - 1) * 100,
            "cost_change_pct_median": (statistics.median(cost_ratio) - 1) * 100,
            "time_change_pct_p10": (_quantile(time_ratio, 0.1) - 1) * 100,
            "time_change_pct_p90": (_quantile(time_ratio, 0.9) - 1) * 100,
            "shorter_than_static_pct": 100 * sum(x < 1 for x in time_ratio) / len(time_ratio),
        }
    return rows


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def plot(summary: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.8), dpi=110)
    ax_t, ax_c = fig.subplots(1, 2)
    for ax, key, label, claim in ((ax_t, "time_change_pct_median", "training time", CLAIM_TIME),
                                  (ax_c, "cost_change_pct_median", "cost", CLAIM_COST)):
        names = list(next(iter(summary.values())))
        width = 0.8 / len(summary)
        for i, (curve, rows) in enumerate(summary.items()):
            ax.barh([j + i * width for j in range(len(names))], [rows[n][key] for n in names],
                    height=width, label=curve)
        ax.axvspan(-claim[1], -claim[0], color="green", alpha=0.15, label="the claim")
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks([j + 0.4 - width / 2 for j in range(len(names))])
        ax.set_yticklabels(names if ax is ax_t else [], fontsize=8)
        ax.set_xlabel(f"{label} vs static on-demand (%, median)")
    ax_c.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every-h", type=float, default=6.0, help="hours between two arrivals")
    ap.add_argument("--start-s", type=float, default=120.0)
    ap.add_argument("--reform-s", type=float, default=10.0)
    ap.add_argument("--out", default=str(RESULT))
    args = ap.parse_args()
    load_before = os.getloadavg()
    started = time.perf_counter()
    period = max(e.trace.duration for e in spot_envs())
    arrivals = [i * args.every_h * 3600 for i in range(int(period / (args.every_h * 3600)))]
    summary, runs = {}, {}
    for curve, (at_64, efficiency) in CURVES.items():
        model = SpeedupModel.from_efficiency(at_64 / (64 * efficiency), 64, efficiency)
        runs[curve] = run(model, arrivals, args.start_s, args.reform_s)
        summary[curve] = summarise(runs[curve])
        print(f"\n{curve}: {model.throughput(1):.0f} images/s on one V100, "
              f"{model.throughput(32):,.0f} on 32 ({model.efficiency(32):.1%})")
        print(f"{'scenario':<36} {'hours (p10-p90)':>22} {'cost $':>9} {'time':>7} {'cost':>7}")
        for name, r in summary[curve].items():
            print(f"{name:<36} {r['hours_median']:>7.2f} ({r['hours_p10']:.1f}-"
                  f"{r['hours_p90']:.1f}) {r['cost_median']:>9.0f} "
                  f"{r['time_change_pct_median']:>+6.0f}% {r['cost_change_pct_median']:>+6.0f}%")
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    plot(summary, FIGURE)
    write_result(args.out, {
        "benchmark": "spot_claim",
        "command": "bench/spot_claim.py",
        "machine": {**machine_info(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "settings": {"images": IMAGES, "arrivals": len(arrivals), "every_h": args.every_h,
                     "start_s": args.start_s, "reform_s": args.reform_s,
                     "on_demand_price": ON_DEMAND_PRICE, "spot_price": spot_envs()[0].price},
        "claim": {"cost_lower_pct": CLAIM_COST, "time_shorter_pct": CLAIM_TIME},
        "summary": summary,
        "runs": runs,
        "total_seconds": time.perf_counter() - started,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
