"""Steady-state throughput of dyntrain beside a plain DistributedDataParallel loop.

Both systems train the same workload (DigitsNet of ``--width`` on synthetic 8x8 images, global batch
``--global-batch``, SGD nesterov momentum 0.9) on CPU with gloo, at the same world sizes, with
``torch.set_num_threads(1)`` in every worker:

* DDP: ``bench/ddp_worker.py`` starts N plain processes (env:// rendezvous on 127.0.0.1);
* dyntrain: ``dyntrain run --workers N --nproc N --out DIR --quiet bench/overhead_worker.py``, once
  with one chunk per worker (chunk = global batch / N, the like-for-like case) and once with
  ``--small-chunk`` (gradient accumulation over several chunks per worker).

Throughput is measured the same way for both: wall time on the leader (rank 0) between the end of
step k and the end of the last step, k = the first ``--warmup-frac`` of the steps, giving
(steps after k) * global batch / time. The systems are interleaved within each round (the order
flips every round) and the rounds repeated because the machine is shared and noisy; the ratio
dyntrain/DDP is taken within each round and its median reported. Goal: ratio >= 0.98 for the
like-for-like case.

Because other load on the machine can swing a single run by 2x, three checks come with it: the
ratio of the best runs, the ratio of 20th-percentile step times, and the CPU time per step summed
over all of a system's processes (dyntrain's launcher, which hosts the coordinator and its store,
included), with the other load measured during each run (cores' worth of CPU used by processes
that are not ours).

    .venv/bin/python bench/overhead.py                 # ~4-5 minutes
    .venv/bin/python bench/overhead.py --quick         # ~1-2 minutes
    .venv/bin/python bench/overhead.py --profile-only  # ~1 minute: where a dyntrain step's time
                                                       # goes (bench/results/overhead_profile.json)

Writes a table to stdout and ``bench/results/overhead.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import ddp_worker  # bench/ is sys.path[0] when run as a script
from _common import write_result
from dyntrain.elastic.runs.log import read_metrics
from dyntrain.lab.machine import cpu_accounts, other_load
from dyntrain.procstat import read_stat

BENCH = Path(__file__).resolve().parent
DYN_WORKER = BENCH / "overhead_worker.py"
GOAL = 0.98  # the bar: >= 98% of DDP's samples/s at the same world size and global batch
QUIET = 0.5  # cores' worth of other load below which a run counts as undisturbed


@dataclass(frozen=True)
class Config:
    name: str  # see ``VARIANTS`` and "small-chunk"
    world: int
    chunk: int
    flags: tuple[str, ...] = ()  # overhead_worker.py flags


# The one-chunk-per-worker variants: (name, overhead_worker flags). The first is the default.
VARIANTS = [
    ("like-for-like", ()),  # exact ring sum (float32 on the wire), overlapped with backward
    ("float64-allreduce", ("--float64-allreduce",)),  # exact, the earlier float64 all-reduce
    ("no-overlap", ("--no-overlap",)),  # exact ring, buckets summed after backward
    ("float64-no-overlap", ("--float64-allreduce", "--no-overlap")),  # the previous release
    ("float32", ("--float32-reduction",)),  # not exact: float32 all-reduce like DDP
]


def dyntrain_command() -> list[str]:
    script = Path(sys.executable).with_name("dyntrain")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "dyntrain.cli.main"]


def warmup_steps(args: argparse.Namespace) -> int:
    return max(1, math.ceil(args.warmup_frac * args.steps))


def steady_rate(times: list[float], global_batch: int, k: int) -> dict:
    """Samples/s between the end of step k and the end of the last step (rank 0's clock)."""
    n = len(times)
    if n - k < 2:
        raise RuntimeError(f"only {n} step times: too few to measure")
    span = times[-1] - times[k - 1]
    gaps = sorted(b - a for a, b in zip(times[k - 1 :], times[k:], strict=False))
    return {"steps": n, "measured_steps": n - k, "seconds": span,
            "samples_per_s": (n - k) * global_batch / span, "step_ms": 1000 * span / (n - k),
            # checks that bursts of other load on the machine are not what decides the ratio
            "median_step_ms": 1000 * statistics.median(gaps),
            "p20_step_ms": 1000 * gaps[len(gaps) // 5]}


def cpu_per_step(records: list[dict], k: int) -> list[float]:
    """CPU milliseconds per steady-state step of each worker (all of its threads)."""
    return [1000 * (r["cpu"][-1] - r["cpu"][k - 1]) / (len(r["cpu"]) - k) for r in records]


def model_name(args: argparse.Namespace) -> str:
    if args.hidden:
        return f"MLP 64-{args.hidden}-{args.hidden}-{args.hidden}-10"
    return f"DigitsNet(width={args.width})"


def workload_args(args: argparse.Namespace) -> list[str]:
    return ["--width", str(args.width), "--hidden", str(args.hidden),
            "--global-batch", str(args.global_batch), "--steps", str(args.steps), "--seed", "0",
            "--threads", "1", "--warmup", str(warmup_steps(args))]


def run_ddp(args: argparse.Namespace, world: int, work: Path, tag: str) -> dict:
    """The ranks are started right from here (as ``ddp_worker.py --nproc`` would do)."""
    out = work / f"{tag}.json"
    argv = ["--out", str(out), *workload_args(args)]
    log = work / f"{tag}.log"
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        code = ddp_worker.launch(argv, world, args.timeout, stdout=f, env=worker_env())
    wall = time.perf_counter() - t0
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"DDP run {tag} failed\n{tail}")
    records = [json.loads(Path(ddp_worker.rank_path(str(out), r)).read_text())
               for r in range(world)]
    k = warmup_steps(args)
    result = steady_rate(records[0]["times"], args.global_batch, k)
    workers_cpu = cpu_per_step(records, k)
    return {**result, "wall_s": wall, "workers_cpu_ms_per_step": workers_cpu,
            "cpu_ms_per_step": sum(workers_cpu),
            "parts_ms_per_step": records[0]["parts_ms_per_step"]}


def run_dyntrain(args: argparse.Namespace, cfg: Config, work: Path, tag: str,
                 extra: list[str] = ()) -> dict:
    out = work / tag
    cmd = [*dyntrain_command(), "run", "--workers", str(cfg.world), "--nproc", str(cfg.world),
           "--out", str(out), "--quiet", str(DYN_WORKER), *workload_args(args),
           "--chunk-size", str(cfg.chunk), *cfg.flags,
           *extra]
    k = warmup_steps(args)
    wall, launcher = _run_watching(cmd, args.timeout, work / f"{tag}.log",
                                   out / "metrics.jsonl", k, args.steps)
    rows = sorted((r for r in read_metrics(out) if not r.recomputed), key=lambda r: r.step)
    if [r.step for r in rows] != list(range(1, args.steps + 1)):
        raise RuntimeError(f"{tag}: unexpected steps in metrics.jsonl")
    if any(r.world_size != cfg.world for r in rows):
        raise RuntimeError(f"{tag}: the world size changed during the run")
    result = steady_rate([r.time for r in rows], args.global_batch, k)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("steps-*.json"))]
    if len(records) != cfg.world or any(len(r["cpu"]) != args.steps for r in records):
        raise RuntimeError(f"{tag}: missing per-worker step records")
    workers_cpu = cpu_per_step(records, k)
    return {**result, "wall_s": wall, "workers_cpu_ms_per_step": workers_cpu,
            "launcher_cpu_ms_per_step": launcher,
            "cpu_ms_per_step": sum(workers_cpu) + (launcher or 0.0)}


def worker_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _proc_cpu(pid: int) -> float | None:
    """CPU seconds of one process itself (not its children), from /proc; None if unreadable."""
    stat = read_stat(pid)
    return None if stat is None else stat.cpu_seconds


def _run_watching(cmd: list[str], timeout: float, log: Path, metrics: Path, k: int,
                  n: int) -> tuple[float, float | None]:
    """Run the ``dyntrain run`` launcher; returns its wall time and its own CPU milliseconds per
    step while metrics.jsonl grows from k to n lines (the coordinator, the store, the sink)."""
    t0 = time.perf_counter()
    first = last = None
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=BENCH.parent,
                                env=worker_env())
        try:
            while proc.poll() is None:
                if time.perf_counter() - t0 > timeout:
                    raise RuntimeError(f"timed out after {timeout:g} s: {' '.join(cmd)}")
                if last is None:
                    try:
                        lines = metrics.read_bytes().count(b"\n")
                    except OSError:
                        lines = 0
                    if first is None and lines >= k:
                        first = (lines, _proc_cpu(proc.pid))
                    elif first is not None and lines >= n:
                        last = (lines, _proc_cpu(proc.pid))
                time.sleep(0.02)
        finally:
            if proc.poll() is None:  # SIGINT lets the launcher stop its workers (own sessions)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(45)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    launcher = None
    if first and last and first[1] is not None and last[1] is not None and last[0] > first[0]:
        launcher = 1000 * (last[1] - first[1]) / (last[0] - first[0])
    return time.perf_counter() - t0, launcher


def configs(args: argparse.Namespace) -> list[Config]:
    out = []
    for world in args.worlds:
        if args.global_batch % world:
            raise SystemExit(f"global batch {args.global_batch} does not split over {world}")
        full = args.global_batch // world
        out += [Config(name, world, full, flags) for name, flags in VARIANTS
                if name in args.variants]
        if args.small_chunk and args.small_chunk != full:
            if args.global_batch % args.small_chunk:
                raise SystemExit(f"--small-chunk {args.small_chunk} does not divide the batch")
            out.append(Config("small-chunk", world, args.small_chunk))
    return out


def machine_info() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None,
            "cpu_model": model, "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "load_avg_start": list(os.getloadavg())}


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def measure(args: argparse.Namespace, work: Path) -> list[dict]:
    """The rounds: per world size, DDP and the dyntrain configs, order flipped every round."""
    runs = []
    cfgs = configs(args)
    for rnd in range(args.rounds):
        for world in args.worlds:
            jobs: list[tuple[str, Config | None]] = [("ddp", None)]
            jobs += [("dyntrain", c) for c in cfgs if c.world == world]
            if rnd % 2:
                jobs.reverse()
            for system, cfg in jobs:
                tag = f"r{rnd}-w{world}-{system}" + (f"-{cfg.name}-c{cfg.chunk}" if cfg else "")
                before = cpu_accounts()
                if system == "ddp":
                    res = run_ddp(args, world, work, tag)
                else:
                    res = run_dyntrain(args, cfg, work, tag)
                other = other_load(before, cpu_accounts(), res["wall_s"])
                res = {"round": rnd, "system": system, "world_size": world,
                       "chunk_size": cfg.chunk if cfg else args.global_batch // world,
                       "config": cfg.name if cfg else "ddp", "other_load_cores": other, **res}
                runs.append(res)
                print(f"  round {rnd} world {world} {system:8s} chunk {res['chunk_size']:>4}: "
                      f"{res['samples_per_s']:8.0f} samples/s  step {res['step_ms']:6.1f} ms  "
                      f"(run {res['wall_s']:.1f} s, CPU {res['cpu_ms_per_step']:.1f} ms/step, "
                      f"other load {_fmt(other, '.2f')} cores)", flush=True)
    return runs


def summarize(args: argparse.Namespace, runs: list[dict]) -> list[dict]:
    rows = []
    for cfg in configs(args):
        pairs = []
        for rnd in range(args.rounds):
            ddp = [r for r in runs if r["round"] == rnd and r["system"] == "ddp"
                   and r["world_size"] == cfg.world]
            dyn = [r for r in runs if r["round"] == rnd and r["system"] == "dyntrain"
                   and r["world_size"] == cfg.world and r["config"] == cfg.name]
            if ddp and dyn:
                pairs.append((ddp[0], dyn[0]))
        if not pairs:
            continue
        med = statistics.median

        def col(system: int, key: str, pairs=pairs) -> list[float]:
            return [p[system][key] for p in pairs]

        ratios = [d["samples_per_s"] / b["samples_per_s"] for b, d in pairs]
        launcher = [v for v in col(1, "launcher_cpu_ms_per_step") if v is not None]
        other = [v for b, d in pairs for v in (b["other_load_cores"], d["other_load_cores"])
                 if v is not None]
        row = {"config": cfg.name, "world_size": cfg.world, "chunk_size": cfg.chunk,
               "chunks_per_worker": args.global_batch // cfg.chunk // cfg.world,
               "rounds": len(pairs),
               "ddp_samples_per_s": med(col(0, "samples_per_s")),
               "dyntrain_samples_per_s": med(col(1, "samples_per_s")),
               "ddp_step_ms": med(col(0, "step_ms")),
               "dyntrain_step_ms": med(col(1, "step_ms")),
               # the headline: dyntrain/DDP samples/s within each round, median over rounds
               "ratio_median": med(ratios), "ratios": ratios,
               # checks less sensitive to other load on the machine: the best run of each
               # system, and the 20th percentile of step times within each run
               "ratio_best_runs": max(col(1, "samples_per_s")) / max(col(0, "samples_per_s")),
               "ratio_p20_step": med(b["p20_step_ms"] / d["p20_step_ms"] for b, d in pairs),
               # CPU time per steady-state step, all workers (+ the dyntrain launcher): what each
               # system costs, nearly independent of how busy the rest of the machine is
               "ddp_cpu_ms_per_step": med(col(0, "cpu_ms_per_step")),
               "dyntrain_cpu_ms_per_step": med(col(1, "cpu_ms_per_step")),
               "dyntrain_launcher_cpu_ms_per_step": med(launcher) if launcher else None,
               "cpu_ratio_dyntrain_over_ddp": med(d["cpu_ms_per_step"] / b["cpu_ms_per_step"]
                                                  for b, d in pairs),
               "other_load_cores_median": med(other) if other else None}
        quiet = [d["samples_per_s"] / b["samples_per_s"] for b, d in pairs
                 if all(x["other_load_cores"] is not None and x["other_load_cores"] < QUIET
                        for x in (b, d))]
        # the rounds in which neither run shared the machine with more than QUIET cores of load
        row["ratio_quiet_rounds"] = med(quiet) if quiet else None
        row["quiet_rounds"] = len(quiet)
        if cfg.name == "like-for-like":
            row["goal"] = f"ratio_median >= {GOAL}"
            row["meets_goal"] = row["ratio_median"] >= GOAL
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    head = (f"{'config':<14} {'world':>5} {'chunk':>5} {'DDP samples/s':>13} "
            f"{'dyntrain samples/s':>18} {'DDP ms':>6} {'dyn ms':>6} {'ratio':>6}  "
            f"{'quiet':>9} {'best':>5} {'p20':>5}  {'CPU ms/step DDP/dyn':>19}  "
            f"goal (ratio >= {GOAL})")
    print(head)
    print("-" * len(head))
    for r in rows:
        goal = ("met" if r["meets_goal"] else "MISSED") if "meets_goal" in r else ""
        cpu = (f"{r['ddp_cpu_ms_per_step']:.1f}/{r['dyntrain_cpu_ms_per_step']:.1f} "
               f"({r['cpu_ratio_dyntrain_over_ddp']:.2f}x)")
        print(f"{r['config']:<14} {r['world_size']:>5} {r['chunk_size']:>5} "
              f"{r['ddp_samples_per_s']:>13.0f} {r['dyntrain_samples_per_s']:>18.0f} "
              f"{r['ddp_step_ms']:>6.1f} {r['dyntrain_step_ms']:>6.1f} "
              f"{r['ratio_median']:>6.3f}  {_fmt(r['ratio_quiet_rounds'], '.3f'):>5} "
              f"({r['quiet_rounds']}) {r['ratio_best_runs']:>5.3f} "
              f"{r['ratio_p20_step']:>5.3f}  {cpu:>19}  {goal}")
    print("\nratio = dyntrain/DDP samples/s per round (runs back to back), median over rounds; "
          "per round:")
    for r in rows:
        print(f"  {r['config']:<14} world {r['world_size']} chunk {r['chunk_size']:>4}: "
              + " ".join(f"{x:.3f}" for x in r["ratios"])
              + f"   (other load on the machine: median "
              f"{_fmt(r['other_load_cores_median'], '.2f')} cores)")
    print(f"quiet = median ratio over the (n) rounds in which other processes used < {QUIET} "
          "cores during both runs;")
    print("best = best dyntrain run / best DDP run; p20 = from each run's 20th-percentile step "
          "time (both less\nsensitive to other load); CPU ms/step = summed over the workers "
          "(+ dyntrain's launcher process).")


def profile(args: argparse.Namespace, work: Path) -> list[dict]:
    """One instrumented dyntrain run per config, beside one DDP run: ms per step by part."""
    out = []
    for cfg in configs(args):
        tag = f"profile-w{cfg.world}-c{cfg.chunk}-{cfg.name}"
        prefix = work / tag
        ddp = run_ddp(args, cfg.world, work, f"{tag}-ddp")
        dyn = run_dyntrain(args, cfg, work, tag, ["--profile", str(prefix)])
        workers = [json.loads(p.read_text()) for p in sorted(work.glob(f"{tag}-w*.json"))]
        out.append({"config": cfg.name, "world_size": cfg.world, "chunk_size": cfg.chunk,
                    "ddp_step_ms": ddp["step_ms"], "ddp_parts_ms": ddp["parts_ms_per_step"],
                    "dyntrain_step_ms": dyn["step_ms"], "dyntrain_workers": workers})
    return out


def print_profile(entries: list[dict]) -> None:
    for e in entries:
        print(f"\n{e['config']} world {e['world_size']} chunk {e['chunk_size']}: "
              f"DDP {e['ddp_step_ms']:.1f} ms/step "
              f"({', '.join(f'{k} {v:.2f}' for k, v in e['ddp_parts_ms'].items())}); "
              f"dyntrain {e['dyntrain_step_ms']:.1f} ms/step (leader)")
        for w in e["dyntrain_workers"]:
            parts = w["parts_ms_per_step"]
            top = [k for k in parts if "." not in k]
            other = w["step_ms"] - sum(parts[k] for k in top)
            print(f"  rank {w['rank']} step {w['step_ms']:.2f} ms: "
                  + ", ".join(f"{k} {parts[k]:.2f}" for k in top)
                  + f", unaccounted {other:.2f}")
            inner = [k for k in parts if "." in k]
            print("    inside: " + ", ".join(f"{k} {parts[k]:.3f}" for k in inner))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds (~1-2 minutes)")
    ap.add_argument("--rounds", type=int, default=None, help="A/B rounds [5; quick: 2]")
    ap.add_argument("--steps", type=int, default=None, help="steps per run [50; quick: 30]")
    ap.add_argument("--worlds", default="1,2", help="world sizes, comma-separated")
    ap.add_argument("--width", type=int, default=32, help="DigitsNet width")
    ap.add_argument("--hidden", type=int, default=0,
                    help="> 0: an MLP 64-H-H-H-10 instead of DigitsNet (e.g. 2048: 8.5M params)")
    ap.add_argument("--variants", default="like-for-like,float64-allreduce,no-overlap,float32",
                    help="one-chunk-per-worker variants, comma-separated, of: "
                    + ", ".join(name for name, _ in VARIANTS))
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--small-chunk", type=int, default=32,
                    help="chunk size of the accumulation config (0: skip it)")
    ap.add_argument("--warmup-frac", type=float, default=0.2,
                    help="leading fraction of steps left out of the measurement")
    ap.add_argument("--profile", action="store_true",
                    help="afterwards, one instrumented run per config: ms per step by part")
    ap.add_argument("--profile-only", action="store_true", help="only the instrumented runs")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--out", default=None,
                    help="JSON results [bench/results/overhead.json; --profile-only: "
                    "bench/results/overhead_profile.json]")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="keep run folders and logs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.steps = args.steps or (30 if args.quick else 50)
    args.worlds = [int(w) for w in args.worlds.split(",")]
    args.variants = args.variants.split(",")
    unknown = set(args.variants) - {name for name, _ in VARIANTS}
    if unknown:
        raise SystemExit(f"unknown --variants: {', '.join(sorted(unknown))}")
    name = "overhead_profile.json" if args.profile_only else "overhead.json"
    args.out = args.out or str(BENCH / "results" / name)

    if args.keep:
        work = Path(args.keep)
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="dyntrain-overhead-"))
    info = machine_info()
    started = time.perf_counter()
    print(f"dyntrain vs DDP: {model_name(args)}, global batch {args.global_batch}, "
          f"{args.steps} steps/run (first {args.warmup_frac:.0%} skipped), {args.rounds} rounds, "
          f"{info['cpu_count']} CPUs, torch {info['torch']}", flush=True)
    try:
        runs = [] if args.profile_only else measure(args, work)
        rows = summarize(args, runs) if runs else []
        prof = profile(args, work) if args.profile or args.profile_only else None
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    info["load_avg_end"] = list(os.getloadavg())
    if rows:
        print()
        print_table(rows)
    if prof:
        print_profile(prof)
    result = {"benchmark": "dyntrain vs torch DDP steady-state throughput (CPU, gloo)",
              "machine": info,
              "settings": {"model": model_name(args),
                           "data": "synthetic 8x8x1, 10 classes",
                           "optimizer": "SGD lr 0.05 momentum 0.9 nesterov wd 1e-4",
                           "global_batch": args.global_batch, "steps_per_run": args.steps,
                           "warmup_frac": args.warmup_frac, "rounds": args.rounds,
                           "threads_per_worker": 1, "backend": "gloo",
                           "ddp": "DistributedDataParallel defaults, plain processes, env://",
                           "measure": "rank 0 wall time from end of step k to end of last step",
                           "quick": args.quick},
              "goal": f"like-for-like dyntrain/DDP median ratio >= {GOAL}",
              "summary": rows, "runs": runs, "total_seconds": time.perf_counter() - started}
    if prof:
        result["profile"] = prof
    write_result(args.out, result)


if __name__ == "__main__":
    main()
