"""The simulator against the live service: the same job mix, run for real and predicted.

The capacity: a spot environment replaying two hours of a public spot trace (4 instances kept
requested in us-east-1f, ``traces/spot/preemption_4-node_aws-08-03-2023_us-east-1f.json``
ticks 3356-3379; Wu et al., *Can't Be Late*, NSDI 2024) compressed 30 times, 5-minute ticks
become 10 s (``bench/traces/live_spot.csv``), plus one on-demand slot. The jobs: four elastic
digits jobs whose steps sleep per chunk (``--step-delay``), so their curves differ: 8, 4 and 2
chunks per step (a job stops scaling at its chunk count), arriving over the first minute.

1. Calibration: each kind's scaling curve is measured with ``dyntrain lab throughput`` (strong
   scaling at 1, 2 and 4 workers), as a user would, and fitted (``dyntrain.service.core.speedup``).
2. Live: ``dyntrain server --policy P`` runs the mix (warm workers ready first); each job's
   completion time is submit to end as the service recorded it.
3. Prediction: the simulator gets the same capacity, arrivals, work and the calibrated curves,
   with a worker start-up of ``--start-s`` and a re-formation of ``--reform-s`` (from the
   capacity benchmark: a warm worker trains about a second after its slot appears).

The goal: every job's predicted completion time within 20 % of the live one.

    .venv/bin/python bench/sim_vs_live.py                      # ~10-15 minutes
    .venv/bin/python bench/sim_vs_live.py --policies goodput

Writes ``bench/results/sim_vs_live.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, write_result  # noqa: E402
from dyntrain.lab.scaling import ThroughputConfig
from dyntrain.lab.throughput import run_throughput
from dyntrain.service.core.trace_files import parse_json_trace, scale_time, to_csv  # noqa: E402
from dyntrain.sim.jobs import load_jobs  # noqa: E402
from dyntrain.sim.live import LiveJob, LiveSetup, compare_jobs, run_live, simulate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "traces" / "spot" / "preemption_4-node_aws-08-03-2023_us-east-1f.json"
CAPACITY = ROOT / "bench" / "traces" / "live_spot.csv"
RESULT = ROOT / "bench" / "results" / "sim_vs_live.json"
WINDOW = (3356, 24)  # first tick, ticks
SPEED_UP = 30.0  # 300 s ticks -> 10 s
GOAL = 0.20
JOBS = [LiveJob("wide", 0, 64, 8, 0.05, 300), LiveJob("mid", 10, 64, 16, 0.1, 300),
        LiveJob("narrow", 20, 64, 32, 0.2, 250), LiveJob("late", 60, 64, 8, 0.05, 200)]


def capacity_csv(source: Path = SOURCE, window: tuple[int, int] = WINDOW,
                 speed_up: float = SPEED_UP) -> str:
    """The trace window, compressed, as the CSV the service replays (with its source)."""
    doc = json.loads(source.read_text())
    first, ticks = window
    part = {"metadata": doc["metadata"], "data": doc["data"][first:first + ticks]}
    trace = scale_time(parse_json_trace(json.dumps(part), str(source)), speed_up)
    return (f"# {source.relative_to(ROOT)} ticks {first}-{first + ticks - 1}, "
            f"{speed_up:g} times faster\n# (Wu et al., Can't Be Late, NSDI 2024; "
            "github.com/skypilot-org/spot-traces)\n" + to_csv(trace))


def calibrate(jobs: list[LiveJob], out: Path) -> dict[str, str]:
    """``dyntrain lab throughput`` for each kind of job (at 1, 2 and 4 workers, as far as it
    has chunks), unless ``out`` holds it already; its throughput.json by job name."""
    found: dict[tuple, str] = {}
    by_job = {}
    for job in jobs:
        kind = (job.global_batch, job.chunk_size, job.step_delay)
        folder = out / f"calibrate-{job.chunks}-chunks"
        if kind not in found and not (folder / "throughput.json").is_file():
            run_throughput(ThroughputConfig(
                workers=tuple(w for w in (1, 2, 4) if w <= job.chunks), modes=("strong",),
                global_batch=job.global_batch,
                chunk_size=job.chunk_size, steps=40, warmup=8, out_dir=str(folder),
                command=("-m", "dyntrain.workloads.digits", "--model", "mlp", "--step-delay",
                         str(job.step_delay), "--lr-schedule", "constant")))
        found[kind] = str(folder / "throughput.json")
        by_job[job.name] = found[kind]
    return by_job


def job_file(jobs: list[LiveJob], curves: dict[str, str], start_s: float, reform_s: float,
             path: Path) -> Path:
    """The mix as a ``dyntrain sim`` job trace whose curves are the lab's measurements."""
    doc = {"queues": [{"name": "mix"}], "jobs": [
        {"id": j.name, "arrival_s": j.arrival_s, "samples": j.samples,
         "workers": f"{j.min_workers}:{j.max_workers}", "queue": "mix",
         "curve": {"lab": curves[j.name], "mode": "strong"},
         "start_s": start_s, "reform_s": reform_s} for j in jobs]}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="goodput,fifo")
    ap.add_argument("--start-s", type=float, default=2.0)
    ap.add_argument("--reform-s", type=float, default=0.7)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--calibration", default=None,
                    help="a folder of an earlier run's calibrate-N-chunks/ to use again")
    ap.add_argument("--out", default=str(RESULT))
    args = ap.parse_args()
    load_before = os.getloadavg()
    started = time.perf_counter()
    CAPACITY.parent.mkdir(parents=True, exist_ok=True)
    CAPACITY.write_text(capacity_csv())
    setup = LiveSetup(CAPACITY.read_text(), on_demand_slots=1)
    work = Path(tempfile.mkdtemp(prefix="sim-vs-live-"))
    curves = calibrate(JOBS, Path(args.calibration) if args.calibration else work)
    specs = list(load_jobs(job_file(JOBS, curves, args.start_s, args.reform_s,
                                    work / "jobs.json")).jobs)
    runs = []
    for policy in args.policies.split(","):
        live = run_live(JOBS, setup, policy, work / f"live-{policy}", warm=args.warm)
        predicted = simulate(specs, setup, policy)
        rows = compare_jobs(live.jct_s, predicted)
        worst = max(abs(r["error"]) for r in rows)
        print(f"\n{policy}: live vs predicted job completion times")
        for r in rows:
            print(f"  {r['job']:<8} live {r['live_s']:7.1f} s  predicted {r['predicted_s']:7.1f} s"
                  f"  error {r['error']:+.0%}   steps at sizes "
                  f"{live.steps_at_size[r['job']]}")
        verdict = "met" if worst <= GOAL else "not met"
        print(f"  worst error {worst:.0%} (goal {GOAL:.0%}: {verdict})")
        runs.append({"policy": policy, "jobs": rows, "worst_error": worst,
                     "live_steps_at_size": live.steps_at_size,
                     "live_step_seconds": live.step_seconds, "live_wall_s": live.wall_s})
    write_result(args.out, {
        "benchmark": "sim_vs_live",
        "command": "bench/sim_vs_live.py" + (f" --policies {args.policies}"
                                             if args.policies != "goodput,fifo" else ""),
        "machine": {**machine_info(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "capacity": str(CAPACITY.relative_to(ROOT)), "on_demand_slots": 1,
        "jobs": [{"name": j.name, "arrival_s": j.arrival_s, "chunks": j.chunks,
                  "step_delay": j.step_delay, "steps": j.steps, "global_batch": j.global_batch,
                  "workers": [j.min_workers, j.max_workers]} for j in JOBS],
        "curves": {s.id: s.model.to_dict() for s in specs},
        "start_s": args.start_s, "reform_s": args.reform_s, "warm_workers": args.warm,
        "goal": GOAL, "runs": runs,
        "meets_goal": all(r["worst_error"] <= GOAL for r in runs),
        "total_seconds": time.perf_counter() - started,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
