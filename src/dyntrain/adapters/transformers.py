"""Train a Hugging Face ``transformers.Trainer`` elastically and exactly: an ``ElasticTrainer``
built from the pieces the ``Trainer`` builds, with every setting that would break exactness
refused.

What is taken from the ``Trainer``, as ``Trainer.train`` would take it: its model, its
``train_dataset`` (its columns the model's ``forward`` does not accept removed, as
``get_train_dataloader`` removes them: ``remove_unused_columns``) and its ``data_collator``;
the optimizer and the LR scheduler from ``create_optimizer_and_scheduler`` (so ``optimizers=``,
``optimizer_cls_and_kwargs=``, ``optim``, ``weight_decay``, ``lr_scheduler_type``, warm-up and
an overridden ``create_optimizer``/``create_scheduler`` are all honoured; the scheduler is
stepped once per optimizer step, as ``Trainer`` steps it); the loss from ``compute_loss``
(label smoothing, ``compute_loss_func`` and an overridden ``compute_loss`` included), within
``compute_loss_context_manager`` and, with ``bf16``, the autocast of the ``Trainer``'s
accelerator.

The batch: ``per_device_train_batch_size`` x ``world_size`` x ``gradient_accumulation_steps``
samples per optimizer step, whatever the world: ``world_size`` is the number of devices the
``TrainingArguments`` were written for (1 by default), and a chunk (the unit of work) is one
device's micro-batch, ``per_device_train_batch_size`` samples. The steps: ``max_steps`` when it
is positive, else ``num_train_epochs`` passes (a fraction of an epoch ends the run early, as in
``Trainer``), each of the data set's full global batches; ``max_grad_norm`` clips the reduced
gradient by its global norm; ``seed`` seeds the data order and each chunk's randomness (dropout,
and the collator's draws from torch, ``random`` and NumPy); ``save_strategy`` ``"steps"``
(``save_steps``) or ``"epoch"`` sets dyntrain's checkpoints and ``save_total_limit`` how many
are kept.

What differs from ``Trainer.train``: the data order is dyntrain's seeded shuffle (the same for
every world size, from ``seed``: ``data_seed`` is not used), not ``Trainer``'s sampler; the tail
of an epoch that does not fill a global batch is dropped; each chunk's loss is the model's mean
over the chunk (``compute_loss`` without ``num_items_in_batch``) and a step's loss the mean of
its chunks' losses, where ``Trainer`` weighs tokens over the whole accumulated batch (the same
when every sample has as many labelled tokens, as with fixed-length blocks without masking).
Callbacks, logging and ``Trainer``'s own checkpoints are not run: the run folder holds the
metrics, checkpoints and ``final.pt``; evaluation (``eval_strategy``) reports the eval data
set's loss only (``EvalLoss``), on the leader, without changing training.

What is refused, with one line naming it (``TrainerUnsupported``): an iterable data set (no
length, nothing to index), DeepSpeed, FSDP and a ``parallelism_config``, a sampling strategy
other than ``"random"`` (``group_by_length`` and ``batch_rebalance`` order batches by the world;
``sequential`` is not dyntrain's order), ``split_batches``, ``auto_find_batch_size`` (the batch
would follow the device's memory), ``fp16`` (its loss scaler), gradient checkpointing,
``torch_compile``, NEFTune, ``lr_scheduler_type="reduce_lr_on_plateau"``, saving or loading
the best model (they follow evaluation), callbacks of the user's (they would not be called),
and a ``Trainer`` subclass that overrides ``training_step``, ``get_train_dataloader`` or
``_get_train_sampler`` (``REFUSED_METHODS``).

transformers is imported here only: install it with ``pip install 'dyntrain[transformers]'``.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.protocol import ENV_COORDINATOR
from dyntrain.elastic.step.validation import Validation
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.errors import ConfigError, install_excepthook
from dyntrain.extras import needs_extra

with needs_extra("dyntrain.adapters.transformers"):
    import transformers
    from transformers.trainer_callback import EarlyStoppingCallback

__all__ = ["REFUSED_METHODS", "EvalLoss", "TrainerLoss", "TrainerUnsupported", "elastic_trainer",
           "train_config"]

# Trainer methods that decide what a step computes or in which order the data comes: a
# subclass that overrides one is refused (dyntrain runs the step and draws the batches)
REFUSED_METHODS = ("training_step", "get_train_dataloader", "_get_train_sampler")
_SEED_MODULUS = 2**32  # NumPy's global generator takes seeds below this


def _hide_local_rank() -> int | None:
    """A worker of a dyntrain job gets ``LOCAL_RANK`` (which GPU of its host it uses);
    accelerate takes it for a torchrun launch and would start ``torch.distributed`` as soon as
    ``TrainingArguments`` sets up its device. dyntrain forms its own groups: in a job (and no
    torchrun-style launch around it) the variable is taken out of the environment here, on
    import, and kept for the device. None: not set, or not in a dyntrain job."""
    if ENV_COORDINATOR not in os.environ or "MASTER_ADDR" in os.environ:
        return None
    local = os.environ.pop("LOCAL_RANK", None)
    return int(local) if local is not None and local.isdigit() else None


_LOCAL_RANK = _hide_local_rank()


class TrainerUnsupported(ConfigError):
    """A ``Trainer`` setting that cannot be trained exactly; the message names it."""


def elastic_trainer(trainer: Any, *, world_size: int = 1, config: TrainConfig | None = None,
                    **trainer_options: Any) -> ElasticTrainer:
    """An ``ElasticTrainer`` that trains as ``trainer.train()`` would (see the module
    docstring), with the fixed global batch its arguments give.

    Args:
        trainer: a ``transformers.Trainer`` with a ``train_dataset`` (seed before building the
            model, e.g. ``transformers.set_seed``: every worker must start from the same
            weights).
        world_size: the devices the ``TrainingArguments`` were written for: the global batch is
            ``per_device_train_batch_size`` x ``world_size`` x ``gradient_accumulation_steps``.
        config: the ``TrainConfig`` to use instead of ``train_config(trainer.args, ...)`` (to
            set more of its options: ``dataclasses.replace(train_config(...), ...)``).
        **trainer_options: passed on to ``ElasticTrainer`` (``out_dir``, ``validation``,
            ``device``, ...). The model trains where the ``Trainer`` placed it (the arguments'
            device) unless ``device`` says otherwise.

    Raises:
        TrainerUnsupported: a refused setting (in a script: one line, ``dyntrain: error:
            ...``, and exit status 2).
    """
    install_excepthook()
    if not isinstance(trainer, transformers.Trainer):
        raise TrainerUnsupported(f"{type(trainer).__name__} is not a transformers.Trainer")
    _refuse_arguments(trainer.args)
    _refuse_methods(trainer)
    _refuse_callbacks(trainer)
    dataset = _train_dataset(trainer)
    if config is None:
        config = train_config(trainer.args, len(dataset), world_size)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise TrainerUnsupported(
            "torch.distributed is already initialized (by TrainingArguments built before "
            "dyntrain.adapters.transformers was imported?): import the adapter first; "
            "dyntrain forms its own process groups")
    model = trainer.model
    device = torch.device(trainer_options.pop("device", None) or _device_of(model))
    model.to(device)
    trainer.create_optimizer_and_scheduler(num_training_steps=config.total_steps(len(dataset)))
    loss = TrainerLoss(trainer, dataset, _collator(trainer, dataset), device)
    if "validation" not in trainer_options:
        trainer_options["validation"] = _validation(trainer, config, len(dataset), device)
    return ElasticTrainer(config, model, trainer.optimizer, _Indices(len(dataset)), loss,
                          lr_scheduler=trainer.lr_scheduler, device=device, **trainer_options)


def train_config(args: Any, dataset_size: int, world_size: int = 1) -> TrainConfig:
    """The ``TrainConfig`` of ``TrainingArguments`` ``args`` for a data set of
    ``dataset_size`` samples, the arguments written for ``world_size`` devices.

    Raises:
        TrainerUnsupported: ``world_size`` is not a positive integer, or a save strategy that
            follows evaluation (``"best"``).
        ConfigError: the data set is smaller than one global batch.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise TrainerUnsupported(f"world_size must be a positive integer, got {world_size!r}")
    chunk = args.per_device_train_batch_size
    global_batch = chunk * world_size * args.gradient_accumulation_steps
    probe = TrainConfig(global_batch=global_batch, chunk_size=chunk)
    per_epoch = probe.steps_per_epoch(dataset_size)
    if args.max_steps > 0:
        epochs, max_steps = math.ceil(args.max_steps / per_epoch), args.max_steps
    else:
        epochs = max(1, math.ceil(args.num_train_epochs))
        steps = max(1, math.ceil(args.num_train_epochs * per_epoch))
        max_steps = steps if steps < epochs * per_epoch else None
    total = min(epochs * per_epoch, max_steps or epochs * per_epoch)
    return TrainConfig(
        global_batch=global_batch, chunk_size=chunk, epochs=epochs, max_steps=max_steps,
        seed=args.seed, checkpoint_every_steps=_checkpoint_steps(args, per_epoch, total),
        keep_checkpoints=args.save_total_limit or 3,
        grad_clip_norm=args.max_grad_norm or None)


@dataclass
class TrainerLoss:
    """``loss_fn`` of the ``ElasticTrainer``: collates a chunk's samples with the ``Trainer``'s
    collator and returns ``compute_loss``, under the ``Trainer``'s autocast (``bf16``). The
    chunk's seed (``torch.initial_seed()``, set by the trainer per step and chunk) also seeds
    ``random`` and NumPy's global generator, so a collator that draws from them (masking) draws
    the same on every worker."""

    trainer: Any
    dataset: Dataset
    collate: Callable[[list], Any]
    device: torch.device

    def __call__(self, model: torch.nn.Module, indices: torch.Tensor) -> torch.Tensor:
        seed = torch.initial_seed()
        random.seed(seed)
        np.random.seed(seed % _SEED_MODULUS)
        inputs = _on_device(self.collate([self.dataset[i] for i in indices.tolist()]),
                            self.device)
        # bf16: autocast as Trainer's accelerator wraps the forward (a no-op in float32)
        with self.trainer.accelerator.autocast(), self.trainer.compute_loss_context_manager():
            return self.trainer.compute_loss(model, inputs)


@dataclass
class EvalLoss:
    """The ``evaluate`` of the ``Validation`` that ``eval_strategy`` asks for: the mean of
    ``compute_loss`` over the ``Trainer``'s eval data set (``get_eval_dataloader``, its batches
    of ``per_device_eval_batch_size``, each normalised as ``Trainer.prediction_step`` does),
    weighted by batch size, as ``Trainer.evaluate`` gives ``eval_loss``: ``{"loss": ...}``,
    which the run folder's metrics hold as ``val_loss``. ``compute_metrics`` is not called."""

    trainer: Any
    device: torch.device

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        total, count = 0.0, 0
        for batch in self.trainer.get_eval_dataloader():
            inputs = _on_device(batch, self.device)
            # as Trainer.prediction_step: the batch's labelled tokens, where the model counts
            items = self.trainer._get_num_items_in_batch([inputs], self.device)
            with self.trainer.accelerator.autocast(), \
                    self.trainer.compute_loss_context_manager():
                loss = self.trainer.compute_loss(model, inputs, num_items_in_batch=items)
            size = len(next(iter(inputs.values())))
            total, count = total + float(loss) * size, count + size
        return {"loss": total / count}


def _validation(trainer: Any, config: TrainConfig, dataset_size: int,
                device: torch.device) -> Validation | None:
    """Evaluation as ``eval_strategy`` says (``"steps"``: every ``eval_steps``, else
    ``logging_steps``, a fraction of the run's steps below 1, and after the last step;
    ``"epoch"``: after every epoch), or None for ``"no"``."""
    args = trainer.args
    strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    if strategy == "no":
        return None
    evaluate = EvalLoss(trainer, device)
    if strategy == "epoch":
        return Validation(evaluate, every_epochs=1)
    every = args.eval_steps or args.logging_steps
    total = config.total_steps(dataset_size)
    return Validation(evaluate, every_steps=max(1, math.ceil(every * total) if every < 1
                                                else int(every)))


class _Indices(Dataset):
    """What the trainer draws chunks from: the sample indices, collated by ``TrainerLoss``."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


# (setting, is it refused?, why): the settings of TrainingArguments that cannot be exact
_REFUSED_ARGUMENTS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("deepspeed", bool, "DeepSpeed shards and steps the model itself"),
    ("fsdp", bool, "FSDP shards and steps the model itself (dyntrain's TrainConfig("
                   "shard_level=...) shards exactly)"),
    ("parallelism_config", lambda v: v is not None,
     "tensor, context and sequence parallelism split the model over a fixed world"),
    ("group_by_length", bool, "its batches are grouped by length in an order that depends "
                              "on the world"),
    ("auto_find_batch_size", bool, "the batch would follow the device's free memory"),
    ("fp16", bool, "float16 needs Trainer's loss scaler, which the adapter does not run: use "
                   "bf16"),
    ("activation_checkpointing", bool, "the adapter does not turn it on (Trainer.train "
                                       "would)"),
    ("gradient_checkpointing", bool, "the adapter does not turn it on (Trainer.train would)"),
    ("torch_compile", bool, "the adapter does not compile the model (Trainer.train would)"),
    ("neftune_noise_alpha", lambda v: v is not None,
     "the adapter does not add NEFTune's noise (Trainer.train would)"),
    ("load_best_model_at_end", bool, "the best model follows evaluation, which training "
                                     "does not run"),
    ("past_index", lambda v: v is not None and v >= 0,
     "memories carried from batch to batch depend on which worker computed the last one"),
)


def _refuse_arguments(args: Any) -> None:
    for name, refused, why in _REFUSED_ARGUMENTS:
        value = getattr(args, name, None)
        if refused(value):
            raise TrainerUnsupported(f"TrainingArguments({name}={value!r}) is not supported: "
                                     f"{why}")
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy != "random":
        why = ("the data order is dyntrain's seeded shuffle, the same for every world size"
               if strategy == "sequential" else
               "its batches are grouped in an order that depends on the world")
        raise TrainerUnsupported(f"TrainingArguments(train_sampling_strategy={strategy!r}) is "
                                 f"not supported: {why}; use 'random'")
    accelerator = getattr(args, "accelerator_config", None)
    if getattr(accelerator, "split_batches", False):
        raise TrainerUnsupported(
            "accelerator_config split_batches=True is not supported: the global batch is "
            "per_device_train_batch_size x world_size x gradient_accumulation_steps")
    if str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)) == \
            "reduce_lr_on_plateau":
        raise TrainerUnsupported(
            "lr_scheduler_type='reduce_lr_on_plateau' is not supported: it follows an "
            "evaluation metric, which training does not run")
    if str(getattr(args.save_strategy, "value", args.save_strategy)) == "best":
        raise TrainerUnsupported(
            "save_strategy='best' is not supported: the best model follows evaluation, which "
            "training does not run")


def _refuse_methods(trainer: Any) -> None:
    changed = [m for m in REFUSED_METHODS
               if getattr(type(trainer), m, None) is not getattr(transformers.Trainer, m, None)]
    if changed:
        raise TrainerUnsupported(
            f"{type(trainer).__name__} overrides {', '.join(changed)}, which would change how "
            "a step is computed or which samples it takes: not supported (dyntrain runs the "
            "step and draws the batches; override compute_loss instead)")


def _refuse_callbacks(trainer: Any) -> None:
    own = [type(c).__name__ for c in trainer.callback_handler.callbacks
           if isinstance(c, EarlyStoppingCallback)
           or not type(c).__module__.startswith("transformers.")]
    if own:
        raise TrainerUnsupported(
            f"callbacks {', '.join(own)} are not supported: the Trainer's loop, which calls "
            "them, does not run (dyntrain runs the steps)")


def _train_dataset(trainer: Any) -> Dataset:
    """The map-style training data set, its unused columns removed as ``Trainer`` does."""
    dataset = trainer.train_dataset
    if dataset is None:
        raise TrainerUnsupported("the Trainer has no train_dataset: training needs one")
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") \
            or not hasattr(dataset, "__getitem__"):
        raise TrainerUnsupported(
            f"an iterable data set ({type(dataset).__name__}) is not supported: the global "
            "batches are drawn by index from a map-style data set with a length, the same on "
            "every worker")
    if _is_datasets_dataset(dataset):
        dataset = trainer._remove_unused_columns(dataset, description="training")
    return dataset


def _collator(trainer: Any, dataset: Dataset) -> Callable[[list], Any]:
    """The ``Trainer``'s data collator, wrapped to drop unused columns as ``Trainer`` wraps it
    (a ``datasets.Dataset`` has had them removed already)."""
    if _is_datasets_dataset(dataset):
        return trainer.data_collator
    return trainer._get_collator_with_removed_columns(trainer.data_collator,
                                                      description="training")


def _is_datasets_dataset(dataset: Any) -> bool:
    return type(dataset).__module__.startswith("datasets.") and hasattr(dataset, "column_names")


def _checkpoint_steps(args: Any, per_epoch: int, total: int) -> int | None:
    strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
    if strategy == "steps":
        every = args.save_steps
        return max(1, math.ceil(every * total) if every < 1 else int(every))
    if strategy == "epoch":
        return per_epoch
    return None


def _device_of(model: torch.nn.Module) -> torch.device:
    """Where the ``Trainer`` placed the model; on a GPU, this worker's GPU of its host."""
    device = next(model.parameters()).device
    if device.type == "cuda" and _LOCAL_RANK is not None:
        return torch.device("cuda", _LOCAL_RANK % torch.cuda.device_count())
    return device


def _on_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: _on_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_on_device(b, device) for b in batch)
    return batch
