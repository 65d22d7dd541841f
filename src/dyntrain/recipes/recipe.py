"""The large-batch ResNet recipe as one typed, validated config, and what it builds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn import functional as F

from dyntrain.data.images import ImageTransform
from dyntrain.elastic.config import TrainConfig
from dyntrain.errors import ConfigError
from dyntrain.recipes import precision as amp
from dyntrain.recipes.optim import LARS, param_groups
from dyntrain.recipes.resnet import MODELS
from dyntrain.recipes.schedule import LRSchedule, ScheduledLR


@dataclass(frozen=True)
class Recipe:
    """Everything the article fixes besides the data: model, batch, schedule, optimizer,
    precision, augmentation. ``derived()`` gives the numbers that follow from it.

    ``RECIPES`` holds the named ones (``resnet50-goyal``, ``digits-resnet``); ``build()`` returns
    what ``ElasticTrainer`` takes besides the model and the data.

    Args:
        name: The recipe's name, printed by ``describe()``.
        model: ``resnet50`` or ``small-resnet``.
        model_args: Extra keyword arguments of the model function, as (name, value) pairs.
        global_batch: Samples per optimizer step, whatever the world size.
        chunk_size: Samples per chunk; must divide ``global_batch``.
        epochs: Passes over the data; the LR schedule spans them.
        schedule: Linear scaling, warmup and polynomial decay of the learning rate.
        momentum: SGD (or LARS) momentum.
        nesterov: Nesterov momentum.
        weight_decay: L2 weight decay.
        decay_bn_and_bias: Also decay BatchNorm parameters and biases (and scale them by LARS).
        label_smoothing: Cross-entropy label smoothing, in [0, 1).
        lars: Use LARS (layer-wise trust ratio) instead of SGD.
        lars_eta: LARS's trust coefficient.
        precision: ``fp32``, ``bf16``, ``fp16`` (dynamic loss scale) or ``fp16-static``.
        static_loss_scale: The loss scale of ``fp16-static``.
        channels_last: Train in the channels-last memory format.
        compile: Wrap the model in ``torch.compile``.
        grad_clip_norm: Clip the reduced gradient to this global norm (None: no clipping).
        transform: The training images' augmentation.

    Raises:
        ConfigError: An unknown model or precision, or a value out of range.
    """

    name: str
    model: str = "resnet50"
    model_args: tuple[tuple[str, object], ...] = ()
    global_batch: int = 16384
    chunk_size: int = 128
    epochs: int = 90
    schedule: LRSchedule = field(default_factory=LRSchedule)
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 1e-4
    decay_bn_and_bias: bool = True
    label_smoothing: float = 0.0
    lars: bool = False
    lars_eta: float = 0.001
    precision: str = "fp16-static"
    static_loss_scale: float = 1024.0
    channels_last: bool = True
    compile: bool = False
    grad_clip_norm: float | None = None
    transform: ImageTransform = field(default_factory=ImageTransform)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"unknown model {self.model!r}; choose from {', '.join(MODELS)}")
        amp.check(self.precision)
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.epochs <= 0:
            raise ConfigError(f"epochs must be positive, got {self.epochs}")
        TrainConfig(global_batch=self.global_batch, chunk_size=self.chunk_size)  # validates

    def with_overrides(self, **changes) -> Recipe:
        """A copy with the non-None ``changes`` applied (``schedule_*`` keys go to the schedule).

        Args:
            **changes: Field values (``global_batch=4096``, ``schedule_base_lr=0.2``); None
                leaves a field as it is.
        """
        sched = {k[len("schedule_"):]: v for k, v in changes.items()
                 if k.startswith("schedule_") and v is not None}
        rest = {k: v for k, v in changes.items() if not k.startswith("schedule_") and v is not None}
        return replace(self, schedule=replace(self.schedule, **sched), **rest)

    def train_config(self, **kw) -> TrainConfig:
        """The ``TrainConfig`` of this recipe's batch, chunks, epochs and clipping.

        Args:
            **kw: Further ``TrainConfig`` fields (``seed``, ``checkpoint_every_steps``, ...).
        """
        return TrainConfig(global_batch=self.global_batch, chunk_size=self.chunk_size,
                           epochs=self.epochs, grad_clip_norm=self.grad_clip_norm, **kw)

    def build_model(self, num_classes: int) -> nn.Module:
        """The recipe's model, in its memory format, compiled if the recipe says so.

        Args:
            num_classes: Outputs of the last layer.
        """
        model = MODELS[self.model](num_classes=num_classes, **dict(self.model_args))
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return torch.compile(model) if self.compile else model

    def build_optimizer(self, model: nn.Module, peak_lr: float) -> torch.optim.Optimizer:
        """SGD (or LARS) over ``model``'s parameters, BatchNorm and biases in their own group.

        Args:
            model: The model to optimise.
            peak_lr: The initial learning rate (the scheduler sets it every step).
        """
        groups = param_groups(model, self.weight_decay, self.decay_bn_and_bias)
        if self.lars:
            return LARS(groups, lr=peak_lr, momentum=self.momentum,
                        weight_decay=self.weight_decay, eta=self.lars_eta,
                        nesterov=self.nesterov)
        for g in groups:
            g.pop("lars")
        return torch.optim.SGD(groups, lr=peak_lr, momentum=self.momentum,
                               nesterov=self.nesterov, weight_decay=self.weight_decay)

    def build(self, model: nn.Module, dataset_size: int, config: TrainConfig,
              device_type: str = "cpu"):
        """(optimizer, LR scheduler, loss scaler or None, loss function) for ``model``.

        Args:
            model: The model, built by ``build_model`` (and on its device).
            dataset_size: Samples in the training set (the schedule's length follows).
            config: The run's ``TrainConfig``; ``max_steps`` cuts a run short without
                squeezing the schedule.
            device_type: ``cpu`` or ``cuda``: where autocast and the loss scaler work.
        """
        steps_per_epoch = config.steps_per_epoch(dataset_size)
        opt = self.build_optimizer(model, self.schedule.peak_lr(self.global_batch))
        # the full recipe's length: max_steps cuts a run short, it does not squeeze the schedule
        sched = ScheduledLR(opt, self.schedule, self.global_batch, steps_per_epoch,
                            self.epochs * steps_per_epoch)
        return opt, sched, amp.make_scaler(self.precision, device_type,
                                           self.static_loss_scale), self.loss_fn(device_type)

    def forward_fn(self, device_type: str) -> Callable:
        """``forward(model, x) -> float32 logits`` under the recipe's precision and layout.

        Args:
            device_type: ``cpu`` or ``cuda``, for autocast.
        """
        dtype = amp.autocast_dtype(self.precision)
        channels_last = self.channels_last

        def forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device_type, dtype=dtype or torch.bfloat16,
                                enabled=dtype is not None):
                return model(x).float()

        return forward

    def loss_fn(self, device_type: str) -> Callable:
        """The chunk loss: cross-entropy (with the recipe's label smoothing) of ``forward``.

        Args:
            device_type: ``cpu`` or ``cuda``, for autocast.
        """
        forward, smoothing = self.forward_fn(device_type), self.label_smoothing

        def loss(model: nn.Module, batch) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(forward(model, x), y, label_smoothing=smoothing)

        return loss

    def derived(self, dataset_size: int, world_sizes: tuple[int, ...] = (8, 96)) -> dict:
        """The numbers that follow from the recipe and the data set size.

        Args:
            dataset_size: Samples in the training set.
            world_sizes: World sizes to give the chunks per worker of.

        Returns:
            ``peak_lr``, ``steps_per_epoch``, ``total_steps``, ``warmup_steps``, ``num_chunks``
            and ``chunks_per_worker`` ({world size: (most, fewest)}).
        """
        cfg = self.train_config()
        spe = cfg.steps_per_epoch(dataset_size)
        total = self.epochs * spe
        warm = self.schedule.warmup_steps(spe, total)
        per_worker = {w: (-(-cfg.num_chunks // w), cfg.num_chunks // w) for w in world_sizes}
        return {"peak_lr": self.schedule.peak_lr(self.global_batch), "steps_per_epoch": spe,
                "total_steps": total, "warmup_steps": warm, "num_chunks": cfg.num_chunks,
                "chunks_per_worker": per_worker}

    def describe(self, dataset_size: int, world_sizes: tuple[int, ...] = (8, 96)) -> str:
        """The recipe and its derived numbers as the lines each worker prints at start.

        Args:
            dataset_size: Samples in the training set.
            world_sizes: World sizes to give the chunks per worker of.
        """
        d = self.derived(dataset_size, world_sizes)
        s = self.schedule
        scale = (f" (loss scale {self.static_loss_scale:g})"
                 if self.precision == "fp16-static" else "")
        split = ", ".join(f"{w} workers: {hi if hi == lo else f'{lo}-{hi}'} chunks"
                          f" ({hi * self.chunk_size} samples max)"
                          for w, (hi, lo) in d["chunks_per_worker"].items())
        return "\n".join([
            f"recipe {self.name}: {self.model} {dict(self.model_args) or ''}".rstrip(),
            f"  global batch {self.global_batch} = {d['num_chunks']} chunks of "
            f"{self.chunk_size}; {split}",
            f"  {dataset_size} samples: {d['steps_per_epoch']} steps/epoch, {self.epochs} epochs"
            f" = {d['total_steps']} steps",
            f"  lr {s.base_lr} x {self.global_batch}/{s.reference_batch} = {d['peak_lr']:g} peak;"
            f" linear warmup from {s.warmup_start_lr:g} over {s.warmup_epochs:g} epochs "
            f"({d['warmup_steps']} steps), then polynomial decay power {s.power:g} to "
            f"{s.end_lr:g}",
            f"  {'LARS (eta ' + str(self.lars_eta) + ') ' if self.lars else ''}"
            f"{'Nesterov ' if self.nesterov else ''}momentum {self.momentum}, weight decay "
            f"{self.weight_decay}{'' if self.decay_bn_and_bias else ' (not on BatchNorm/bias)'}"
            f", label smoothing {self.label_smoothing}",
            f"  precision {self.precision}{scale}"
            f", channels_last {self.channels_last}, compile {self.compile}, grad clip "
            f"{self.grad_clip_norm}",
            f"  images {self.transform.size}px, crop scale {self.transform.scale}, flip "
            f"{self.transform.flip}, jitter b/s/h {self.transform.brightness}/"
            f"{self.transform.saturation}/{self.transform.hue}, PCA lighting "
            f"{self.transform.pca_noise}"])


RECIPES = {
    # The ResNet-50 article: 64 GPUs x 256 images, lr 0.1 per 256 (6.4 peak), warmup from 0.001
    # over 10 epochs, polynomial decay (power 2) over the last 80, Nesterov 0.9, wd 1e-4,
    # zero-initialised last BatchNorm gamma, fp16 with a static loss scale x1024.
    "resnet50-goyal": Recipe("resnet50-goyal"),
    # The same recipe scaled down to 16x16 digits on a CPU (see `make demo-images`).
    "digits-resnet": Recipe(
        "digits-resnet", model="small-resnet", model_args=(("width", 16),), global_batch=128,
        chunk_size=32, epochs=12, schedule=LRSchedule(base_lr=0.4, warmup_epochs=2),
        precision="fp32", channels_last=False,
        transform=ImageTransform(size=16, scale=(0.5, 1.0), flip=False, val_resize=16)),
}


def get_recipe(name: str) -> Recipe:
    """The named recipe of ``RECIPES``.

    Args:
        name: ``resnet50-goyal`` or ``digits-resnet``.

    Raises:
        ConfigError: An unknown name (the message lists the known ones).
    """
    try:
        return RECIPES[name]
    except KeyError:
        raise ConfigError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}") from None
