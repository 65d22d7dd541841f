"""The simple gradient noise scale, B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, App. A.1).

G is the true (full-data) gradient and Sigma the per-example gradient covariance. A mean gradient
G_B over B examples drawn independently (with replacement) has

    E |G_B|^2 = |G|^2 + tr(Sigma) / B,

so squared norms measured at two batch sizes b_small < b_big give unbiased estimates of both terms
(see :func:`noise_estimates`). Each single-step estimate is very noisy and their ratio is biased,
so :class:`NoiseScaleTracker` smooths |G|^2 and tr(Sigma) separately with bias-corrected
exponential moving averages and only then divides.

Sampling without replacement. dyntrain draws every global batch from an epoch permutation, so
batches are samples *without* replacement from a finite data set of N examples. Then
E |G_B|^2 = |G|^2 + tr(Sigma) / B * (N - B) / (N - 1) with Sigma the population covariance
(denominator N), and the same estimators give

    E[trace_sigma] = tr(Sigma) * N / (N - 1)     (the sample covariance, denominator N - 1)
    E[g2]          = |G|^2 - tr(Sigma) / (N - 1)

exactly. Passing ``population=N`` adds the correction ``trace_sigma / N`` to ``g2`` so that it is
unbiased again; for N much larger than B_simple the difference is negligible.

In the elastic runtime (``dyntrain.elastic.step.stepper``) a step sums the gradients of fixed-size
chunks (``chunk_size`` samples) into one global-batch gradient (``global_batch`` samples), so
b_small = chunk_size and b_big = global_batch; see :func:`chunk_gradient_sq_norms`. The chunks of
one step partition the global batch and are therefore correlated with it, but the estimators are
linear in the expected squared norms, so they stay unbiased.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "NoiseScale",
    "NoiseScaleTracker",
    "chunk_gradient_sq_norms",
    "noise_estimates",
]


def _check_sizes(b_small: int, b_big: int) -> None:
    if b_small <= 0 or b_big <= 0:
        raise ValueError(f"batch sizes must be positive, got b_small={b_small}, b_big={b_big}")
    if b_small >= b_big:
        raise ValueError(f"need b_small < b_big, got b_small={b_small}, b_big={b_big}")


def noise_estimates(small_sq_norm: float, b_small: int, big_sq_norm: float, b_big: int,
                    *, population: int | None = None) -> tuple[float, float]:
    """Unbiased estimates ``(g2, trace_sigma)`` of |G|^2 and tr(Sigma).

    ``small_sq_norm`` is |G_small|^2 (or its mean over several small batches) for mean gradients
    over ``b_small`` examples, ``big_sq_norm`` is |G_big|^2 for a mean over ``b_big`` examples::

        g2          = (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
        trace_sigma = (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)

    Either estimate can be negative on a single step; that is what makes it unbiased.
    ``population``: the data-set size N when batches are drawn without replacement; adds the
    finite-population correction ``trace_sigma / N`` to ``g2`` (``trace_sigma`` then estimates
    the N - 1 sample covariance, see the module docstring).
    """
    _check_sizes(b_small, b_big)
    small, big = float(small_sq_norm), float(big_sq_norm)
    g2 = (b_big * big - b_small * small) / (b_big - b_small)
    trace_sigma = (small - big) / (1.0 / b_small - 1.0 / b_big)
    if population is not None:
        if population < b_big:
            raise ValueError(f"population {population} is smaller than b_big={b_big}")
        g2 += trace_sigma / population
    return g2, trace_sigma


@dataclass(frozen=True)
class NoiseScale:
    """One step's raw estimates and the smoothed ones after it."""

    g2: float  # raw |G|^2 estimate of this step
    trace_sigma: float  # raw tr(Sigma) estimate of this step
    b_simple: float | None  # trace_sigma / g2 of this step (None when g2 <= 0); very noisy
    g2_ema: float  # bias-corrected EMA of g2
    trace_ema: float  # bias-corrected EMA of trace_sigma
    b_simple_ema: float | None  # trace_ema / g2_ema; None while g2_ema <= 0


def _ratio(num: float, den: float) -> float | None:
    if not den > 0.0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


class NoiseScaleTracker:
    """Smooths |G|^2 and tr(Sigma) separately over steps and reports B_simple from the two EMAs.

    EMAs are bias-corrected as in Adam: after t updates the raw accumulator is divided by
    ``1 - ema**t``, so the first update reports exactly the first raw estimates.
    """

    def __init__(self, b_small: int, b_big: int, ema: float = 0.95,
                 population: int | None = None) -> None:
        _check_sizes(b_small, b_big)
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"ema must be in [0, 1), got {ema}")
        if population is not None and population < b_big:
            raise ValueError(f"population {population} is smaller than b_big={b_big}")
        self.b_small, self.b_big, self.ema, self.population = b_small, b_big, ema, population
        self._g2_acc = 0.0
        self._trace_acc = 0.0
        self.steps = 0

    def update(self, small_sq_norm_mean: float, big_sq_norm: float) -> NoiseScale:
        """Feed one step's mean |G_small|^2 over its chunks and its |G_big|^2."""
        g2, trace = noise_estimates(small_sq_norm_mean, self.b_small, big_sq_norm, self.b_big,
                                    population=self.population)
        if not (math.isfinite(g2) and math.isfinite(trace)):
            raise ValueError(f"non-finite squared norms: small={small_sq_norm_mean}, "
                             f"big={big_sq_norm}")
        beta = self.ema
        self._g2_acc = beta * self._g2_acc + (1.0 - beta) * g2
        self._trace_acc = beta * self._trace_acc + (1.0 - beta) * trace
        self.steps += 1
        g2_ema, trace_ema = self._corrected()
        return NoiseScale(g2=g2, trace_sigma=trace, b_simple=_ratio(trace, g2),
                          g2_ema=g2_ema, trace_ema=trace_ema,
                          b_simple_ema=_ratio(trace_ema, g2_ema))

    def _corrected(self) -> tuple[float, float]:
        if self.steps == 0:
            return 0.0, 0.0
        norm = 1.0 - self.ema ** self.steps
        return self._g2_acc / norm, self._trace_acc / norm

    @property
    def g2_ema(self) -> float | None:
        return self._corrected()[0] if self.steps else None

    @property
    def trace_ema(self) -> float | None:
        return self._corrected()[1] if self.steps else None

    @property
    def b_simple(self) -> float | None:
        """The current smoothed B_simple, or None before the first update / while g2_ema <= 0."""
        if not self.steps:
            return None
        g2_ema, trace_ema = self._corrected()
        return _ratio(trace_ema, g2_ema)

    def state_dict(self) -> dict[str, float | int | None]:
        return {"b_small": self.b_small, "b_big": self.b_big, "ema": self.ema,
                "population": self.population, "g2_acc": self._g2_acc,
                "trace_acc": self._trace_acc, "steps": self.steps}

    def load_state_dict(self, state: dict[str, float | int | None]) -> None:
        """Restore a :meth:`state_dict`; batch sizes and ``ema`` must match this tracker's."""
        for key in ("b_small", "b_big", "ema", "population"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"state has {key}={state[key]!r}, tracker has "
                                 f"{getattr(self, key)!r}")
        self._g2_acc = float(state["g2_acc"])
        self._trace_acc = float(state["trace_acc"])
        self.steps = int(state["steps"])


def chunk_gradient_sq_norms(grads_per_chunk: Sequence[torch.Tensor | Sequence[torch.Tensor]]
                            ) -> float:
    """Mean over chunks of |g_chunk|^2, each g_chunk a chunk's MEAN gradient (any shapes).

    An element may be one tensor or a sequence of per-parameter tensors. Sums in float64.
    The result is the ``small_sq_norm_mean`` that :meth:`NoiseScaleTracker.update` takes.

    The elastic runtime computes the same quantity online (``TrainConfig(noise_scale=True)``,
    wired into ``dyntrain.elastic.step.stepper.ChunkStepper``): each chunk's backward adds
    ``(chunk_size / global_batch) * g_chunk`` to the flat gradient buffer, and the worker takes
    the norm of that contribution right away (one reduction per chunk, before the all-reduce).
    The flat buffer carries one slot per chunk for these norms, zero for other workers' chunks,
    so the existing all-reduce gathers every chunk's norm in the same message; ``apply`` squares
    and averages them (scaled by ``(global_batch / chunk_size)^2`` and unscaled for AMP) into
    this mean, takes |G_big|^2 from the reduced (global mean) gradient and feeds both to a
    :class:`NoiseScaleTracker`. This function stays the offline reference for that number.
    """
    if len(grads_per_chunk) == 0:
        raise ValueError("need at least one chunk gradient")
    total = 0.0
    for grad in grads_per_chunk:
        parts = [grad] if isinstance(grad, torch.Tensor) else list(grad)
        total += sum(float(p.detach().double().pow(2).sum()) for p in parts)
    return total / len(grads_per_chunk)
