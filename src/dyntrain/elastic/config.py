"""Typed, validated configuration of an elastic training run."""

from __future__ import annotations

import difflib
import hashlib
import json
import numbers
from dataclasses import asdict, dataclass, fields

from dyntrain.errors import ConfigError


@dataclass(frozen=True)
class TrainConfig:
    """What every worker of a job must agree on; validated on construction.

    The global batch (samples per optimizer step) is fixed by the user and never derived from the
    world size. It is cut into ``global_batch // chunk_size`` chunks; a chunk is the unit of work
    that any worker computes the same way.

    ``exact_reduction`` sums chunk gradients (locally and in the all-reduce) in float64 and rounds
    once: the sum then no longer depends on which worker added which chunk, so runs are bitwise
    identical across world sizes in practice. Without it the all-reduce moves half the bytes, and
    runs agree only up to float32 summation order, which training can amplify over many steps.

    ``exact_ring`` (with ``exact_reduction``, on gloo) sums with a ring that adds in float64 but
    sends float32 where that loses nothing (``dyntrain.elastic.collective.ring``): DDP's bytes at
    two workers with one chunk each. Off, one float64 all-reduce per bucket (the earlier way, kept
    to compare). The sums are the same.

    ``balance`` gives faster members more chunks, from their measured chunk times
    (``dyntrain.elastic.step.balance``); off, every member gets an even share. Same result.

    ``overlap`` sums gradient buckets of about ``bucket_mb`` MiB while backward of a worker's
    last chunk still runs (``dyntrain.elastic.collective.reducer``); off, the same buckets are
    summed after backward. Either way the result is the same.

    ``noise_scale`` turns on the online gradient noise scale B_simple (McCandlish et al. 2018,
    App. A.1), estimated every ``noise_every`` steps from the chunk gradients (b_small =
    ``chunk_size``) and their global mean (b_big = ``global_batch``) and smoothed with
    exponential moving averages of factor ``noise_ema`` (per estimate); it needs at least two
    chunks per step. Measuring every 4th step (the default) keeps the cost under 1% of step
    time for the digits models (``bench/noise_overhead.py``). See
    ``dyntrain.elastic.step.stepper``.

    ``shard_level`` 1 shards the optimizer state by whole tensors (ZeRO-1,
    ``dyntrain.elastic.sharding.zero``): each tensor's state is held by ``shard_redundancy``
    members, who alone step it; the result is the same as with 0 (nothing sharded, the default).
    ``shard_level`` 2 shards the reduced gradients too (ZeRO-2,
    ``dyntrain.elastic.sharding.gradients``): each tensor's sum goes only to its owners. It needs
    the exact ring (``exact_reduction``, ``exact_ring``) and refuses ``noise_scale`` and a loss
    scaler, which read the whole reduced gradient that no member holds at level 2 (clipping by the
    global norm works at every level: ``dyntrain.elastic.step.gradnorm``).
    ``shard_level`` 3 shards the parameters too (ZeRO-3, ``dyntrain.elastic.sharding.parameters``):
    a member keeps only its owned tensors' parameters between uses and gathers each unit (the
    GPT: a transformer block) for its forward and its backward; what level 2 refuses it refuses.

    ``grad_clip_norm`` clips the gradient by its global L2 norm after the all-reduce, on the
    reduced (and, with a loss scaler, unscaled) gradient: the same on every worker, so clipping
    does not depend on the world size nor on the sharding level (the norm is taken from
    float64 per-tensor terms, ``dyntrain.elastic.step.gradnorm``).

    Args:
        global_batch: Samples per optimizer step, whatever the world size.
        chunk_size: Samples per chunk, the unit of work; must divide ``global_batch`` (a
            ``ConfigError`` suggests one that does).
        epochs: Passes over the data set (the tail that does not fill a global batch is
            dropped, a different tail each epoch).
        max_steps: Stop after this many optimizer steps, if fewer than ``epochs`` give.
        seed: Seeds the data order and each chunk's randomness (dropout, augmentation).
        checkpoint_every_steps: Checkpoint every N applied steps (None: not by steps).
        checkpoint_every_seconds: Checkpoint when this many seconds passed since the last one.
        keep_checkpoints: How many checkpoints to keep (at least 1).
        backend: ``auto`` (NCCL on CUDA, else gloo), ``gloo`` or ``nccl``.
        exact_reduction: Sum chunk gradients in float64 and round once (see above).
        noise_scale: Measure the gradient noise scale B_simple while training.
        noise_ema: Smoothing factor of the noise scale's moving averages, in [0, 1).
        noise_every: Measure the noise scale every N-th step.
        grad_clip_norm: Clip the reduced gradient to this global L2 norm (None: no clipping).
        overlap: Sum gradient buckets while backward still runs.
        exact_ring: With ``exact_reduction`` on gloo, sum with the exact ring.
        balance: Give faster members more chunks.
        bucket_mb: Size of a gradient bucket in MiB.
        shard_level: 0: every member holds everything; 1: the optimizer state is sharded
            (ZeRO-1); 2: the reduced gradients too (ZeRO-2); 3: the parameters too (ZeRO-3).
        shard_redundancy: Members that hold each tensor's optimizer state (at least 1): a crash
            of fewer than this many members loses none of it.

    Raises:
        ConfigError: An unknown option, a value of the wrong type or out of range, or
            ``chunk_size`` does not divide ``global_batch`` (one line, naming the value).
    """

    global_batch: int
    chunk_size: int
    epochs: int = 1
    max_steps: int | None = None
    seed: int = 0
    checkpoint_every_steps: int | None = None
    checkpoint_every_seconds: float | None = None
    keep_checkpoints: int = 3
    backend: str = "auto"
    exact_reduction: bool = True
    noise_scale: bool = False
    noise_ema: float = 0.95
    noise_every: int = 4
    grad_clip_norm: float | None = None
    overlap: bool = True
    exact_ring: bool = True
    balance: bool = True
    bucket_mb: float = 4.0
    shard_level: int = 0
    shard_redundancy: int = 2

    def __new__(cls, *args, **kwargs):
        # a misspelt option is a ConfigError naming it, not the generated __init__'s TypeError
        names = [f.name for f in fields(cls)]
        for name in kwargs:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                raise ConfigError(f"TrainConfig has no option {name!r}"
                                  + (f": did you mean {close[0]!r}?" if close else ""))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        self._check_types()
        if self.global_batch <= 0 or self.chunk_size <= 0:
            raise ConfigError(
                f"global_batch ({self.global_batch}) and chunk_size ({self.chunk_size}) "
                "must be positive"
            )
        if self.global_batch % self.chunk_size:
            raise ConfigError(
                f"global batch {self.global_batch} is not a multiple of chunk size "
                f"{self.chunk_size}: choose a chunk size that divides it "
                f"(e.g. {_largest_divisor_at_most(self.global_batch, self.chunk_size)})"
            )
        if self.epochs <= 0:
            raise ConfigError(f"epochs must be positive, got {self.epochs}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise ConfigError(f"max_steps must be positive, got {self.max_steps}")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_steps <= 0:
            raise ConfigError("checkpoint_every_steps must be positive")
        if self.checkpoint_every_seconds is not None and self.checkpoint_every_seconds <= 0:
            raise ConfigError("checkpoint_every_seconds must be positive")
        if self.keep_checkpoints < 1:
            raise ConfigError("keep_checkpoints must be at least 1")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"backend must be auto, gloo or nccl, got {self.backend!r}")
        if not 0.0 <= self.noise_ema < 1.0:
            raise ConfigError(f"noise_ema must be in [0, 1), got {self.noise_ema}")
        if self.noise_every < 1:
            raise ConfigError(f"noise_every must be at least 1, got {self.noise_every}")
        if self.grad_clip_norm is not None and not self.grad_clip_norm > 0:
            raise ConfigError(f"grad_clip_norm must be positive, got {self.grad_clip_norm}")
        if not self.bucket_mb > 0:
            raise ConfigError(f"bucket_mb must be positive, got {self.bucket_mb}")
        if self.shard_level not in (0, 1, 2, 3):
            raise ConfigError(f"shard_level must be 0, 1, 2 or 3, got {self.shard_level}")
        if self.shard_level >= 2:
            self._check_level_2()
        if self.shard_redundancy < 1:
            raise ConfigError(f"shard_redundancy must be at least 1, got "
                              f"{self.shard_redundancy}")
        if self.noise_scale and self.num_chunks < 2:
            raise ConfigError(
                f"noise_scale needs at least two chunks per step to compare batch sizes, but "
                f"chunk size {self.chunk_size} equals the global batch {self.global_batch}: "
                "choose a smaller chunk size"
            )

    @property
    def num_chunks(self) -> int:
        """Chunks per global batch: ``global_batch // chunk_size``."""
        return self.global_batch // self.chunk_size

    def steps_per_epoch(self, dataset_size: int) -> int:
        """Full global batches in one pass over the data; the remainder of a shuffle is dropped.

        Args:
            dataset_size: Samples in the training set.

        Raises:
            ConfigError: The data set holds fewer samples than one global batch.
        """
        steps = dataset_size // self.global_batch
        if steps == 0:
            raise ConfigError(
                f"the data set has {dataset_size} samples, fewer than one global batch "
                f"({self.global_batch})"
            )
        return steps

    def total_steps(self, dataset_size: int) -> int:
        """Optimizer steps of the whole run: ``epochs`` passes, capped at ``max_steps``.

        Args:
            dataset_size: Samples in the training set.
        """
        steps = self.epochs * self.steps_per_epoch(dataset_size)
        return min(steps, self.max_steps) if self.max_steps is not None else steps

    def _check_types(self) -> None:
        """A number where one is expected (one line naming the option): ``"32"`` would fail
        later with a TypeError, ``True`` would count as 1."""
        for f in fields(self):
            value, kind = getattr(self, f.name), f.type.removesuffix(" | None")
            if value is None and f.type.endswith("| None"):
                continue
            wanted = {"int": numbers.Integral, "float": numbers.Real}.get(kind)
            if wanted and (isinstance(value, bool) or not isinstance(value, wanted)):
                what = "an integer" if kind == "int" else "a number"
                raise ConfigError(f"{f.name} must be {what}, got {value!r}")

    def _check_level_2(self) -> None:
        """Refuse what level 2 cannot do exactly (one line each, naming the reason)."""
        if self.noise_scale:
            raise ConfigError(f"noise_scale is not supported with shard_level "
                              f"{self.shard_level}: its |G|^2 "
                              "needs the whole reduced gradient; use shard_level 1")
        if not (self.exact_reduction and self.exact_ring):
            raise ConfigError(f"shard_level {self.shard_level} needs exact_reduction and "
                              "exact_ring: its "
                              "gradient sums are the exact ring's reduce-scatter")

    def fingerprint(self) -> str:
        """A short hash that workers compare so that nobody joins a job with other settings.

        Fields added after the first release count only when they differ from their default, so
        a configuration that does not use them keeps the fingerprint it always had.
        """
        values = {k: float(v) if isinstance(v, (int, float)) and k.endswith(("seconds", "_mb"))
                  else v
                  for k, v in asdict(self).items()
                  if k not in _LATER_FIELDS or v != _LATER_FIELDS[k]}
        blob = json.dumps(values, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# Later additions and their defaults (see ``TrainConfig.fingerprint``).
_LATER_FIELDS = {"noise_scale": False, "noise_ema": 0.95, "noise_every": 4,
                 "grad_clip_norm": None, "overlap": True, "exact_ring": True, "balance": True,
                 "bucket_mb": 4.0, "shard_level": 0, "shard_redundancy": 2}


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)
