"""The validation hook: run the user's evaluation every N steps or epochs, on the leader.

Every member holds the same model after a step, so only the leader (rank 0) evaluates; the others
wait for it at the next all-reduce. Evaluation must not change training: the model runs in eval
mode under ``torch.no_grad`` (BatchNorm statistics and dropout untouched) and the random
generators are restored afterwards, so a run with validation is bitwise the run without.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dyntrain.errors import ConfigError

Evaluate = Callable[[nn.Module], "dict[str, float] | float"]


@dataclass(frozen=True)
class Validation:
    """``evaluate(model)`` returns a number or a dict of numbers (e.g. ``{"accuracy": 0.93}``);
    it runs after every ``every_steps``-th step, at the end of every ``every_epochs``-th epoch
    and (``at_end``) after the last step. Results land in the leader's ``metrics.jsonl`` row of
    that step as ``val_<name>`` (and ``val_seconds``), and in ``ElasticTrainer.validations``.

    The leader runs it in eval mode under ``no_grad`` with the random generators saved and
    restored, so training is bitwise the same with or without validation.

    Args:
        evaluate: ``evaluate(model) -> float | dict[str, float]``; must not change the model's
            parameters or buffers.
        every_steps: Validate after every N-th applied step (None: not by steps).
        every_epochs: Validate at the end of every N-th epoch (None: not by epochs).
        at_end: Validate after the last step.

    Raises:
        ConfigError: ``every_steps`` or ``every_epochs`` is below 1.
    """

    evaluate: Evaluate
    every_steps: int | None = None
    every_epochs: int | None = None
    at_end: bool = True

    def __post_init__(self) -> None:
        for name in ("every_steps", "every_epochs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"validation {name} must be >= 1, got {value}")

    def due(self, step: int, steps_per_epoch: int, total_steps: int) -> bool:
        """Whether to validate after ``step`` optimizer steps have been applied.

        Args:
            step: Optimizer steps applied so far.
            steps_per_epoch: Steps in one epoch.
            total_steps: Steps of the whole run.
        """
        if self.at_end and step == total_steps:
            return True
        if self.every_steps and step % self.every_steps == 0:
            return True
        epochs, rest = divmod(step, steps_per_epoch)
        return bool(self.every_epochs and rest == 0 and epochs % self.every_epochs == 0)

    def run(self, model: nn.Module) -> dict[str, float | None]:
        """Evaluate without disturbing training; returns ``val_*`` fields.

        Args:
            model: The model to evaluate; its training mode and the random generators are
                restored afterwards.

        Returns:
            ``{"val_<name>": value, ..., "val_seconds": seconds}`` (a plain number is
            ``val_value``; a NaN or infinite value becomes None).
        """
        was_training = model.training
        py_state = random.getstate()
        start = time.perf_counter()
        try:
            with torch.random.fork_rng(devices=_devices(model)), torch.no_grad():
                model.eval()
                value = self.evaluate(model)
        finally:
            model.train(was_training)
            random.setstate(py_state)
        values = value if isinstance(value, dict) else {"value": value}
        fields = {f"val_{k}" if not k.startswith("val_") else k: _number(v)
                  for k, v in values.items()}
        fields["val_seconds"] = round(time.perf_counter() - start, 3)
        return fields


def _devices(model: nn.Module) -> list:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


def _number(value) -> float | None:
    value = float(value)
    return float(f"{value:.6g}") if math.isfinite(value) else None
