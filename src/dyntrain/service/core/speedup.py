"""A job's speed-up model: its samples/s at each world size, fitted on-line from its own steps.

Pure: nothing here reads files, starts or sleeps. The model is the time one sample takes,
``seconds_per_sample(w)``, as three non-negative parts::

    seconds_per_sample(w) = serial + parallel * share(w) + comm * (w - 1)
    share(w) = ceil(chunks / w) / chunks    (chunks per global batch known)
             = 1 / w                        (otherwise)
    throughput(w) = 1 / seconds_per_sample(w)        samples/s

``serial`` is what no worker count shortens (the optimizer step, a fixed part of the
all-reduce), ``parallel`` the chunk work that is split between the workers (with a known chunk
count, the slowest worker's share: 8 chunks on 3 workers is 3 chunks' time), ``comm`` what each
further worker adds (a ring's latency, a coordinator's messages). The global batch is fixed, so a
sample's statistical value does not depend on ``w`` (dyntrain's invariant): throughput is goodput.

``fit_speedup(points)`` fits the parts by non-negative least squares on the measured seconds per
sample, trying every subset of the three and keeping the best fit (ties: the simplest, in the
order ``parallel``; ``serial + parallel``; ``parallel + comm``; all three). One measured size
therefore gives perfect scaling (an optimistic prior a policy then corrects by measuring), two
give Amdahl's law, three or more the full model.

``SpeedupTracker`` feeds on a job's ``metrics.jsonl`` rows (``world_size``, ``samples_per_s``,
``step``, ``total_steps``, ``time``) and ``events.jsonl`` membership records (``latency_s``,
``steps_redone``) and gives a ``JobProfile``: the fitted model, what one re-formation costs, and
the work left; that is what an allocation policy (``dyntrain.service.core.goodput``) reads.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dyntrain.service.core.model import ValidationError

PARTS = ("serial", "parallel", "comm")
# subsets of PARTS tried by the fit, simplest first (a tie goes to the earlier one)
_SUBSETS = ((1,), (0, 1), (1, 2), (0, 1, 2), (0,), (0, 2))
_TIE = 1e-9  # relative residual below which two fits are equally good
REFORMATION_KINDS = ("join", "leave", "crash", "removed")


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ValidationError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _world(w: int) -> int:
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise ValidationError(f"world size must be a whole number >= 1, got {w!r}")
    return w


@dataclass(frozen=True)
class ThroughputPoint:
    """A measured samples/s at one world size; ``weight``: how many steps it summarises."""

    world_size: int
    samples_per_s: float
    weight: float = 1.0

    def __post_init__(self) -> None:
        _world(self.world_size)
        _positive(f"samples/s at world size {self.world_size}", self.samples_per_s)
        _positive("weight", self.weight)


@dataclass(frozen=True)
class SpeedupModel:
    """Seconds per sample at each world size (module doc); parts in seconds per sample."""

    serial: float = 0.0
    parallel: float = 1.0
    comm: float = 0.0
    chunks: int | None = None  # chunks per global batch, when known

    def __post_init__(self) -> None:
        for name in PARTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValidationError(f"speed-up model: {name} must be a finite number >= 0, "
                                      f"got {value!r}")
        if self.serial + self.parallel <= 0:
            raise ValidationError("speed-up model: serial + parallel must be > 0 (one worker "
                                  "must take some time per sample)")
        if self.chunks is not None and (isinstance(self.chunks, bool)
                                        or not isinstance(self.chunks, int) or self.chunks < 1):
            raise ValidationError(f"speed-up model: chunks must be a whole number >= 1, "
                                  f"got {self.chunks!r}")
        object.__setattr__(self, "_rates", {})  # world size -> samples/s, filled on use

    def share(self, w: int) -> float:
        """The slowest worker's part of the parallel work with ``w`` workers."""
        if self.chunks is None:
            return 1.0 / w
        return math.ceil(self.chunks / w) / self.chunks

    def seconds_per_sample(self, w: int) -> float:
        _world(w)
        return self.serial + self.parallel * self.share(w) + self.comm * (w - 1)

    def throughput(self, w: int) -> float:
        """Samples/s with ``w`` workers (0 workers: 0)."""
        rate = self._rates.get(w)
        if rate is None:
            rate = self._rates[w] = 0.0 if w == 0 else 1.0 / self.seconds_per_sample(w)
        return rate

    def speedup(self, w: int) -> float:
        """``throughput(w) / throughput(1)``."""
        return self.throughput(w) / self.throughput(1)

    def efficiency(self, w: int) -> float:
        return self.speedup(w) / w

    def marginal(self, w: int) -> float:
        """What one more worker adds, in units of one worker's throughput (may be < 0)."""
        return self.speedup(w + 1) - (self.speedup(w) if w > 0 else 0.0)

    def best_size(self, most: int) -> int:
        """The world size in 1..most with the highest throughput (the smallest of equals)."""
        return max(range(1, most + 1), key=lambda w: (self.throughput(w), -w))

    def to_dict(self) -> dict:
        return {"serial": self.serial, "parallel": self.parallel, "comm": self.comm,
                "chunks": self.chunks}

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "speed-up model") -> SpeedupModel:
        """From ``to_dict``'s keys (``chunks`` optional); ValidationError names ``source``."""
        if not isinstance(data, Mapping):
            raise ValidationError(f"{source}: expected an object with serial, parallel, comm")
        unknown = set(data) - {*PARTS, "chunks"}
        if unknown:
            raise ValidationError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}")
        try:
            return cls(**{k: data[k] for k in (*PARTS, "chunks") if k in data})
        except ValidationError as exc:
            raise ValidationError(f"{source}: {exc}") from None

    @classmethod
    def from_efficiency(cls, one_worker: float, workers: int, efficiency: float,
                        chunks: int | None = None) -> SpeedupModel:
        """Amdahl's law through two figures: ``one_worker`` samples/s alone and ``efficiency``
        (speed-up / workers) at ``workers``, e.g. a published 92 % at 64 GPUs.

        Args:
            one_worker: samples/s of one worker.
            workers: the world size the efficiency was measured at (> 1).
            efficiency: in (0, 1].
            chunks: chunks per global batch, if known.
        """
        _positive("one_worker", one_worker)
        if _world(workers) < 2:
            raise ValidationError(f"workers must be >= 2 to give an efficiency, got {workers}")
        if not 0 < efficiency <= 1:
            raise ValidationError(f"efficiency must be in (0, 1], got {efficiency!r}")
        # (s + p) / (w * (s + p * share)) = e, with s + p = 1 / one_worker
        total = 1.0 / one_worker
        share = math.ceil(chunks / workers) / chunks if chunks else 1.0 / workers
        serial = total * (1.0 / (efficiency * workers) - share) / (1.0 - share)
        return cls(serial=max(0.0, serial), parallel=total - max(0.0, serial), comm=0.0,
                   chunks=chunks)


def _features(w: int, chunks: int | None) -> tuple[float, float, float]:
    share = 1.0 / w if chunks is None else math.ceil(chunks / w) / chunks
    return (1.0, share, float(w - 1))


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting for a small square system; None if
    singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_speedup(points: Iterable[ThroughputPoint], chunks: int | None = None) -> SpeedupModel:
    """The model that fits the points best (module doc); relative errors are what count, so
    each point's seconds per sample is weighted by its weight over its own square."""
    pts = list(points)
    if not pts:
        raise ValidationError("a speed-up model needs at least one measured throughput")
    rows = [(_features(p.world_size, chunks), 1.0 / p.samples_per_s,
             p.weight * p.samples_per_s ** 2) for p in pts]
    scale = sum(wt * y * y for _, y, wt in rows)
    best: tuple[float, int, list[float]] | None = None
    for rank, subset in enumerate(_SUBSETS):
        a = [[sum(wt * x[i] * x[j] for x, _, wt in rows) for j in subset] for i in subset]
        b = [sum(wt * x[i] * y for x, y, wt in rows) for i in subset]
        coef = _solve(a, b)
        if coef is None or any(c < -1e-12 * max(1.0, abs(max(coef))) for c in coef):
            continue
        full = [0.0, 0.0, 0.0]
        for i, c in zip(subset, coef, strict=True):
            full[i] = max(0.0, c)
        if full[0] + full[1] <= 0:
            continue
        resid = sum(wt * (sum(f * x_ for f, x_ in zip(full, x, strict=True)) - y) ** 2
                    for x, y, wt in rows) / scale
        if best is None or resid < best[0] - _TIE:
            best = (resid, rank, full)
    if best is None:  # unreachable for valid points: (parallel,) always solves
        raise ValidationError("no speed-up model fits these points")
    serial, parallel, comm = best[2]
    return SpeedupModel(serial, parallel, comm, chunks)


@dataclass(frozen=True)
class JobProfile:
    """What an allocation policy knows about a running job.

    ``points``: the measured throughputs the model was fitted on; ``reform_s``: seconds of
    training one membership change costs it (None: not measured yet); ``remaining_samples``:
    the work left (None: unknown).
    """

    model: SpeedupModel
    points: tuple[ThroughputPoint, ...] = ()
    reform_s: float | None = None
    remaining_samples: float | None = None

    def remaining_seconds(self, w: int) -> float | None:
        """How long the work left takes at ``w`` workers (None: unknown; inf at 0)."""
        if self.remaining_samples is None:
            return None
        return math.inf if w <= 0 else self.remaining_samples / self.model.throughput(w)

    def to_dict(self) -> dict:
        return {"model": self.model.to_dict(),
                "points": [[p.world_size, p.samples_per_s, p.weight] for p in self.points],
                "reform_s": self.reform_s, "remaining_samples": self.remaining_samples}


@dataclass
class SpeedupTracker:
    """Builds a job's ``JobProfile`` from its metrics rows and membership events, on-line.

    The first step of each new world (after a change of world size or a gap in the steps) is
    left out: it includes the re-formation. Each world size keeps its last ``window`` steps,
    and its point is their median (robust against a slow step now and then).

    Args:
        chunks: chunks per global batch, when the caller knows it.
        window: steps kept per world size.
    """

    chunks: int | None = None
    window: int = 64
    _steps: dict[int, deque] = field(default_factory=dict, init=False)
    _costs: deque = field(default_factory=lambda: deque(maxlen=16), init=False)
    _batches: deque = field(default_factory=lambda: deque(maxlen=16), init=False)
    _last: dict | None = field(default=None, init=False)
    _model: tuple[tuple, SpeedupModel] | None = field(default=None, init=False)

    def observe_step(self, row: Mapping) -> None:
        """One ``metrics.jsonl`` row; rows without a world size or samples/s are ignored."""
        try:
            w, rate, step = int(row["world_size"]), float(row["samples_per_s"]), int(row["step"])
        except (KeyError, TypeError, ValueError):
            return
        last, self._last = self._last, dict(row)
        if w < 1 or not rate > 0 or not math.isfinite(rate):
            return
        if last is None or last.get("world_size") != w or last.get("step") != step - 1:
            return  # a new world's first step carries its re-formation
        self._steps.setdefault(w, deque(maxlen=self.window)).append(1.0 / rate)
        try:
            seconds = float(row["time"]) - float(last["time"])
        except (KeyError, TypeError, ValueError):
            return
        if seconds > 0:
            self._batches.append(rate * seconds)

    def observe_change(self, record: Mapping) -> None:
        """One membership record of ``events.jsonl`` (join, leave, crash, removed)."""
        if record.get("event") not in REFORMATION_KINDS:
            return
        try:
            latency = float(record["latency_s"])
        except (KeyError, TypeError, ValueError):
            return
        redone = int(record.get("steps_redone") or 0)
        step_s = self._step_seconds(record.get("world_before"))
        self._costs.append(max(0.0, latency) + redone * step_s)

    def _step_seconds(self, w) -> float:
        seconds = self._steps.get(w) if isinstance(w, int) else None
        if not seconds or not self._batches:
            return 0.0
        return statistics.median(seconds) * statistics.median(self._batches)

    def points(self) -> list[ThroughputPoint]:
        """One point per world size measured: the median of its recent steps."""
        return [ThroughputPoint(w, 1.0 / statistics.median(s), float(len(s)))
                for w, s in sorted(self._steps.items()) if s]

    def remaining_samples(self) -> float | None:
        last = self._last
        if last is None or not self._batches:
            return None
        try:
            left = int(last["total_steps"]) - int(last["step"])
        except (KeyError, TypeError, ValueError):
            return None
        return max(0, left) * statistics.median(self._batches)

    def profile(self) -> JobProfile | None:
        """The job's profile, or None before any world size has two consecutive steps."""
        points = self.points()
        if not points:
            return None
        key = tuple((p.world_size, p.samples_per_s, p.weight) for p in points)
        if self._model is None or self._model[0] != key:
            self._model = (key, fit_speedup(points, self.chunks))
        reform = statistics.median(self._costs) if self._costs else None
        return JobProfile(self._model[1], tuple(points), reform, self.remaining_samples())


def profile_from_rows(rows: Sequence[Mapping], events: Sequence[Mapping] = (),
                      chunks: int | None = None) -> JobProfile | None:
    """A profile from a finished or running job's rows and events (e.g. its run folder)."""
    tracker = SpeedupTracker(chunks=chunks, window=max(64, len(rows)))
    for row in rows:
        tracker.observe_step(row)
    for record in events:
        tracker.observe_change(record)
    return tracker.profile()
