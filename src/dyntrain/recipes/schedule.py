"""The article's learning-rate schedule: linear scaling, linear warmup, polynomial decay.

lr(step) rises linearly from ``warmup_start_lr`` to the peak ``base_lr * global_batch /
reference_batch`` over the warmup epochs, then decays as (1 - progress)^power to ``end_lr`` at
the last step. One value per optimizer step, a pure function of the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dyntrain.errors import ConfigError


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate as a pure function of the step (see the module's description).

    Args:
        base_lr: The learning rate per ``reference_batch`` samples.
        reference_batch: The batch ``base_lr`` is given for (linear scaling).
        warmup_epochs: Epochs of linear warmup (may be fractional; 0: none).
        warmup_start_lr: The learning rate at step 0.
        power: Exponent of the polynomial decay after the warmup.
        end_lr: The learning rate at the last step.

    Raises:
        ConfigError: A value out of range.
    """

    base_lr: float = 0.1
    reference_batch: int = 256
    warmup_epochs: float = 10.0
    warmup_start_lr: float = 0.001
    power: float = 2.0
    end_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.base_lr <= 0 or self.reference_batch <= 0:
            raise ConfigError("base_lr and reference_batch must be positive")
        if self.warmup_epochs < 0 or self.power <= 0 or self.warmup_start_lr < 0:
            raise ConfigError("warmup_epochs and warmup_start_lr must be >= 0, power > 0")

    def peak_lr(self, global_batch: int) -> float:
        """``base_lr * global_batch / reference_batch``.

        Args:
            global_batch: Samples per optimizer step.
        """
        return self.base_lr * global_batch / self.reference_batch

    def warmup_steps(self, steps_per_epoch: int, total_steps: int) -> int:
        """Steps of the warmup, at most the whole run.

        Args:
            steps_per_epoch: Optimizer steps per epoch.
            total_steps: Steps of the whole run.
        """
        return min(total_steps, round(self.warmup_epochs * steps_per_epoch))

    def lr_at(self, step: int, global_batch: int, steps_per_epoch: int, total_steps: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based).

        Args:
            step: Steps applied before this one.
            global_batch: Samples per optimizer step.
            steps_per_epoch: Optimizer steps per epoch.
            total_steps: Steps of the whole run.
        """
        peak = self.peak_lr(global_batch)
        warmup = self.warmup_steps(steps_per_epoch, total_steps)
        if step < warmup:
            return self.warmup_start_lr + (peak - self.warmup_start_lr) * step / warmup
        left = max(0.0, 1.0 - (step - warmup) / max(1, total_steps - warmup))
        return self.end_lr + (peak - self.end_lr) * left**self.power


class ScheduledLR(torch.optim.lr_scheduler.LRScheduler):
    """Sets every parameter group's LR to ``schedule.lr_at(step)`` (its state is plain numbers,
    so it travels in checkpoints and state transfers like any torch scheduler).

    Step it once per optimizer step (``ElasticTrainer`` does).

    Args:
        optimizer: The optimizer whose groups it sets.
        schedule: The schedule.
        global_batch: Samples per optimizer step.
        steps_per_epoch: Optimizer steps per epoch.
        total_steps: Steps of the whole run (the decay reaches ``end_lr`` there).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LRSchedule, global_batch: int,
                 steps_per_epoch: int, total_steps: int) -> None:
        self.base_lr, self.reference_batch = schedule.base_lr, schedule.reference_batch
        self.warmup_epochs, self.warmup_start_lr = schedule.warmup_epochs, schedule.warmup_start_lr
        self.power, self.end_lr = schedule.power, schedule.end_lr
        self.global_batch, self.steps_per_epoch = global_batch, steps_per_epoch
        self.total_steps = total_steps
        super().__init__(optimizer)

    def schedule(self) -> LRSchedule:
        """The schedule, rebuilt from this scheduler's (checkpointed) numbers."""
        return LRSchedule(self.base_lr, self.reference_batch, self.warmup_epochs,
                          self.warmup_start_lr, self.power, self.end_lr)

    def get_lr(self) -> list[float]:
        lr = self.schedule().lr_at(self.last_epoch, self.global_batch, self.steps_per_epoch,
                                   self.total_steps)
        return [lr for _ in self.optimizer.param_groups]
