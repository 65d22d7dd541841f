"""Train a Lightning ``LightningModule`` elastically and exactly: an ``ElasticTrainer`` built
from the module's own hooks, with every Lightning feature that would break exactness refused.

What is honoured, in this order: the datamodule's ``prepare_data()`` and ``setup("fit")``, the
module's ``prepare_data()``, ``setup("fit")`` and ``configure_model()``, the datamodule's (else
the module's) ``train_dataloader()`` (its map-style ``dataset`` only: the global batch, the
chunk size, the order and the epochs come from the ``TrainConfig``), the module's
``configure_optimizers()``; ``training_step(batch,
batch_idx)`` is the loss of each chunk (``batch`` holds ``chunk_size`` samples, ``batch_idx`` is
always 0). One optimizer, with at most one LR scheduler whose ``interval`` is ``"step"`` or
``"epoch"`` (an epoch is ``steps_per_epoch`` global batches; ``frequency`` counts them).

What is refused, with one line naming it (``LightningUnsupported``): manual optimization,
several optimizers, a scheduler that monitors a metric (``ReduceLROnPlateau``, ``monitor``),
an unknown ``interval``, ``accumulate_grad_batches`` other than 1 (the global batch is already
the samples per optimizer step), an iterable data set or a custom ``collate_fn``, a
``training_step`` that does not return the loss (``None`` skips a batch in Lightning), and a
module that overrides a hook that would change the step (``REFUSED_HOOKS``: custom backward,
optimizer steps, gradient clipping, batch transfer or skipping, per-batch or per-epoch
callbacks).

What is not called (a Lightning ``Trainer`` is not involved): validation, test and predict
steps, ``on_fit_*``/``on_train_start``/``on_train_end`` and checkpoint hooks (dyntrain keeps its
own checkpoints); ``self.log`` has no trainer to log to (Lightning warns and drops the value):
the run folder's ``metrics.jsonl`` and TensorBoard files hold the loss, learning rate and
world size.

Lightning is imported by the user's module, never by dyntrain's core; this module needs only
the module's methods, so it works with ``lightning.pytorch`` and ``pytorch_lightning`` alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.errors import ConfigError, install_excepthook

__all__ = ["REFUSED_HOOKS", "IntervalScheduler", "LightningUnsupported", "elastic_trainer"]

# hooks that change what a step computes or applies: a module that overrides one is refused
REFUSED_HOOKS = (
    "backward", "on_before_backward", "on_after_backward", "optimizer_step",
    "optimizer_zero_grad", "on_before_zero_grad", "on_before_optimizer_step",
    "configure_gradient_clipping", "lr_scheduler_step", "on_train_batch_start",
    "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
    "transfer_batch_to_device", "on_before_batch_transfer", "on_after_batch_transfer",
)


class LightningUnsupported(ConfigError):
    """A Lightning feature that cannot be trained exactly; the message names it and what to do."""


class IntervalScheduler:
    """Steps an LR scheduler once every ``every_steps`` optimizer steps (the trainer steps its
    scheduler once per step): Lightning's ``interval="epoch"``, or a ``frequency`` above 1.

    Args:
        scheduler: the module's scheduler.
        every_steps: optimizer steps per scheduler step (steps per epoch times ``frequency``).
    """

    def __init__(self, scheduler: Any, every_steps: int) -> None:
        self._inner, self.every_steps = scheduler, every_steps
        self.scheduler = type(scheduler).__name__  # what the run folder records
        self._steps = 0

    def step(self) -> None:
        """Count one optimizer step; step the scheduler at the end of its interval."""
        self._steps += 1
        if self._steps % self.every_steps == 0:
            self._inner.step()

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self._inner.state_dict(), "steps": self._steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._inner.load_state_dict(state["inner"])
        self._steps = state["steps"]


def elastic_trainer(module: torch.nn.Module, config: TrainConfig, *, datamodule: Any = None,
                    train_dataset: Dataset | None = None, accumulate_grad_batches: int = 1,
                    **trainer_options: Any) -> ElasticTrainer:
    """An ``ElasticTrainer`` that trains ``module`` as its hooks say (see the module docstring).

    Args:
        module: a ``LightningModule`` (seed before building it: every worker must start from
            the same weights).
        config: the global batch, chunk size, epochs, seed, checkpoints, ...
        datamodule: a ``LightningDataModule``; its training data set is used.
        train_dataset: the training data set, instead of a datamodule (or of the module's own
            ``train_dataloader``).
        accumulate_grad_batches: as Lightning's; only 1 (set ``config.global_batch`` instead).
        **trainer_options: passed on to ``ElasticTrainer`` (``out_dir``, ``validation``,
            ``device``, ...).

    Raises:
        LightningUnsupported: the module or its settings use a refused feature (in a script:
            one line, ``dyntrain: error: ...``, and exit status 2).
    """
    install_excepthook()
    if accumulate_grad_batches != 1:
        raise LightningUnsupported(
            f"accumulate_grad_batches={accumulate_grad_batches} is not supported: the global "
            "batch is already the samples per optimizer step; set TrainConfig(global_batch=...) "
            "to the batch size times the accumulation (chunk_size bounds the memory)")
    _refuse_hooks(module)
    if not getattr(module, "automatic_optimization", True):
        raise LightningUnsupported(
            "manual optimization (automatic_optimization = False) is not supported: dyntrain "
            "sums the chunks' gradients and steps the optimizer itself")
    if datamodule is not None:
        datamodule.prepare_data()
        datamodule.setup("fit")
    module.prepare_data()
    module.setup("fit")
    if hasattr(module, "configure_model"):
        module.configure_model()
    dataset = train_dataset if train_dataset is not None else _dataset(module, datamodule)
    optimizer, scheduler = _optimizer_and_scheduler(module.configure_optimizers(), config,
                                                    len(dataset))
    return ElasticTrainer(config, module, optimizer, dataset, _training_loss,
                          lr_scheduler=scheduler, **trainer_options)


def _training_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """One chunk's mean loss, from ``training_step``."""
    out = model.training_step(batch, 0)
    if isinstance(out, Mapping):
        out = out.get("loss")
    if not isinstance(out, torch.Tensor):
        raise LightningUnsupported(
            f"training_step returned {type(out).__name__}, not the loss: it must return the "
            "loss tensor (or a dict with 'loss'); skipping a batch (None) is not supported")
    return out


def _refuse_hooks(module: torch.nn.Module) -> None:
    base = next((c for c in type(module).__mro__ if c.__name__ == "LightningModule"), None)
    if base is None:
        raise LightningUnsupported(f"{type(module).__name__} is not a LightningModule")
    changed = [h for h in REFUSED_HOOKS
               if getattr(type(module), h, None) is not getattr(base, h, None)]
    if changed:
        raise LightningUnsupported(
            f"{type(module).__name__} overrides {', '.join(changed)}, which would change how a "
            "step is computed or applied: not supported (dyntrain runs the step itself)")


def _dataset(module: Any, datamodule: Any) -> Dataset:
    """The map-style training data set of the datamodule (else of the module)."""
    loader = (datamodule if datamodule is not None else module).train_dataloader()
    if not isinstance(loader, DataLoader):
        raise LightningUnsupported(
            f"train_dataloader() returned {type(loader).__name__}: one DataLoader is needed")
    if isinstance(loader.dataset, IterableDataset):
        raise LightningUnsupported(
            "an IterableDataset is not supported: the global batches are drawn by index from a "
            "map-style data set, the same on every worker")
    if loader.collate_fn is not default_collate:
        raise LightningUnsupported(
            "a custom collate_fn is not supported: chunks are collated with default_collate")
    return loader.dataset


def _optimizer_and_scheduler(found: Any, config: TrainConfig, dataset_size: int
                             ) -> tuple[torch.optim.Optimizer, Any]:
    """The one optimizer and (stepped once per optimizer step) scheduler of
    ``configure_optimizers``'s answer, in any of the shapes Lightning accepts."""
    schedulers: list[Any] = []
    if isinstance(found, Mapping):
        optimizers = [found.get("optimizer")]
        if found.get("lr_scheduler") is not None:
            schedulers = [found["lr_scheduler"]]
    elif (isinstance(found, Sequence) and len(found) == 2
          and all(isinstance(x, Sequence) for x in found)):
        optimizers, schedulers = list(found[0]), list(found[1])
    elif isinstance(found, Sequence):
        optimizers = list(found)
    else:
        optimizers = [found]
    if len(optimizers) == 1 and isinstance(optimizers[0], Mapping):  # [{"optimizer": ...}]
        return _optimizer_and_scheduler(optimizers[0], config, dataset_size)
    if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
        raise LightningUnsupported(
            f"configure_optimizers must give exactly one optimizer, got {len(optimizers)}: "
            "several optimizers (GANs) are not supported")
    if len(schedulers) > 1:
        raise LightningUnsupported(f"{len(schedulers)} LR schedulers: at most one is supported")
    scheduler = _scheduler(schedulers[0], config, dataset_size) if schedulers else None
    return optimizers[0], scheduler


def _scheduler(entry: Any, config: TrainConfig, dataset_size: int) -> Any:
    """The scheduler of one Lightning scheduler entry, stepped once per optimizer step."""
    settings = dict(entry) if isinstance(entry, Mapping) else {"scheduler": entry}
    scheduler = settings.get("scheduler")
    interval, frequency = settings.get("interval", "epoch"), settings.get("frequency", 1)
    name = type(scheduler).__name__
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) or settings.get(
            "monitor"):
        raise LightningUnsupported(
            f"the LR scheduler {name} follows a monitored metric: not supported (validation "
            "does not feed training back)")
    if not isinstance(frequency, int) or frequency < 1:
        raise LightningUnsupported(f"LR scheduler frequency must be a positive integer, got "
                                   f"{frequency!r}")
    if interval == "step":
        return scheduler if frequency == 1 else IntervalScheduler(scheduler, frequency)
    if interval == "epoch":
        return IntervalScheduler(scheduler, config.steps_per_epoch(dataset_size) * frequency)
    raise LightningUnsupported(
        f"LR scheduler interval {interval!r} is not supported: use 'step' or 'epoch'")
