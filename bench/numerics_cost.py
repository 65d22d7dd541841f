"""What pinning a job's numerics costs: training samples/s pinned against the host's best.

A job pins its intra-op threads and CPU kernel level (``dyntrain.elastic.numerics``: default 1
thread and ``avx2`` on x86-64) so that every worker computes the same bits wherever it runs.
This measures what that costs per workload, against the host's best: as many threads as the
host has cores and the kernels torch, oneDNN and MKL pick by themselves (none of
``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_CBWR`` set). The settings:

- ``pinned``: the job's default, 1 thread at the default level (``avx2`` on x86-64);
- ``lowest``: 1 thread at ``default``, the level any x86-64 host runs;
- ``avx512``: 1 thread at ``avx512`` (where the host runs it);
- ``deterministic``: the job's default with deterministic algorithms on;
- ``cores-pinned``: as many threads as cores at the default level (the threads' share of the
  difference apart from the kernels');
- ``best``: the host's best, as above.

Workloads (small sizes, fp32): ``digits`` (``dyntrain.workloads.digits``, its defaults: the CNN,
global batch 64 in chunks of 8), ``gpt`` (``dyntrain.workloads.gpt --model tiny``, 64-byte
windows, global batch 16 in chunks of 4) and ``images`` (``dyntrain.workloads.imagenet --recipe
digits-resnet``: a small ResNet on the digits as 16 px JPEGs packed into shards, as ``make
demo-images`` trains it, global batch 128 in chunks of 32, one loader process).

Each (workload, setting) trains in a fresh process (the kernel level is read when torch
loads): the workload module alone, one worker and no coordinator, as a test's static reference,
through ``bench/numerics_cost_worker.py``, which applies a pinned setting as a job's worker
does. Its samples/s is the global batch over the median time between the ends of its steps in
``metrics.jsonl``, after the warm-up steps. The machine is shared and noisy, so the settings
take turns: each round runs every workload under every setting, the settings in a rotating
order; per round each setting's samples/s is divided by the best's of the same round and
workload, and the report gives the medians over rounds. The settings each process applied
(threads, kernel level as torch reports it) are read back from its ``numerics.json``.

    .venv/bin/python bench/numerics_cost.py            # 2 rounds
    .venv/bin/python bench/numerics_cost.py --quick    # 1 round, half the steps

A round is 18 runs (fewer without AVX-512); a run takes 20-30 s on an idle 2-core host, mostly
the process's start, and minutes on a loaded one (two threads where other processes hold the
cores: up to 5 minutes). The result is written after every round.

Prints a table and writes ``bench/results/numerics_cost.json`` (``bench/report.py`` makes
``docs/benchmarks/numerics-cost.md`` of it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import (  # bench/ is sys.path[0] when run as a script
    JsonlTail,
    kill_tree,
    machine_info,
    process_cpu_seconds,
    write_result,
)
from dyntrain.data import pack
from dyntrain.elastic.numerics import (
    ENV_NAMES,
    LIBRARY_ENV,
    KernelLevel,
    Numerics,
    default_kernels,
    host_levels,
)
from dyntrain.elastic.runs.log import read_metrics
from dyntrain.workloads.digits_images import write_digits_images

BENCH = Path(__file__).resolve().parent
WORKER = BENCH / "numerics_cost_worker.py"
NEVER = "1000000"  # a checkpoint or validation interval no run reaches


@dataclass(frozen=True)
class Setting:
    """One configuration of the numerics: pinned (a ``Numerics``) or the host's own choice."""

    key: str
    threads: int
    kernels: str | None  # a KernelLevel's name; None: torch, oneDNN and MKL choose
    deterministic: bool = False

    @property
    def label(self) -> str:
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        kernels = self.kernels or "the host's own kernels"
        return f"{threads}, {kernels}" + (", deterministic" if self.deterministic else "")

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` without any numerics variable, with this setting's."""
        env = {k: v for k, v in base.items()
               if k not in LIBRARY_ENV and k not in ENV_NAMES and k != "DYNTRAIN_COORDINATOR"}
        if self.kernels is None:
            return {**env, "OMP_NUM_THREADS": str(self.threads),
                    "MKL_NUM_THREADS": str(self.threads)}
        pin = Numerics(threads=self.threads, cpu_kernels=self.kernels,
                       deterministic=self.deterministic)
        return {**env, **pin.env()}


def settings_for(cores: int, levels: list[KernelLevel]) -> list[Setting]:
    """The settings this host can run (``avx512`` only where it has AVX-512)."""
    default = default_kernels().value
    found = [Setting("pinned", 1, default), Setting("lowest", 1, KernelLevel.DEFAULT.value)]
    if KernelLevel.AVX512 in levels:
        found.append(Setting("avx512", 1, KernelLevel.AVX512.value))
    found += [Setting("deterministic", 1, default, deterministic=True),
              Setting("cores-pinned", cores, default), Setting("best", cores, None)]
    return found


@dataclass(frozen=True)
class Workload:
    name: str
    module: str
    args: tuple[str, ...]
    global_batch: int
    warmup: int  # steps left out of the measurement
    steps: int  # steps measured

    def command(self, data: Path) -> list[str]:
        args = [a.replace("{data}", str(data)) for a in self.args]
        return [sys.executable, str(WORKER), self.module, *args,
                "--max-steps", str(self.warmup + self.steps + 1)]


def workloads(quick: bool) -> list[Workload]:
    scale = 2 if quick else 1
    return [
        Workload("digits", "dyntrain.workloads.digits", ("--checkpoint-every", NEVER), 64,
                 warmup=5, steps=40 // scale),
        Workload("gpt", "dyntrain.workloads.gpt",
                 ("--model", "tiny", "--seq-len", "64", "--global-batch", "16", "--chunk-size",
                  "4", "--checkpoint-every", NEVER, "--val-every", NEVER, "--val-samples",
                  "16"), 16, warmup=3, steps=20 // scale),
        Workload("images", "dyntrain.workloads.imagenet",
                 ("--data", "{data}", "--recipe", "digits-resnet", "--loader-workers", "1",
                  "--checkpoint-every", NEVER), 128, warmup=3, steps=12 // scale),
    ]


def prepare_images(work: Path) -> Path:
    """The digits as 16 px JPEGs packed into shards (``make demo-images``'s data)."""
    write_digits_images(work / "jpeg", size=16)
    for split in ("train", "val"):
        pack(str(work / "jpeg" / split), str(work / "packed" / split))
    return work / "packed"


def steady_samples_per_s(out: Path, workload: Workload) -> dict:
    """The run's samples/s after its warm-up steps: the global batch over the median time
    between step ends (and over their mean, for reference)."""
    rows = sorted(read_metrics(out), key=lambda r: r.step)
    times = [r.time for r in rows if r.step > workload.warmup]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    if len(gaps) < 2:
        raise RuntimeError(f"{out}: {len(rows)} steps in metrics.jsonl, too few to measure")
    return {"samples_per_s": workload.global_batch / statistics.median(gaps),
            "samples_per_s_mean": workload.global_batch * len(gaps) / (times[-1] - times[0]),
            "steps_measured": len(gaps)}


def observed(out: Path) -> dict:
    """What the process computed with, as its run folder records it."""
    seen = json.loads((out / "numerics.json").read_text())["settings"]
    return {k: seen.get(k) for k in ("threads", "cpu_capability", "onednn_max_isa", "mkl_cbwr",
                                     "deterministic")}


class CpuMarks:
    """The training process's CPU seconds (all its threads, from /proc) when the rows of the
    first and the last measured step appear in its ``metrics.jsonl``: the CPU time its steps
    took, which other load on the machine disturbs far less than their wall time."""

    def __init__(self, pid: int, out: Path, workload: Workload) -> None:
        self.pid, self.workload = pid, workload
        self.tail = JsonlTail(out / "metrics.jsonl")
        self.first = workload.warmup + 1
        self.last = workload.warmup + workload.steps + 1
        self.cpu: dict[int, float] = {}

    def poll(self) -> None:
        rows = self.tail.poll() if self.tail.path.is_file() else []
        if any(row.get("step") in (self.first, self.last) for row in rows):
            cpu = process_cpu_seconds([self.pid])
            for row in rows:
                if row.get("step") in (self.first, self.last):
                    self.cpu.setdefault(row["step"], cpu)

    def samples_per_cpu_s(self) -> float | None:
        if self.first not in self.cpu or self.last not in self.cpu:
            return None
        spent = self.cpu[self.last] - self.cpu[self.first]
        steps = self.last - self.first
        return self.workload.global_batch * steps / spent if spent > 0 else None


def run_one(workload: Workload, setting: Setting, data: Path, out: Path,
            timeout: float) -> dict:
    env = setting.env(dict(os.environ))
    env.update(DYNTRAIN_OUT=str(out), PYTHONUNBUFFERED="1")
    load = os.getloadavg()[0]
    started = time.perf_counter()
    out.mkdir(parents=True)
    with open(out.parent / f"{out.name}.log", "w") as log:
        proc = subprocess.Popen(workload.command(data), env=env, cwd=BENCH.parent, text=True,
                                stdout=log, stderr=subprocess.STDOUT)
    marks = CpuMarks(proc.pid, out, workload)
    try:
        while proc.poll() is None:
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"{workload.name} with {setting.label}: no end after "
                                   f"{timeout:g} s")
            marks.poll()
            time.sleep(0.005)
    finally:
        kill_tree(proc)
    if proc.returncode != 0:
        output = (out.parent / f"{out.name}.log").read_text()
        raise RuntimeError(f"{workload.name} with {setting.label} failed "
                           f"(exit {proc.returncode}):\n{output[-3000:]}")
    return {"workload": workload.name, "setting": setting.key, "load_before": load,
            "wall_s": time.perf_counter() - started, **steady_samples_per_s(out, workload),
            "samples_per_cpu_s": marks.samples_per_cpu_s(), "observed": observed(out)}


def summarize(runs: list[dict], loads: list[Workload], settings: list[Setting]) -> list[dict]:
    summary = []
    for workload in loads:
        mine = [r for r in runs if r["workload"] == workload.name]
        best = {r["round"]: r["samples_per_s"] for r in mine if r["setting"] == "best"}
        pinned = {r["round"]: r["samples_per_s"] for r in mine if r["setting"] == "pinned"}
        for setting in settings:
            rows = [r for r in mine if r["setting"] == setting.key]
            rates = [r["samples_per_s"] for r in rows]
            ratios = [r["samples_per_s"] / best[r["round"]] for r in rows]
            to_pinned = [r["samples_per_s"] / pinned[r["round"]] for r in rows
                         if r["round"] in pinned]
            per_cpu = [r["samples_per_cpu_s"] for r in rows if r["samples_per_cpu_s"]]
            cpu_pinned = {r["round"]: r["samples_per_cpu_s"] for r in mine
                          if r["setting"] == "pinned" and r["samples_per_cpu_s"]}
            cpu_to_pinned = [r["samples_per_cpu_s"] / cpu_pinned[r["round"]] for r in rows
                             if r["samples_per_cpu_s"] and r["round"] in cpu_pinned]
            seen = rows[0]["observed"]
            summary.append({
                "workload": workload.name, "setting": setting.key, "label": setting.label,
                "samples_per_s_median": statistics.median(rates),
                "samples_per_s_min": min(rates), "samples_per_s_max": max(rates),
                "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "to_pinned_median": statistics.median(to_pinned) if to_pinned else None,
                "samples_per_cpu_s_median": statistics.median(per_cpu) if per_cpu else None,
                "cpu_to_pinned_median": (statistics.median(cpu_to_pinned) if cpu_to_pinned
                                         else None),
                "rounds": len(rows),
                "threads_seen": seen["threads"], "cpu_capability_seen": seen["cpu_capability"]})
    return summary


def table(summary: list[dict]) -> str:
    head = (f"{'workload':<8} {'setting':<14} {'threads, kernels':<42} {'samples/s':>9} "
            f"{'[min, max]':>17} {'/ best':>7} {'[min, max]':>13} {'/ pinned':>8} {'per CPU-s':>9} "
            f"{'/ pinned':>8}  torch saw")
    lines = [head, "-" * len(head)]
    for r in summary:
        spread = f"[{r['samples_per_s_min']:.0f}, {r['samples_per_s_max']:.0f}]"
        ratios = f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]"
        def shown(value, digits):
            return "-" if value is None else f"{value:.{digits}f}"

        lines.append(f"{r['workload']:<8} {r['setting']:<14} {r['label']:<42} "
                     f"{r['samples_per_s_median']:>9.1f} {spread:>17} {r['ratio_median']:>7.3f} "
                     f"{ratios:>13} {shown(r['to_pinned_median'], 3):>8} "
                     f"{shown(r['samples_per_cpu_s_median'], 1):>9} "
                     f"{shown(r['cpu_to_pinned_median'], 3):>8}  {r['threads_seen']} thr, "
                     f"{r['cpu_capability_seen']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round, half the steps")
    ap.add_argument("--rounds", type=int, default=None, help="rounds [2; quick 1]")
    ap.add_argument("--workloads", default=None,
                    help="comma-separated, of digits, gpt, images [all]")
    ap.add_argument("--settings", default=None,
                    help="comma-separated keys of the settings to run besides best [all]")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run [900]")
    ap.add_argument("--out", default=str(BENCH / "results" / "numerics_cost.json"))
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 2)
    if rounds < 1:
        ap.error("--rounds must be at least 1")
    cores = len(os.sched_getaffinity(0))
    settings = settings_for(cores, host_levels())
    if args.settings:
        wanted = set(args.settings.split(",")) | {"best"}
        unknown = wanted - {s.key for s in settings}
        if unknown:
            ap.error(f"unknown or unavailable setting(s) {', '.join(sorted(unknown))}; "
                     f"choose from {', '.join(s.key for s in settings)}")
        settings = [s for s in settings if s.key in wanted]
    loads = workloads(args.quick)
    if args.workloads:
        wanted = args.workloads.split(",")
        unknown = set(wanted) - {w.name for w in loads}
        if unknown:
            ap.error(f"unknown workload(s) {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(w.name for w in loads)}")
        loads = [w for w in loads if w.name in wanted]

    info = {**machine_info(), "cores_usable": cores,
            "kernel_levels": [level.value for level in host_levels()],
            "loadavg_before": list(os.getloadavg())}
    started = time.perf_counter()
    print(f"numerics cost: {rounds} round(s), {len(settings)} settings x {len(loads)} workloads, "
          f"{cores} cores, {info['cpu_model']}, torch {info['torch']}, load "
          f"{info['loadavg_before'][0]:.2f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="dyntrain-numerics-cost-"))
    runs: list[dict] = []
    command = " ".join([".venv/bin/python bench/numerics_cost.py",
                        *(sys.argv[1:] if argv is None else argv)])

    def result(done: int) -> dict:
        """The result of the rounds done so far (written after each: a long run stopped
        keeps them)."""
        info["loadavg_after"] = list(os.getloadavg())
        summary = summarize(runs, loads, settings)
        loads_seen = [r["load_before"] for r in runs]
        return {"benchmark": "pinned numerics: training samples/s against the host's best",
                "command": command, "machine": info,
                "config": {"rounds": done, "rounds_asked": rounds, "quick": args.quick,
                           "cores": cores,
                           "settings": [{**asdict(s), "label": s.label} for s in settings],
                           "workloads": [asdict(w) for w in loads],
                           "measure": "global batch / median time between step ends in "
                                      "metrics.jsonl after the warm-up steps, one fresh process "
                                      "per run; ratio to best per round and workload, median "
                                      "over rounds"},
                "load_during": [min(loads_seen), max(loads_seen)],
                "summary": summary, "runs": runs, "table": table(summary),
                "total_seconds": time.perf_counter() - started}

    try:
        data = prepare_images(work / "images") if any(w.name == "images" for w in loads) \
            else work
        for rnd in range(rounds):
            for i, workload in enumerate(loads):
                shift = (rnd * len(loads) + i) % len(settings)
                for setting in settings[shift:] + settings[:shift]:
                    out = work / f"r{rnd}-{workload.name}-{setting.key}"
                    run = {"round": rnd, **run_one(workload, setting, data, out, args.timeout)}
                    runs.append(run)
                    shutil.rmtree(out, ignore_errors=True)
                    print(f"  round {rnd} {workload.name:<7} {setting.key:<14} "
                          f"{run['samples_per_s']:8.1f} samples/s  (load "
                          f"{run['load_before']:.2f}, {run['wall_s']:.0f} s, torch saw "
                          f"{run['observed']['threads']} thr "
                          f"{run['observed']['cpu_capability']})", flush=True)
            final = result(rnd + 1)
            write_result(args.out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(final["table"])
    print("\nsamples/s: the median over rounds; / best: the median over rounds of the ratio to "
          "the host's best in the same round; / pinned: the same against the job's default;\n"
          "per CPU-s: samples per CPU-second of the training process (all its threads), "
          "median over rounds, and its ratio to the job's default.")


if __name__ == "__main__":
    main()
