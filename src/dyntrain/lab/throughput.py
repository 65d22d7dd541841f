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
for every run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dyntrain.elastic.protocol import FAILURE_TIMEOUT
from dyntrain.errors import ConfigError, DyntrainError
from dyntrain.outdir import make_out_dir

MODES = ("weak", "strong")
DIGITS = ["-m", "dyntrain.workloads.digits"]
# For the built-in workload: no periodic checkpoints inside the timed window, and enough epochs
# for any step count (``--max-steps`` is what ends the run). User arguments come after these.
DIGITS_DEFAULTS = ["--epochs", "1000000", "--checkpoint-every", "1000000"]
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


# ---- configuration -------------------------------------------------------------------------------


def parse_worker_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (sorted, without duplicates); ConfigError when malformed."""
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts):
        raise ConfigError("--workers needs a comma-separated list of worker counts, e.g. 1,2,4")
    counts = []
    for part in parts:
        try:
            count = int(part)
        except ValueError:
            raise ConfigError(f"--workers {text!r}: {part!r} is not a whole number "
                              "(expected e.g. 1,2,4)") from None
        if count < 1:
            raise ConfigError(f"--workers {text!r}: worker counts must be at least 1, got {count}")
        counts.append(count)
    return sorted(set(counts))


def parse_modes(text: str) -> tuple[str, ...]:
    """``weak``, ``strong`` or ``both``."""
    if text == "both":
        return MODES
    if text in MODES:
        return (text,)
    raise ConfigError(f"--mode must be weak, strong or both, got {text!r}")


@dataclass(frozen=True)
class ThroughputConfig:
    """What ``dyntrain lab throughput`` measures; validated on construction (ConfigError)."""

    workers: tuple[int, ...] = (1, 2, 4)
    modes: tuple[str, ...] = MODES
    per_worker_batch: int = 32  # weak scaling: global batch = per_worker_batch x workers
    global_batch: int = 128  # strong scaling: the same global batch at every worker count
    chunk_size: int = 8
    steps: int = 30  # optimizer steps each run trains (passed as --max-steps)
    warmup: int = 5  # leading steps left out of the timing
    command: tuple[str, ...] = tuple(DIGITS)  # SCRIPT ARGS... or -m MODULE ARGS...
    out_dir: str = "runs/throughput"
    threads_per_worker: int = 1  # OMP_NUM_THREADS & co. in every worker
    repeats: int = 1  # runs per (mode, workers); the median-throughput run counts
    failure_timeout: float = FAILURE_TIMEOUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(sorted(set(self.workers))))
        object.__setattr__(self, "modes", tuple(m for m in MODES if m in self.modes))
        object.__setattr__(self, "command", tuple(self.command))
        if not self.workers:
            raise ConfigError("--workers needs at least one worker count, e.g. 1,2,4")
        if self.workers[0] < 1:
            raise ConfigError(f"worker counts must be at least 1, got {self.workers[0]}")
        if not self.modes:
            raise ConfigError("--mode must be weak, strong or both")
        if self.chunk_size < 1:
            raise ConfigError(f"--chunk-size must be positive, got {self.chunk_size}")
        if self.warmup < 1:
            raise ConfigError(f"--warmup must be at least 1, got {self.warmup}: only step ends "
                              "are timed, so the first step is always left out")
        if self.steps < self.warmup + 2:
            raise ConfigError(
                f"--steps ({self.steps}) must exceed --warmup ({self.warmup}) by at least 2: the "
                "warm-up steps and the last step (which writes the final checkpoint) are not "
                f"timed; use --steps {self.warmup + 2} or more")
        if self.repeats < 1:
            raise ConfigError(f"--repeat must be at least 1, got {self.repeats}")
        if self.threads_per_worker < 1:
            raise ConfigError("threads per worker must be at least 1")
        if not self.command:
            raise ConfigError("the workload command is empty")
        if "weak" in self.modes:
            self._check_weak()
        if "strong" in self.modes:
            self._check_strong()

    def _check_weak(self) -> None:
        b, c = self.per_worker_batch, self.chunk_size
        if b < 1:
            raise ConfigError(f"--per-worker-batch must be positive, got {b}")
        if b % c:
            raise ConfigError(f"weak scaling: --per-worker-batch {b} is not a multiple of "
                              f"--chunk-size {c}; each worker computes whole chunks")

    def _check_strong(self) -> None:
        g, c, most = self.global_batch, self.chunk_size, self.workers[-1]
        if g < 1:
            raise ConfigError(f"--global-batch must be positive, got {g}")
        if g % c:
            raise ConfigError(f"strong scaling: --global-batch {g} is not a multiple of "
                              f"--chunk-size {c}")
        chunks = g // c
        if chunks < most:
            raise ConfigError(
                f"strong scaling needs at least one chunk per worker: --global-batch {g} / "
                f"--chunk-size {c} = {chunks} chunks, fewer than {most} workers; raise "
                f"--global-batch to {c * most} or more, or lower --chunk-size to "
                f"{max(1, g // most)} or less")
        uneven = [n for n in self.workers if chunks % n]
        if uneven:
            step = c * math.lcm(*self.workers)
            raise ConfigError(
                f"strong scaling splits the global batch evenly: --global-batch {g} / "
                f"--chunk-size {c} = {chunks} chunks do not divide among "
                f"{', '.join(map(str, uneven))} workers; use a global batch that is a multiple "
                f"of {step}")

    def global_batch_for(self, mode: str, workers: int) -> int:
        return self.per_worker_batch * workers if mode == "weak" else self.global_batch

    @property
    def timed_steps(self) -> int:
        return self.steps - 1 - self.warmup

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workers"], d["modes"], d["command"] = list(self.workers), list(self.modes), \
            list(self.command)
        return d


def workload_argv(config: ThroughputConfig, global_batch: int | str) -> list[str]:
    """The worker's command line for one run: the user's command plus the lab's settings."""
    command = list(config.command)
    if command[:2] == DIGITS:
        command = [*DIGITS, *DIGITS_DEFAULTS, *command[2:]]
    return [*command, "--global-batch", str(global_batch), "--chunk-size",
            str(config.chunk_size), "--max-steps", str(config.steps)]


# ---- measurement and the math (pure) -------------------------------------------------------------


@dataclass(frozen=True)
class RunMeasurement:
    """The steady-state throughput of one job with a fixed number of workers."""

    mode: str
    workers: int
    global_batch: int
    chunk_size: int
    timed_steps: int
    seconds: float  # from the end of step `warmup` to the end of the last timed step
    samples_per_s: float
    step_ms_median: float
    run_dir: str = ""
    other_load_cores: float | None = None  # CPU other processes used during the run, in cores
    repeat_samples_per_s: tuple[float, ...] = ()  # every repeat's samples/s (when repeated)


@dataclass(frozen=True)
class ScalingRow:
    """One line of the scaling table."""

    mode: str
    workers: int
    global_batch: int
    per_worker_batch: float
    chunks_per_worker: float
    samples_per_s: float
    step_ms_median: float
    other_load_cores: float | None
    baseline_workers: int
    ideal_samples_per_s: float  # linear scaling from the baseline
    speedup: float  # samples/s relative to the baseline
    efficiency: float  # speedup / (workers / baseline_workers)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_metrics(records: Iterable[dict], *, global_batch: int, warmup: int, steps: int,
                    workers: int | None = None) -> tuple[int, float, float, float]:
    """(timed steps, seconds, samples/s, median step ms) from metrics.jsonl records.

    Uses the leader's step-end ``time`` of steps ``warmup`` .. ``steps - 1``: seconds is the
    span between the first and the last of them, so ``steps - 1 - warmup`` steps are timed.
    Raises DyntrainError naming what is missing or inconsistent.
    """
    ends: dict[int, float] = {}
    for r in records:
        if r.get("recomputed") or "time" not in r or "step" not in r:
            continue
        if workers is not None and r.get("world_size") not in (None, workers):
            raise DyntrainError(f"the run changed size: step {r['step']} ran with "
                                f"{r.get('world_size')} workers instead of {workers}")
        ends[int(r["step"])] = float(r["time"])
    last = steps - 1
    missing = [s for s in range(warmup, last + 1) if s not in ends]
    if missing:
        done = max(ends, default=0)
        raise DyntrainError(
            f"metrics.jsonl has no step-end time for step {missing[0]} (the run reached step "
            f"{done} of {steps}); does the workload accept --max-steps, and does it have enough "
            "data/epochs for that many steps?")
    seconds = ends[last] - ends[warmup]
    if seconds <= 0:
        raise DyntrainError("step-end times in metrics.jsonl do not increase")
    timed = last - warmup
    durations = sorted(ends[s] - ends[s - 1] for s in range(warmup + 1, last + 1))
    mid = len(durations) // 2
    median = durations[mid] if len(durations) % 2 else (durations[mid - 1] + durations[mid]) / 2
    return timed, seconds, global_batch * timed / seconds, median * 1000.0


def efficiency_table(results: Sequence[RunMeasurement]) -> list[ScalingRow]:
    """Speed-up and efficiency of every run against the smallest worker count of its mode.

    Rows come out grouped by mode (weak before strong) and sorted by worker count.
    """
    rows = []
    for mode in [*MODES, *sorted({r.mode for r in results} - set(MODES))]:
        runs = sorted((r for r in results if r.mode == mode), key=lambda r: r.workers)
        if not runs:
            continue
        base = runs[0]
        base_rate = base.samples_per_s / base.workers  # samples/s per worker at the baseline
        for r in runs:
            speedup = r.samples_per_s / base.samples_per_s
            rows.append(ScalingRow(
                mode=mode, workers=r.workers, global_batch=r.global_batch,
                per_worker_batch=r.global_batch / r.workers,
                chunks_per_worker=r.global_batch / r.chunk_size / r.workers,
                samples_per_s=r.samples_per_s, step_ms_median=r.step_ms_median,
                other_load_cores=r.other_load_cores,
                baseline_workers=base.workers, ideal_samples_per_s=base_rate * r.workers,
                speedup=speedup, efficiency=speedup * base.workers / r.workers))
    return rows


# ---- the machine ---------------------------------------------------------------------------------


def hardware() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, GPU, torch and the collective backend."""
    import torch

    cpu = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    cpu = cpu or platform.processor() or platform.machine()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu_name = torch.cuda.get_device_name(0) if gpus else None
    info = {"cpu_model": cpu, "cpu_cores": usable, "cpu_count": os.cpu_count(),
            "gpu": gpu_name, "gpu_count": gpus, "torch": torch.__version__,
            "backend": "nccl" if gpus else "gloo", "device": "cuda" if gpus else "cpu",
            "python": platform.python_version(), "platform": platform.platform(),
            "hostname": platform.node()}
    info["summary"] = describe_hardware(info)
    return info


def describe_hardware(hw: dict[str, Any]) -> str:
    gpu = f"{hw['gpu_count']} x {hw['gpu']}" if hw.get("gpu_count") else "no GPU"
    return (f"{hw['cpu_model']}, {hw['cpu_cores']} CPU cores, {gpu}, torch {hw['torch']}, "
            f"{hw['backend']}")


def oversubscribed(workers: int, hw: dict[str, Any], threads_per_worker: int = 1) -> bool:
    """More worker threads than cores (CPU) or more workers than GPUs."""
    if hw.get("gpu_count"):
        return workers > hw["gpu_count"]
    return workers * threads_per_worker > hw["cpu_cores"]


# ---- running the jobs ----------------------------------------------------------------------------


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


def cpu_accounts() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its reaped
    children, the workers); None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    except (OSError, ValueError):
        return None
    busy = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def other_load(before, after, wall: float) -> float | None:
    """Cores' worth of CPU that processes other than ours used during a run."""
    if before is None or after is None or wall <= 0:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall


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
    records = [json.loads(line) for line in
               (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    try:
        timed, seconds, rate, step_ms = measure_metrics(
            records, global_batch=global_batch, warmup=config.warmup, steps=config.steps,
            workers=workers)
    except DyntrainError as exc:
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


# ---- outputs -------------------------------------------------------------------------------------


def markdown_table(doc: dict[str, Any]) -> str:
    hw, cfg = doc["hardware"], doc["config"]
    threads = cfg.get("threads_per_worker", 1)
    lines = [
        "# Scaling efficiency (`dyntrain lab throughput`)", "",
        f"Hardware: {hw['summary']}.  ",
        f"Workload: `{' '.join(doc['workload'])}` (G: the run's global batch), "
        f"{threads} thread(s) per worker.  ",
        f"Measured: {doc['measure']}.  ",
        "Weak scaling: per-worker batch fixed at "
        f"{cfg['per_worker_batch']}; strong scaling: global batch fixed at {cfg['global_batch']}. "
        "Efficiency = speed-up / (workers / baseline workers)."
        + (f" Each row: the median of {cfg['repeats']} runs." if cfg.get("repeats", 1) > 1
           else ""),
        "",
        "| mode | workers | global batch | per-worker batch | chunks/worker | samples/s "
        "| ideal samples/s | step ms (median) | speed-up | efficiency | other load (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    over = False
    for r in doc["rows"]:
        mark = ""
        if oversubscribed(r["workers"], hw, threads):
            mark, over = "*", True
        lines.append(
            f"| {r['mode']} | {r['workers']}{mark} | {r['global_batch']} | "
            f"{_num(r['per_worker_batch'])} | {_num(r['chunks_per_worker'])} | "
            f"{r['samples_per_s']:.1f} | {r['ideal_samples_per_s']:.1f} | "
            f"{r['step_ms_median']:.2f} | {r['speedup']:.2f} | {r['efficiency']:.1%} | "
            f"{'n/a' if r['other_load_cores'] is None else format(r['other_load_cores'], '.2f')} "
            "|")
    lines += ["", "Other load: CPU that processes other than this experiment used during the "
              "run, in cores (the machine is shared when it is well above 0)."]
    if over:
        unit = (f"{hw['gpu_count']} GPU(s)" if hw.get("gpu_count")
                else f"{hw['cpu_cores']} CPU cores")
        lines += ["", f"\\* more workers than this machine has {unit}: the workers share them, "
                  "so these rows measure contention for the hardware as much as the cost of "
                  "data parallelism."]
    return "\n".join(lines) + "\n"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def plot(doc: dict[str, Any], path: Path) -> None:
    """samples/s vs workers (with ideal linear scaling) and efficiency vs workers."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    ax_rate, ax_eff = fig.subplots(1, 2)
    colors = {"weak": "tab:blue", "strong": "tab:orange"}
    counts = sorted({r["workers"] for r in doc["rows"]})
    for mode in [m for m in MODES if any(r["mode"] == m for r in doc["rows"])]:
        rows = [r for r in doc["rows"] if r["mode"] == mode]
        x = [r["workers"] for r in rows]
        color = colors.get(mode)
        ax_rate.plot(x, [r["samples_per_s"] for r in rows], "o-", color=color,
                     label=f"{mode} (measured)")
        ax_rate.plot(x, [r["ideal_samples_per_s"] for r in rows], "--", color=color, alpha=0.6,
                     label=f"{mode} (ideal, linear)")
        ax_eff.plot(x, [100 * r["efficiency"] for r in rows], "o-", color=color, label=mode)
    ax_eff.axhline(100, color="grey", linestyle="--", linewidth=1, label="ideal")
    cores = doc["hardware"].get("gpu_count") or doc["hardware"].get("cpu_cores")
    if cores and counts and counts[-1] > cores:
        for ax in (ax_rate, ax_eff):
            ax.axvline(cores, color="grey", linestyle=":", linewidth=1)
        unit = "GPUs" if doc["hardware"].get("gpu_count") else "cores"
        ax_eff.text(cores, 5, f" {cores} {unit}", color="grey", fontsize=8)
    for ax in (ax_rate, ax_eff):
        ax.set_xlabel("workers")
        ax.set_xticks(counts)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_rate.set_ylabel("samples/s")
    ax_rate.set_title("throughput")
    ax_eff.set_ylabel("scaling efficiency (%)")
    ax_eff.set_ylim(0, 110)
    ax_eff.set_title("efficiency = speed-up / workers")
    fig.suptitle(doc["hardware"]["summary"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_outputs(doc: dict[str, Any], out: Path) -> dict[str, Path]:
    """throughput.json, throughput.md and throughput.png under ``out``."""
    make_out_dir(out, "--out")
    paths = {"json": out / "throughput.json", "md": out / "throughput.md",
             "png": out / "throughput.png"}
    paths["json"].write_text(json.dumps(doc, indent=2) + "\n")
    paths["md"].write_text(markdown_table(doc))
    plot(doc, paths["png"])
    return paths


__all__ = [
    "RunMeasurement",
    "ScalingRow",
    "ThroughputConfig",
    "efficiency_table",
    "hardware",
    "markdown_table",
    "measure_metrics",
    "parse_modes",
    "parse_worker_counts",
    "run_one",
    "run_throughput",
    "workload_argv",
    "write_outputs",
]
