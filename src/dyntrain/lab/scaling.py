"""The scaling-efficiency experiment (``dyntrain lab throughput``): its settings, and the
math from step times to samples/s, speed-up and efficiency (pure).

What the experiment is: :mod:`dyntrain.lab.throughput`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dyntrain.elastic.protocol import FAILURE_TIMEOUT
from dyntrain.elastic.runs.rows import MetricsRow
from dyntrain.errors import ConfigError, DyntrainError

MODES = ("weak", "strong")
DIGITS = ["-m", "dyntrain.workloads.digits"]
# For the built-in workload: no periodic checkpoints inside the timed window, and enough epochs
# for any step count (``--max-steps`` is what ends the run). User arguments come after these.
DIGITS_DEFAULTS = ["--epochs", "1000000", "--checkpoint-every", "1000000"]


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


def measure_metrics(records: Iterable[MetricsRow | Mapping[str, Any]], *, global_batch: int,
                    warmup: int, steps: int, workers: int | None = None
                    ) -> tuple[int, float, float, float]:
    """(timed steps, seconds, samples/s, median step ms) from the rows of a run's metrics.jsonl.

    Uses the leader's step-end ``time`` of steps ``warmup`` .. ``steps - 1``: seconds is the
    span between the first and the last of them, so ``steps - 1 - warmup`` steps are timed.
    Rows computed again after a failure, and rows without a time, do not count.
    Raises DyntrainError naming what is missing or inconsistent.

    Args:
        records: the rows (``MetricsRow``, or their JSON objects).
        global_batch: samples per step.
        warmup: the step whose end starts the timing.
        steps: the steps the run trained (its last one is not timed).
        workers: the world size every row must have (None: not checked).
    """
    ends: dict[int, float] = {}
    for r in records:
        row = r if isinstance(r, MetricsRow) else MetricsRow.from_json(r)
        if row.recomputed or row.time is None:
            continue
        if workers is not None and row.world_size not in (None, workers):
            raise DyntrainError(f"the run changed size: step {row.step} ran with "
                                f"{row.world_size} workers instead of {workers}")
        ends[row.step] = float(row.time)
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
