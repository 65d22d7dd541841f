"""Job traces for the simulator: what arrives when, how much work it is, and how it scales.

A job trace is a JSON file::

    {"queues": [{"name": "default", "priority": 1}],          (optional)
     "jobs": [
       {"id": "resnet", "arrival_s": 0, "samples": 115300000, "workers": "1:32",
        "curve": {"one_worker": 747, "efficiency": 0.92, "at": 64},
        "start_s": 60, "reform_s": 2, "queue": "default", "elastic": true},
       ...]}

A queue may carry ``"fairshare"``: an AWS Batch ``fairsharePolicy`` (``shareDecaySeconds``,
``computeReservation``, ``shareDistribution``); its jobs then each name a ``"share"`` (and
may set ``"scheduling_priority"``, 0-9999). ``workers`` is ``"MIN:MAX"`` (or one number);
``samples`` the work (samples to train); ``start_s`` the seconds from a worker's start until
it trains (for a new job: until its first step), ``reform_s`` the seconds of training one
membership change costs. ``curve`` is one of:

* ``{"serial": S, "parallel": P, "comm": C, "chunks": K}``: a speed-up model's parts
  (``dyntrain.service.core.speedup``; seconds per sample);
* ``{"points": [[workers, samples_per_s], ...], "chunks": K}``: measured throughputs, fitted;
* ``{"one_worker": T, "efficiency": E, "at": N}``: Amdahl's law through a published figure;
* ``{"lab": "throughput.json", "mode": "strong"}``: a ``dyntrain lab throughput`` result;
* ``{"run": "RUN_DIR"}``: fitted from a run folder's ``metrics.jsonl`` and ``events.jsonl``.

Paths are relative to the trace file. ``builtin_jobs()`` makes the built-in mixed trace.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dyntrain.service.core.fairshare import (
    FairsharePolicy,
    ShareAttributes,
    check_priority,
    check_share_identifier,
)
from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.speedup import (
    SpeedupModel,
    ThroughputPoint,
    fit_speedup,
    profile_from_rows,
)

JOB_FIELDS = {"id", "arrival_s", "samples", "workers", "curve", "start_s", "reform_s", "queue",
              "elastic", "share", "scheduling_priority"}


@dataclass(frozen=True)
class QueueSpec:
    """A queue of the simulated service (all of the simulation's environments, in order)."""

    name: str = "default"
    priority: int = 1
    fairshare: FairsharePolicy | None = None  # None: first in, first out


@dataclass(frozen=True)
class JobSpec:
    """One job of a trace (module doc); ``model`` is its true speed-up curve."""

    id: str
    arrival_s: float
    samples: float
    model: SpeedupModel
    min_workers: int = 1
    max_workers: int = 1
    start_s: float = 0.0
    reform_s: float = 0.0
    queue: str = "default"
    elastic: bool = True
    share: str | None = None  # its share identifier, in a fair-share queue
    scheduling_priority: int = 0

    def __post_init__(self) -> None:
        where = f"job {self.id}"
        for name in ("arrival_s", "start_s", "reform_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValidationError(f"{where}: {name} must be a finite number >= 0, "
                                      f"got {value!r}")
        if not (isinstance(self.samples, (int, float)) and math.isfinite(self.samples)
                and self.samples > 0):
            raise ValidationError(f"{where}: samples must be a finite number > 0, "
                                  f"got {self.samples!r}")
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValidationError(f"{where}: workers must satisfy 1 <= min <= max, got "
                                  f"{self.min_workers}:{self.max_workers}")

    def to_dict(self) -> dict:
        return {"id": self.id, "arrival_s": self.arrival_s, "samples": self.samples,
                "workers": f"{self.min_workers}:{self.max_workers}",
                "curve": self.model.to_dict(), "start_s": self.start_s,
                "reform_s": self.reform_s, "queue": self.queue, "elastic": self.elastic,
                **({"share": self.share, "scheduling_priority": self.scheduling_priority}
                   if self.share is not None else {})}


@dataclass(frozen=True)
class JobTrace:
    jobs: tuple[JobSpec, ...]
    queues: tuple[QueueSpec, ...] = field(default=(QueueSpec(),))
    source: str = "<jobs>"

    def to_dict(self) -> dict:
        return {"queues": [{"name": q.name, "priority": q.priority,
                            **({} if q.fairshare is None else
                               {"fairshare": fairshare_dict(q.fairshare)})}
                           for q in self.queues],
                "jobs": [j.to_dict() for j in self.jobs]}


def fairshare_dict(policy: FairsharePolicy) -> dict:
    """A policy in AWS's ``fairsharePolicy`` shape."""
    return {"shareDecaySeconds": policy.share_decay_seconds,
            "computeReservation": policy.compute_reservation,
            "shareDistribution": [{"shareIdentifier": a.identifier,
                                   "weightFactor": a.weight_factor} for a in policy.shares]}


def _fairshare(raw, where: str) -> FairsharePolicy | None:
    """A queue's ``fairshare`` (AWS's ``fairsharePolicy`` shape), or None."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError(f"{where}: fairshare must be an object (AWS's fairsharePolicy)")
    try:
        return FairsharePolicy(
            int(raw.get("shareDecaySeconds", 0)), int(raw.get("computeReservation", 0)),
            tuple(ShareAttributes(str(a["shareIdentifier"]), float(a.get("weightFactor", 1.0)))
                  for a in raw.get("shareDistribution") or ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValidationError(f"{where}: fairshare: {exc}") from None
    except ValidationError as exc:
        raise ValidationError(f"{where}: {exc}") from None


def _queues(raw, source: str) -> tuple[QueueSpec, ...]:
    """The trace's queues: a list of ``{"name": ..., "priority": N}``."""
    if not isinstance(raw, list):
        raise ValidationError(f"{source}: \"queues\" must be a list of objects with a name")
    queues = []
    for i, q in enumerate(raw):
        if not isinstance(q, dict) or not q.get("name"):
            raise ValidationError(f"{source}: queue {i + 1} must be an object with a name")
        try:
            queues.append(QueueSpec(str(q["name"]), int(q.get("priority", 1)),
                                    _fairshare(q.get("fairshare"), f"{source}: queue {q['name']}")))
        except (TypeError, ValueError):
            raise ValidationError(f"{source}: queue {q['name']}: priority must be an integer, "
                                  f"got {q.get('priority')!r}") from None
    return tuple(queues)


def _workers(value, where: str) -> tuple[int, int]:
    text = str(value)
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise ValidationError(f"{where}: workers must be MIN:MAX or a number, "
                              f"got {value!r}") from None
    if len(numbers) == 1:
        return numbers[0], numbers[0]
    if len(numbers) != 2:
        raise ValidationError(f"{where}: workers must be MIN:MAX or a number, got {value!r}")
    return numbers[0], numbers[1]


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise ValidationError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{path}: not valid JSON: {exc}") from None


def _lab_curve(path: Path, mode: str, where: str) -> SpeedupModel:
    doc = _read_json(path, "lab throughput result")
    rows = [r for r in (doc.get("rows") or []) if isinstance(r, dict) and r.get("mode") == mode]
    if not rows:
        raise ValidationError(f"{where}: {path} has no {mode}-scaling rows")
    batch = {r.get("global_batch") for r in rows}
    chunk = (doc.get("config") or {}).get("chunk_size")
    chunks = (batch.pop() // chunk) if len(batch) == 1 and chunk else None
    return fit_speedup([ThroughputPoint(int(r["workers"]), float(r["samples_per_s"]))
                        for r in rows], chunks if mode == "strong" else None)


def _run_curve(path: Path, where: str) -> SpeedupModel:
    rows, events = [], []
    for name, out in (("metrics.jsonl", rows), ("events.jsonl", events)):
        try:
            text = (path / name).read_text()
        except OSError as e:
            if name == "events.jsonl":
                continue
            raise ValidationError(f"{where}: cannot read {path / name}: "
                                  f"{e.strerror or e}") from None
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a torn last line
    profile = profile_from_rows(rows, events)
    if profile is None:
        raise ValidationError(f"{where}: {path} has no two consecutive steps to measure")
    return profile.model


def parse_curve(curve, where: str, base: Path = Path(".")) -> SpeedupModel:
    """A job's ``curve`` (module doc) as a speed-up model."""
    if not isinstance(curve, Mapping):
        raise ValidationError(f"{where}: curve must be an object (see `dyntrain sim --help`)")
    chunks = curve.get("chunks")
    if "points" in curve:
        try:
            points = [ThroughputPoint(int(w), float(t)) for w, t in curve["points"]]
        except ValidationError as exc:
            raise ValidationError(f"{where}: curve.points: {exc}") from None
        except (TypeError, ValueError):
            raise ValidationError(f"{where}: curve.points must be [[workers, samples_per_s], "
                                  "...]") from None
        return fit_speedup(points, chunks)
    if "one_worker" in curve:
        try:
            return SpeedupModel.from_efficiency(float(curve["one_worker"]), int(curve["at"]),
                                                float(curve["efficiency"]), chunks)
        except ValidationError as exc:
            raise ValidationError(f"{where}: curve: {exc}") from None
        except (KeyError, TypeError, ValueError):
            raise ValidationError(f"{where}: curve needs one_worker, efficiency and at") from None
    if "lab" in curve:
        return _lab_curve(base / str(curve["lab"]), str(curve.get("mode", "strong")), where)
    if "run" in curve:
        return _run_curve(base / str(curve["run"]), where)
    return SpeedupModel.from_dict(curve, f"{where}: curve")


def parse_jobs(doc, source: str = "<jobs>", base: Path = Path(".")) -> JobTrace:
    """A job trace from its parsed JSON (module doc); errors name ``source`` and the job."""
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise ValidationError(f"{source}: expected an object with a non-empty \"jobs\" list")
    queues = _queues(doc.get("queues") or [{"name": "default"}], source)
    names = {q.name for q in queues}
    jobs, seen = [], set()
    for i, raw in enumerate(doc["jobs"]):
        if not isinstance(raw, dict):
            raise ValidationError(f"{source}: job {i + 1} is not an object")
        jid = str(raw.get("id", f"job-{i + 1}"))
        where = f"{source}: job {jid}"
        unknown = set(raw) - JOB_FIELDS
        if unknown:
            raise ValidationError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        if jid in seen:
            raise ValidationError(f"{where}: the id appears twice")
        seen.add(jid)
        for name in ("samples", "curve"):
            if name not in raw:
                raise ValidationError(f"{where}: missing {name}")
        lo, hi = _workers(raw.get("workers", 1), where)
        queue = str(raw.get("queue", queues[0].name))
        if queue not in names:
            raise ValidationError(f"{where}: unknown queue {queue!r}")
        share = raw.get("share")
        fair = next(q.fairshare for q in queues if q.name == queue) is not None
        if fair and share is None:
            raise ValidationError(f"{where}: queue {queue} has a fair-share policy: the job "
                                  "needs a share")
        if share is not None and not fair:
            raise ValidationError(f"{where}: queue {queue} has no fair-share policy: a job "
                                  "of it has no share")
        try:
            jobs.append(JobSpec(jid, float(raw.get("arrival_s", 0.0)), float(raw["samples"]),
                                parse_curve(raw["curve"], where, base), lo, hi,
                                float(raw.get("start_s", 0.0)), float(raw.get("reform_s", 0.0)),
                                queue, bool(raw.get("elastic", True)),
                                None if share is None else check_share_identifier(str(share)),
                                check_priority(raw.get("scheduling_priority", 0))))
        except ValidationError as exc:
            text = str(exc)
            raise ValidationError(text if text.startswith(source) else f"{source}: {text}") \
                from None
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"{where}: {exc}") from None
    return JobTrace(tuple(jobs), queues, source)


def load_jobs(path: str | Path) -> JobTrace:
    """Read a job trace file (module doc)."""
    path = Path(path)
    return parse_jobs(_read_json(path, "job trace"), str(path), path.parent)


# ---- the built-in mixed trace ------------------------------------------------------------------

# (name, share of jobs, one worker's samples/s, efficiency at `at` workers, at, chunks, max)
# resnet50: the seed-4 figures (747 images/s per V100, 92 % at 64); the others are a
# transformer fine-tune, a CIFAR-sized CNN and a small model whose global batch is 4 chunks.
KINDS = (
    ("resnet50", 0.3, 747.0, 0.92, 64, None, 32),
    ("transformer", 0.3, 300.0, 0.80, 16, None, 16),
    ("cifar-cnn", 0.25, 2500.0, 0.50, 8, None, 16),
    ("small", 0.15, 4000.0, 1.0, 2, 4, 8),
)


def builtin_jobs(count: int = 50, span_s: float = 10 * 86400.0, seed: int = 0,
                 gpu_hours: tuple[float, float] = (4.0, 200.0)) -> JobTrace:
    """A mixed job trace: ``count`` jobs arriving at random over ``span_s`` (Poisson), each of
    one kind of ``KINDS``, with work worth ``gpu_hours`` (log-uniform) of one worker.

    Args:
        count: jobs.
        span_s: the arrivals' time span.
        seed: the random generator's seed: the same seed gives the same trace.
        gpu_hours: the range of each job's work, in hours of one worker.
    """
    rng = random.Random(seed)
    weights = [k[1] for k in KINDS]
    jobs, t = [], 0.0
    for i in range(count):
        name, _, one, eff, at, chunks, most = rng.choices(KINDS, weights)[0]
        hours = math.exp(rng.uniform(math.log(gpu_hours[0]), math.log(gpu_hours[1])))
        model = SpeedupModel.from_efficiency(one, at, eff, chunks) if eff < 1 else \
            SpeedupModel(parallel=1.0 / one, comm=0.02 / one, chunks=chunks)  # peaks at 4
        jobs.append(JobSpec(f"{name}-{i + 1:02d}", round(t, 1), round(hours * 3600 * one),
                            model, 1, most, start_s=60.0, reform_s=5.0))
        t += rng.expovariate(count / span_s)
    return JobTrace(tuple(jobs), (QueueSpec(),), f"built-in mixed trace (seed {seed})")
