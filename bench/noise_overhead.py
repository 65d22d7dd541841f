"""Cost of the online gradient noise scale (``TrainConfig.noise_scale``) per training step.

The digits workload (the real 8x8 digits data, ``dyntrain.workloads.digits``: DigitsNet "cnn"
and DigitsMLP "mlp", SGD nesterov momentum 0.9 as its defaults) runs the elastic step loop
in-process, one thread, world size 1: ``ChunkStepper.compute`` + ``apply`` per step, which is
all that the noise scale touches (one norm per chunk, one per step, ``num_chunks`` more
scalars in the all-reduce buffer; with float32 reduction also an add and a zeroing per
chunk). Each config runs side by side with the noise scale off and on, from the same initial
weights.

The machine is shared and noisy, so the sides are interleaved step by step. A round builds
fresh steppers, in a shuffled order (new allocations, so that no side keeps a lucky or unlucky
memory layout for the whole benchmark): "off", "on" and "off2", a second noise-off stepper that
serves as an A/A control. It warms them up, then runs ``--steps`` steps of each, one step at a
time in a rotating order (every side takes every position), each step timed on its own, as wall
time and as process CPU time (less disturbed by other load). Per round the ratio of the median
step times on/off is taken; the headline is the median over rounds. The A/A ratio off2/off,
taken the same way, shows the bias and noise of the measurement itself. The single-process
number is the worst case: with more workers a step adds an all-reduce and coordination that
the noise scale does not touch.

``--cli`` adds 2-worker runs through ``dyntrain run`` (real processes, gloo), off and on
alternately, timed from the leader's ``metrics.jsonl`` (median time between steps).

    .venv/bin/python bench/noise_overhead.py --cli      # ~4 minutes (load-dependent)
    .venv/bin/python bench/noise_overhead.py --quick    # ~1 minute, no 2-worker runs

Prints a table and writes ``bench/results/noise_overhead.json``.
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from _common import machine_info, write_result  # bench/ is sys.path[0] when run as a script
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.runs.log import read_metrics
from dyntrain.elastic.state import TrainingParts
from dyntrain.elastic.step.stepper import ChunkStepper
from dyntrain.workloads.digits import build_model, cross_entropy, load_digits_split

BENCH = Path(__file__).resolve().parent
GOAL = 0.02  # at most 2% longer steps


@dataclass(frozen=True)
class Case:
    model: str
    global_batch: int
    chunk: int
    exact: bool = True
    every: int = 4  # TrainConfig.noise_every (4 is the default)

    @property
    def name(self) -> str:
        return (f"{self.model} {self.global_batch}/{self.chunk} "
                f"{'f64' if self.exact else 'f32'} every {self.every}")


CASES = [Case("cnn", 64, 8), Case("cnn", 64, 8, every=1), Case("cnn", 64, 8, exact=False),
         Case("cnn", 256, 32), Case("mlp", 64, 8), Case("mlp", 64, 8, every=1),
         Case("mlp", 64, 8, exact=False), Case("mlp", 256, 32)]


def make_stepper(case: Case, noise: bool, train) -> ChunkStepper:
    config = TrainConfig(global_batch=case.global_batch, chunk_size=case.chunk, epochs=10_000,
                         exact_reduction=case.exact, noise_scale=noise,
                         noise_every=case.every)
    torch.manual_seed(0)
    model = build_model(case.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                          weight_decay=1e-4)
    return ChunkStepper(config, TrainingParts(model, opt), train, cross_entropy,
                        torch.device("cpu"))


class Runner:
    """One stepper and its next step; ``run()`` times one step: (wall ms, CPU ms)."""

    def __init__(self, stepper: ChunkStepper) -> None:
        self.stepper, self.step = stepper, 0
        self.chunks = stepper.my_chunks(0, 1)

    def run(self) -> tuple[float, float]:
        w0, c0 = time.perf_counter(), time.process_time()
        flat = self.stepper.compute(self.step, self.chunks)
        self.stepper.set_flags(flat, False, False)
        self.stepper.apply(flat)
        self.step += 1
        return 1000 * (time.perf_counter() - w0), 1000 * (time.process_time() - c0)


SIDES = ("off", "on", "off2")  # off2: a second noise-off stepper, the A/A control


def measure_case(case: Case, args, train) -> dict:
    rounds = []
    for rnd in range(args.rounds):
        build = list(SIDES)
        random.Random(rnd).shuffle(build)
        runners = {side: Runner(make_stepper(case, side == "on", train)) for side in build}
        for runner in runners.values():
            for _ in range(args.warmup):
                runner.run()
        gc.collect()
        wall: dict[str, list[float]] = {k: [] for k in SIDES}
        cpu: dict[str, list[float]] = {k: [] for k in SIDES}
        for i in range(args.steps):
            # every side takes every position in turn, forwards and backwards
            order = SIDES[i % 3:] + SIDES[: i % 3]
            for side in (order if (i // 3) % 2 == 0 else order[::-1]):
                w, c = runners[side].run()
                wall[side].append(w)
                cpu[side].append(c)
        med = {k: statistics.median(v) for k, v in wall.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        rounds.append({"round": rnd, **{f"{k}_ms": v for k, v in med.items()},
                       **{f"{k}_cpu_ms": v for k, v in med_cpu.items()},
                       "ratio": med["on"] / med["off"], "ratio_aa": med["off2"] / med["off"],
                       "ratio_cpu": med_cpu["on"] / med_cpu["off"],
                       "ratio_aa_cpu": med_cpu["off2"] / med_cpu["off"]})
    on = runners["on"].stepper

    def col(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    ratios = [r["ratio"] for r in rounds]
    return {"case": case.name, "model": case.model,
            "params": sum(q.numel() for q in on.params),
            "global_batch": case.global_batch, "chunk_size": case.chunk,
            "chunks": case.global_batch // case.chunk, "exact_reduction": case.exact,
            "off_step_ms": col("off_ms"), "on_step_ms": col("on_ms"),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "ratio_aa_median": col("ratio_aa"),
            "ratio_cpu_median": col("ratio_cpu"), "ratio_aa_cpu_median": col("ratio_aa_cpu"),
            "b_simple_end": on.noise.b_simple, "rounds": rounds}


# ---- optional: 2 worker processes through the CLI ---------------------------------------------

def cli_step_ms(out: Path, skip: int) -> float:
    times = [r.time for r in sorted(read_metrics(out), key=lambda r: r.step)][skip:]
    return 1000 * statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def measure_cli(args, work: Path) -> dict:
    runs = []
    for rnd in range(args.cli_rounds):
        order = [False, True] if rnd % 2 == 0 else [True, False]
        res = {}
        for noise in order:
            out = work / f"cli-r{rnd}-{'on' if noise else 'off'}"
            cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "2", "--quiet",
                   "--out", str(out), "-m", "dyntrain.workloads.digits", "--global-batch", "64",
                   "--chunk-size", "8", "--max-steps", str(args.cli_steps),
                   "--checkpoint-every", "100000", *(["--noise-scale"] if noise else [])]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                  cwd=BENCH.parent)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}"
                                   f"\n{proc.stderr[-2000:]}")
            res["on" if noise else "off"] = cli_step_ms(out, skip=args.cli_steps // 5)
        runs.append({"round": rnd, "off_ms": res["off"], "on_ms": res["on"],
                     "ratio": res["on"] / res["off"]})
        print(f"  cli round {rnd}: off {res['off']:.3f} ms  on {res['on']:.3f} ms  "
              f"ratio {res['on'] / res['off']:.4f}", flush=True)
    return {"case": "cnn 64/8 f64 every 4, 2 workers (dyntrain run)",
            "off_step_ms": statistics.median(r["off_ms"] for r in runs),
            "on_step_ms": statistics.median(r["on_ms"] for r in runs),
            "ratio_median": statistics.median(r["ratio"] for r in runs), "rounds": runs}


def print_table(rows: list[dict], cli: dict | None) -> None:
    head = (f"{'case':<24} {'params':>6} {'chunks':>6} {'off ms':>7} {'on ms':>7} "
            f"{'on/off':>7} {'[min, max] rounds':>17} {'A/A':>6} {'CPU on/off':>10} "
            f"{'CPU A/A':>7}  goal (< {GOAL:.0%})")
    print(head)
    print("-" * len(head))
    for r in rows:
        goal = "met" if r["ratio_median"] - 1 < GOAL else "MISSED"
        spread = f"[{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]"
        print(f"{r['case']:<24} {r['params']:>6} {r['chunks']:>6} {r['off_step_ms']:>7.3f} "
              f"{r['on_step_ms']:>7.3f} {r['ratio_median']:>7.4f} {spread:>17} "
              f"{r['ratio_aa_median']:>6.3f} {r['ratio_cpu_median']:>10.4f} "
              f"{r['ratio_aa_cpu_median']:>7.3f}  {goal}")
    if cli:
        goal = "met" if cli["ratio_median"] - 1 < GOAL else "MISSED"
        print(f"{'cnn 64/8 2 workers':<24} {'':>6} {8:>6} {cli['off_step_ms']:>7.3f} "
              f"{cli['on_step_ms']:>7.3f} {cli['ratio_median']:>7.4f} {'':>17} {'':>6} "
              f"{'':>10} {'':>7}  {goal}")
    print("\non/off = median step time (wall) with the noise scale on / off within a round, "
          "median over rounds;\nA/A = the same for a second noise-off stepper (the "
          "measurement's own bias and noise);\nCPU = the same from process CPU time, which "
          "other load on the machine disturbs less.")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (~30 s)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="A/B rounds per case [20; quick 6]")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per side per round [40; quick 24]")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per round first")
    ap.add_argument("--cases", default=None,
                    help="comma-separated case indices into " + "; ".join(
                        f"{i}: {c.name}" for i, c in enumerate(CASES)))
    ap.add_argument("--cli", action="store_true", help="also 2-worker runs via dyntrain run")
    ap.add_argument("--cli-rounds", type=int, default=4)
    ap.add_argument("--cli-steps", type=int, default=150)
    ap.add_argument("--out", default=str(BENCH / "results" / "noise_overhead.json"))
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (6 if args.quick else 20)
    args.steps = args.steps or (24 if args.quick else 40)
    cases = ([CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES)

    torch.set_num_threads(1)  # as every dyntrain worker of the digits workload
    train, _ = load_digits_split()
    info = machine_info()
    started = time.perf_counter()
    print(f"noise scale overhead: digits, {args.rounds} rounds x {args.steps} steps per side, "
          f"1 thread, {info['cpu_count']} CPUs, torch {info['torch']}", flush=True)
    rows = []
    for case in cases:
        row = measure_case(case, args, train)
        rows.append(row)
        print(f"  {row['case']:<24} off {row['off_step_ms']:.3f} ms  on {row['on_step_ms']:.3f} "
              f"ms  on/off {row['ratio_median']:.4f}  A/A {row['ratio_aa_median']:.4f}  "
              f"CPU on/off {row['ratio_cpu_median']:.4f}  (B_simple at the end "
              f"{row['b_simple_end'] and round(row['b_simple_end'], 1)})", flush=True)
    cli = None
    if args.cli:
        work = Path(tempfile.mkdtemp(prefix="dyntrain-noise-"))
        try:
            cli = measure_cli(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(rows, cli)
    result = {"benchmark": "online gradient noise scale: step time off vs on",
              "machine": info,
              "settings": {"data": "sklearn digits (train split, 1438 samples)",
                           "optimizer": "SGD lr 0.05 momentum 0.9 nesterov wd 1e-4",
                           "threads": 1, "world_size": 1, "rounds": args.rounds,
                           "steps_per_side_per_round": args.steps, "warmup_per_round": args.warmup,
                           "measure": "median per-step wall time of compute+apply per round; "
                                      "ratio on/off per round; median over rounds",
                           "quick": args.quick},
              "goal": f"median on/off step-time ratio < {1 + GOAL}",
              "summary": [{k: v for k, v in r.items() if k != "rounds"} for r in rows],
              "cases": rows, "cli_2_workers": cli,
              "total_seconds": time.perf_counter() - started}
    write_result(args.out, result)


if __name__ == "__main__":
    main()
