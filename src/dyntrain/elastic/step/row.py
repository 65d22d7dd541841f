"""The leader's ``metrics.jsonl`` row for each step it applied (and the validation due then),
built as the run files' :class:`~dyntrain.elastic.runs.rows.MetricsRow`."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict

from torch import nn

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.runs.rows import MetricsRow, NoiseScale
from dyntrain.elastic.step.noise import NoiseScaleTracker
from dyntrain.elastic.step.stepper import StepResult
from dyntrain.elastic.step.validation import Validation

log = logging.getLogger("dyntrain.trainer")


class StepRows:
    """Builds the metrics rows of one worker's applied steps, running validation when due.

    Args:
        config: The job's settings (the global batch gives the samples per second).
        model: What validation evaluates.
        total_steps: The run's length (validation is due at the end).
        steps_per_epoch: Steps in one epoch (validation may be due per epoch).
        noise: The stepper's noise-scale tracker, or None when it is off.
        validation: The validation hook, or None.
    """

    def __init__(self, config: TrainConfig, model: nn.Module, total_steps: int,
                 steps_per_epoch: int, noise: NoiseScaleTracker | None,
                 validation: Validation | None) -> None:
        self.config, self.model, self.noise, self.validation = config, model, noise, validation
        self.total_steps, self.steps_per_epoch = total_steps, steps_per_epoch
        self.validations: list[dict] = []  # this worker's validation results, with their step

    def row(self, step: int, result: StepResult, world_size: int, seconds: float) -> MetricsRow:
        """The row of ``step`` (just applied, in ``seconds``); runs validation when it is due."""
        return MetricsRow(step=step, epoch=(step - 1) // self.steps_per_epoch,
                          world_size=world_size, total_steps=self.total_steps,
                          loss=round(result.loss, 6),
                          samples_per_s=round(self.config.global_batch / seconds, 1),
                          time=time.time(), grad_norm=metric(result.grad_norm),
                          lr=metric(result.lr),
                          noise=noise_scale(self.noise, result),
                          validation=self._maybe_validate(step))

    def validation_due(self, step: int) -> bool:
        """Whether the validation hook runs after ``step`` (on the leader)."""
        v = self.validation
        return v is not None and v.due(step, self.steps_per_epoch, self.total_steps)

    def _maybe_validate(self, step: int) -> dict:
        """Run the validation hook if it is due after ``step``; its ``val_*`` fields."""
        if not self.validation_due(step):
            return {}
        fields = self.validation.run(self.model)
        self.validations.append({"step": step, **fields})
        log.info("validation after step %d: %s", step, fields)
        return fields


def noise_scale(tracker: NoiseScaleTracker | None, result: StepResult) -> NoiseScale | None:
    """The gradient noise scale of a metrics row (None when it is off)."""
    if tracker is None:
        return None
    raw = result.noise.b_simple if result.noise is not None else None
    return NoiseScale(b_simple=metric(tracker.b_simple), b_simple_raw=metric(raw),
                      g2=metric(tracker.g2_ema), trace_sigma=metric(tracker.trace_ema))


def noise_fields(tracker: NoiseScaleTracker | None, result: StepResult) -> dict:
    """``noise_scale``'s fields as a metrics row's JSON holds them (none when it is off)."""
    noise = noise_scale(tracker, result)
    return {} if noise is None else asdict(noise)


def metric(value: float | None) -> float | None:
    """Six significant digits, or None (JSON null) for a missing or non-finite value."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")
