"""Scaling efficiency of data parallelism on your own workload: samples/s at 1, 2, 4 ... workers.

Two experiments, each a series of real elastic jobs with exactly N workers (started with
:func:`dyntrain.launch.runner.run_job`, as ``dyntrain run --workers N:N`` would):

* **weak scaling** keeps the batch *per worker* fixed, so the global batch grows with N
  (global batch = per-worker batch x N): ideal throughput grows linearly with N;
* **strong scaling** keeps the *global* batch fixed, so each worker's share shrinks with N:
  the same step is cut into more, smaller pieces, and communication weighs more.

Throughput is measured on the leader's step-end timestamps in ``metrics.jsonl`` (the ``time``
field the trainer records after every optimizer step): from the end of step ``warmup`` to the end
of step ``steps - 1``, giving ``global batch x timed steps / seconds``. The warm-up steps (process
group set-up, first-touch allocations) and the last step (which also writes the final checkpoint
and model) are left out.

For each mode, with ``b`` the smallest worker count measured (normally 1) and ``T(N)`` the
samples/s with N workers::

    speed-up(N)   = T(N) / T(b)
    efficiency(N) = (T(N) / N) / (T(b) / b)      # = T(N) / (N * T(1)) when b = 1

The workload is a command like ``dyntrain run`` takes (``SCRIPT ARGS`` or ``-m MODULE ARGS``;
default: the built-in digits workload). It must build an :class:`ElasticTrainer` and accept
``--global-batch``, ``--chunk-size`` and ``--max-steps``, which the lab appends to its arguments

The settings and the math are :mod:`dyntrain.lab.scaling`, the machine
:mod:`dyntrain.lab.machine`, the outputs :mod:`dyntrain.lab.throughput_output`; this module
runs the jobs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dyntrain.elastic.runs.log import read_metrics
from dyntrain.errors import DyntrainError
from dyntrain.lab.machine import cpu_accounts, hardware, other_load, oversubscribed
from dyntrain.lab.scaling import (
    RunMeasurement,
    ScalingRow,
    ThroughputConfig,
    efficiency_table,
    measure_metrics,
    workload_argv,
)
from dyntrain.lab.throughput_output import write_outputs
from dyntrain.outdir import make_out_dir

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

__all__ = ["progress_line", "run_one", "run_repeated", "run_throughput"]


@contextlib.contextmanager
def _thread_env(threads: int):
    saved = {k: os.environ.get(k) for k in THREAD_VARS}
    os.environ.update({k: str(threads) for k in THREAD_VARS})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _failure_reason(run_dir: Path) -> str:
    """The launcher's 'job failed' line, else the last line a worker wrote."""
    with contextlib.suppress(OSError):
        lines = (run_dir / "launcher.log").read_text(errors="replace").splitlines()
        for line in reversed(lines):
            if "job failed:" in line:
                return line.split("job failed:", 1)[1].strip()
    for log in sorted((run_dir / "logs").glob("*.log")):
        with contextlib.suppress(OSError):
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            if tail:
                return tail[-1].strip()
    return "no error message"


def run_one(config: ThroughputConfig, mode: str, workers: int,
            repeat: int | None = None) -> RunMeasurement:
    """One elastic job with exactly ``workers`` workers; its steady-state throughput."""
    from dyntrain.launch.runner import RunOptions, run_job

    global_batch = config.global_batch_for(mode, workers)
    name = f"{mode}-w{workers}" + (f"-r{repeat}" if repeat is not None else "")
    run_dir = Path(config.out_dir) / "runs" / name
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a leftover checkpoint would make the job resume
    run_dir.mkdir(parents=True)
    opts = RunOptions(command=workload_argv(config, global_batch), min_workers=workers,
                      max_workers=workers, nproc=workers, out_dir=run_dir,
                      failure_timeout=config.failure_timeout, quiet=False)
    with open(run_dir / "launcher.log", "w") as log, _thread_env(config.threads_per_worker):
        before, t0 = cpu_accounts(), time.perf_counter()
        code = run_job(opts, stream=log)
        load = other_load(before, cpu_accounts(), time.perf_counter() - t0)
    if code == 130:  # Ctrl-C: the job's workers are stopped; stop the measurement too
        raise KeyboardInterrupt
    if code != 0:
        raise DyntrainError(f"{mode} scaling with {workers} worker(s) failed: "
                            f"{_failure_reason(run_dir)} (see {run_dir})")
    try:
        timed, seconds, rate, step_ms = measure_metrics(
            read_metrics(run_dir), global_batch=global_batch, warmup=config.warmup,
            steps=config.steps, workers=workers)
    except DyntrainError as exc:  # RunLogError among them
        raise DyntrainError(f"{mode} scaling with {workers} worker(s): {exc}") from None
    # checkpoints and the final model are not results of this experiment
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (run_dir / "final.pt").unlink()
    return RunMeasurement(mode, workers, global_batch, config.chunk_size, timed, seconds, rate,
                          step_ms, str(run_dir), None if load is None else round(load, 3))


def run_repeated(config: ThroughputConfig, mode: str, workers: int) -> RunMeasurement:
    """``config.repeats`` runs of one (mode, workers); the run with the median samples/s."""
    if config.repeats == 1:
        return run_one(config, mode, workers)
    runs = [run_one(config, mode, workers, repeat=i) for i in range(config.repeats)]
    chosen = sorted(runs, key=lambda r: r.samples_per_s)[len(runs) // 2]
    return replace(chosen, repeat_samples_per_s=tuple(r.samples_per_s for r in runs))


def progress_line(row: ScalingRow) -> str:
    load = "" if row.other_load_cores is None else \
        f"  (other load {row.other_load_cores:.2f} cores)"
    return (f"{row.mode:<6} {row.workers:>3} worker(s)  global batch {row.global_batch:>5}  "
            f"{row.samples_per_s:>9.1f} samples/s  step {row.step_ms_median:7.1f} ms  "
            f"speed-up {row.speedup:5.2f}  efficiency {row.efficiency:6.1%}{load}")


def run_throughput(config: ThroughputConfig, *,
                   say: Callable[[str], None] = lambda line: print(line, file=sys.stderr,
                                                                    flush=True),
                   runner: Callable[[ThroughputConfig, str, int], RunMeasurement] = run_repeated,
                   hw: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every (mode, workers) job, write throughput.json/.md/.png; return the JSON document."""
    hw = hw or hardware()
    started, t0 = dt.datetime.now(dt.UTC), time.perf_counter()
    out = make_out_dir(config.out_dir, "--out")
    runs = len(config.modes) * len(config.workers) * config.repeats
    say(f"throughput: {runs} runs on {hw['summary']}; {config.steps} steps each, first "
        f"{config.warmup} and the last not timed")
    results: list[RunMeasurement] = []
    for mode in config.modes:
        for workers in config.workers:
            results.append(runner(config, mode, workers))
            row = [r for r in efficiency_table(results) if r.mode == mode][-1]
            note = "  (oversubscribed)" if oversubscribed(workers, hw,
                                                          config.threads_per_worker) else ""
            say(progress_line(row) + note)
    rows = efficiency_table(results)
    doc = {"experiment": "dyntrain lab throughput", "date": started.isoformat(timespec="seconds"),
           "seconds": round(time.perf_counter() - t0, 1), "config": config.to_dict(),
           "hardware": hw, "workload": workload_argv(config, "G"),
           "measure": (f"leader step-end times from metrics.jsonl, end of step {config.warmup} to "
                       f"end of step {config.steps - 1}: global batch x {config.timed_steps} "
                       "steps / seconds"),
           "rows": [r.to_dict() for r in rows], "runs": [asdict(r) for r in results]}
    write_outputs(doc, out)
    return doc
