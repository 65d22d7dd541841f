"""The rows of a run's line files, as types: a ``MetricsRow`` per applied step
(``metrics.jsonl``), an ``EventRow`` per membership change (``events.jsonl``).

Each row is one JSON object; ``from_json`` checks the fields it knows (``RowError`` naming the
one that is wrong), keeps the others in ``extra``, and ``to_json`` writes them back.
:mod:`dyntrain.elastic.runs.log` reads and writes the files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class RowError(ValueError):
    """A JSON object that is not a valid row (the reader adds where it was)."""


class EventKind(StrEnum):
    """What changed the membership of a job."""

    START = "start"  # the first world of a fresh run
    RESUME = "resume"  # a world started from a checkpoint
    JOIN = "join"  # workers admitted into a running world
    LEAVE = "leave"  # workers that asked to leave (or were drained)
    CRASH = "crash"  # workers lost without asking (an exit, a hang, a failed collective)
    REATTACH = "reattach"  # a coordinator that restarted found its workers again
    REMOVED = "removed"  # a worker the coordinator removed (it cannot reach the others)
    UNSTARTED = "unstarted"  # workers of a join the launcher did not start: too little memory


@dataclass(frozen=True)
class NoiseScale:
    """The gradient noise scale fields of a metrics row (``TrainConfig.noise_scale``).

    Args:
        b_simple: the smoothed tr(Sigma)/|G|^2; None while the smoothed |G|^2 is not positive.
        b_simple_raw: this step's own (very noisy) ratio.
        g2: the smoothed |G|^2.
        trace_sigma: the smoothed tr(Sigma).
    """

    b_simple: float | None
    b_simple_raw: float | None = None
    g2: float | None = None
    trace_sigma: float | None = None


@dataclass(frozen=True)
class MetricsRow:
    """One applied optimizer step, as the leader reported it.

    Args:
        step: the step just applied, counted from 1.
        epoch: the epoch the step belongs to, counted from 0.
        world_size: how many workers computed it.
        loss: the mean training loss of its global batch.
        lr: the learning rate of the optimizer's first parameter group for this step.
        samples_per_s: the global batch over the step's wall time.
        time: the leader's unix time at the end of the step.
        total_steps: how many steps the run trains.
        generation: the generation (world) that computed it; None for a script run alone.
        chunks: how many chunks each member computed, in rank order.
        recomputed: the step had been applied before (by a world that then failed).
        state_sync_s: with a generation's first step: how long its state hand-over took.
        group_connect_s: with a generation's first step: how long the leader took to create
            the generation's process group (connecting to every member).
        grad_norm: the norm of the reduced gradient, when the trainer clips or reports it.
        noise: the gradient noise scale fields, when the trainer measures them.
        validation: the ``val_*`` fields of a validation run after this step.
        extra: fields this version does not know, kept as they were.
    """

    step: int
    epoch: int | None = None
    world_size: int | None = None
    loss: float | None = None
    lr: float | None = None
    samples_per_s: float | None = None
    time: float | None = None
    total_steps: int | None = None
    generation: int | None = None
    chunks: tuple[int, ...] | None = None
    recomputed: bool = False
    state_sync_s: float | None = None
    group_connect_s: float | None = None
    grad_norm: float | None = None
    noise: NoiseScale | None = None
    validation: Mapping[str, float | None] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricsRow:
        """The row a JSON object holds; ``RowError`` naming the field that is wrong."""
        f = _Fields(data, "a metrics row")
        noise = None
        if "b_simple" in data:
            noise = NoiseScale(f.number("b_simple"), f.number("b_simple_raw"), f.number("g2"),
                               f.number("trace_sigma"))
        return cls(step=f.integer("step", required=True), epoch=f.integer("epoch"),
                   world_size=f.integer("world_size"), loss=f.number("loss"), lr=f.number("lr"),
                   samples_per_s=f.number("samples_per_s"), time=f.number("time"),
                   total_steps=f.integer("total_steps"), generation=f.integer("gen"),
                   chunks=f.integers("chunks"), recomputed=f.flag("recomputed"),
                   state_sync_s=f.number("state_sync_s"),
                   group_connect_s=f.number("group_connect_s"), grad_norm=f.number("grad_norm"),
                   noise=noise,
                   validation={k: f.number(k) for k in list(f.rest) if k.startswith("val_")},
                   extra=f.rest)  # last: what the others did not take

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this row (fields that are None are left out)."""
        out = _present(step=self.step, epoch=self.epoch, world_size=self.world_size,
                       total_steps=self.total_steps, loss=self.loss, lr=self.lr,
                       samples_per_s=self.samples_per_s, time=self.time,
                       grad_norm=self.grad_norm)
        if self.noise is not None:
            out.update(b_simple=self.noise.b_simple, b_simple_raw=self.noise.b_simple_raw,
                       g2=self.noise.g2, trace_sigma=self.noise.trace_sigma)
        out.update(self.validation)
        out.update(_present(gen=self.generation,
                            chunks=None if self.chunks is None else list(self.chunks),
                            state_sync_s=self.state_sync_s,
                            group_connect_s=self.group_connect_s))
        out["recomputed"] = self.recomputed
        return {**out, **self.extra}


@dataclass(frozen=True)
class EventRow:
    """One membership change, from its request to the first step completed in the new world.

    Times are seconds after the coordinator started.

    Args:
        kind: what changed.
        workers: the workers that came or went.
        world_before: the world size before the change.
        world_after: the world size after it.
        generation: the generation formed by it.
        start_step: the step the new world started from.
        steps_redone: completed steps the new world computes again (a crash's lost work).
        origin: where the new world's state came from: ``members``, ``checkpoint``, ``fresh``.
        reason: why workers were lost (a crash), or removed.
        requested_at: when the change was asked for (a join request, a crash).
        detected_at: when the coordinator noticed it.
        reformed_at: when the new world was published.
        first_step_at: when the new world completed its first step.
        latency_s: from the request to that first step.
        state_sync_s: how long the new world's state hand-over took.
        group_connect_s: how long the new world's leader took to create its process group.
        extra: fields this version does not know, kept as they were.
    """

    kind: EventKind
    workers: tuple[str, ...] = ()
    world_before: int | None = None
    world_after: int | None = None
    generation: int | None = None
    start_step: int | None = None
    steps_redone: int = 0
    origin: str | None = None
    reason: str | None = None
    requested_at: float | None = None
    detected_at: float | None = None
    reformed_at: float | None = None
    first_step_at: float | None = None
    latency_s: float | None = None
    state_sync_s: float | None = None
    group_connect_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EventRow:
        """The row a JSON object holds; ``RowError`` naming the field that is wrong."""
        f = _Fields(data, "an event row")
        kind = f.text("event", required=True)
        try:
            kind = EventKind(kind)
        except ValueError:
            raise RowError(f"unknown event {kind!r} (known: "
                           f"{', '.join(k.value for k in EventKind)})") from None
        return cls(kind=kind, workers=f.texts("workers") or (),
                   world_before=f.integer("world_before"), world_after=f.integer("world_after"),
                   generation=f.integer("generation"), start_step=f.integer("start_step"),
                   steps_redone=f.integer("steps_redone") or 0, origin=f.text("origin"),
                   reason=f.text("reason"), requested_at=f.number("requested_at"),
                   detected_at=f.number("detected_at"), reformed_at=f.number("reformed_at"),
                   first_step_at=f.number("first_step_at"), latency_s=f.number("latency_s"),
                   state_sync_s=f.number("state_sync_s"),
                   group_connect_s=f.number("group_connect_s"),
                   extra=f.rest)  # last: what the others did not take

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this row (fields that are None are left out)."""
        out = {"event": self.kind.value, "workers": list(self.workers)}
        out.update(_present(
            world_before=self.world_before, requested_at=self.requested_at,
            detected_at=self.detected_at, generation=self.generation,
            world_after=self.world_after, start_step=self.start_step,
            steps_redone=self.steps_redone, origin=self.origin, reason=self.reason,
            state_sync_s=self.state_sync_s, group_connect_s=self.group_connect_s,
            reformed_at=self.reformed_at,
            first_step_at=self.first_step_at, latency_s=self.latency_s))
        return {**out, **self.extra}

    def text(self) -> str:
        """One line: ``join w2: world 1 -> 2 (generation 2, steps redone 0, ...)``."""
        who = ", ".join(self.workers) or "-"
        parts = [f"generation {self.generation}"] if self.generation is not None else []
        parts.append(f"steps redone {self.steps_redone}")
        if self.origin:
            parts.append(f"state from {self.origin}")
        if self.latency_s is not None:
            parts.append(f"latency {self.latency_s:.3f} s")
        if self.reason:
            parts.append(f"reason: {self.reason}")
        return (f"{self.kind.value} {who}: world {self.world_before} -> {self.world_after} "
                f"({', '.join(parts)})")


Row = MetricsRow | EventRow


def _present(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class _Fields:
    """Takes a JSON object's fields one by one, checking their types; ``rest`` is what is
    left."""

    def __init__(self, data: Mapping[str, Any], what: str) -> None:
        if not isinstance(data, Mapping):
            raise RowError(f"{what} must be a JSON object, got {type(data).__name__}")
        self.rest, self.what = dict(data), what

    def _take(self, key: str, required: bool, kind: str = "") -> Any:
        if required and self.rest.get(key) is None:
            raise RowError(f"{self.what} has no {kind}{key}")
        return self.rest.pop(key, None)

    def integer(self, key: str, required: bool = False) -> int | None:
        value = self._take(key, required, "integer ")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise RowError(f"{key} is not an integer: {value!r}")
        return value

    def number(self, key: str) -> float | None:
        value = self._take(key, False)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise RowError(f"{key} is not a number: {value!r}")
        return value

    def flag(self, key: str) -> bool:
        value = self._take(key, False)
        if value is not None and not isinstance(value, bool):
            raise RowError(f"{key} is not true or false: {value!r}")
        return bool(value)

    def text(self, key: str, required: bool = False) -> str | None:
        value = self._take(key, required)
        if value is not None and not isinstance(value, str):
            raise RowError(f"{key} is not a string: {value!r}")
        return value

    def integers(self, key: str) -> tuple[int, ...] | None:
        value = self._take(key, False)
        if value is not None and (not isinstance(value, list) or any(
                isinstance(v, bool) or not isinstance(v, int) for v in value)):
            raise RowError(f"{key} is not a list of integers: {value!r}")
        return None if value is None else tuple(value)

    def texts(self, key: str) -> tuple[str, ...] | None:
        value = self._take(key, False)
        if value is not None and (not isinstance(value, list)
                                  or any(not isinstance(v, str) for v in value)):
            raise RowError(f"{key} is not a list of strings: {value!r}")
        return None if value is None else tuple(value)


def as_row(row: Row | Mapping[str, Any], kind: type[Row]) -> Row:
    """``row`` as a ``kind`` (a JSON object is checked); ``RowError`` if it is not one."""
    if isinstance(row, kind):
        return row
    if isinstance(row, MetricsRow | EventRow):
        raise RowError(f"a {type(row).__name__} where a {kind.__name__} belongs")
    return kind.from_json(row)


def encode(row: Row) -> str:
    """The line (without its newline) that holds ``row``."""
    return json.dumps(row.to_json())
