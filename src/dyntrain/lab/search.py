"""Metaparameter search spaces and quasi-random (Sobol) trial points.

Each optimizer has its own space: plain SGD searches the learning rate; momentum and Nesterov
also search the momentum, on the scale of ``log(1 - momentum)`` (Shallue et al. 2018, Sec. 3.4).
Points come from a scrambled Sobol sequence: the first N points of the sequence cover the unit
cube far more evenly than N random draws, and the first N points of a longer sweep are the same
points, so adding trials to a sweep keeps the trials already run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dyntrain.lab.results import LabError

LOG = "log"
ONE_MINUS_LOG = "one_minus_log"  # uniform in log(1 - x): momentum-like parameters

OPTIMIZERS = ("sgd", "momentum", "nesterov")


@dataclass(frozen=True)
class Param:
    """One searched hyperparameter: ``low <= value <= high`` on ``scale``."""

    name: str
    low: float
    high: float
    scale: str = LOG

    def __post_init__(self) -> None:
        if self.scale not in (LOG, ONE_MINUS_LOG):
            raise LabError(f"{self.name}: unknown scale {self.scale!r}")
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise LabError(f"{self.name}: need low < high, got {self.low:g}:{self.high:g}")
        if self.scale == LOG and self.low <= 0:
            raise LabError(f"{self.name}: a log-scaled range must be positive, got "
                           f"{self.low:g}:{self.high:g}")
        if self.scale == ONE_MINUS_LOG and not (0 <= self.low and self.high < 1):
            raise LabError(f"{self.name}: a momentum range must lie in [0, 1), got "
                           f"{self.low:g}:{self.high:g}")

    def value(self, u: float) -> float:
        """Map ``u`` in [0, 1] onto the range (0 -> low, 1 -> high)."""
        if self.scale == LOG:
            return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        # uniform in log(1 - x): u = 0 gives low, u = 1 gives high
        a, b = math.log(1 - self.low), math.log(1 - self.high)
        return 1 - math.exp(a + u * (b - a))

    def to_json(self) -> dict[str, object]:
        return {"min": self.low, "max": self.high, "scale": self.scale}


def parse_range(text: str, what: str) -> tuple[float, float]:
    """``"LOW:HIGH"`` -> (low, high), with a one-line error for anything else."""
    parts = text.split(":")
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise LabError(f"{what} must be LOW:HIGH (e.g. 0.001:3), got {text!r}") from None
    return low, high


def search_space(optimizer: str, lr_range: tuple[float, float],
                 momentum_range: tuple[float, float]) -> tuple[Param, ...]:
    """The searched parameters of ``optimizer``."""
    if optimizer not in OPTIMIZERS:
        raise LabError(f"unknown optimizer {optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
    lr = Param("learning_rate", *lr_range, scale=LOG)
    if optimizer == "sgd":
        return (lr,)
    return (lr, Param("momentum", *momentum_range, scale=ONE_MINUS_LOG))


def sobol_points(n: int, dims: int, seed: int) -> list[list[float]]:
    """The first ``n`` points of a scrambled ``dims``-dimensional Sobol sequence in [0, 1)."""
    if n <= 0:
        raise LabError(f"need at least one trial per batch size, got {n}")
    import torch
    from torch.quasirandom import SobolEngine

    engine = SobolEngine(dims, scramble=True, seed=seed)
    return engine.draw(n, dtype=torch.float64).tolist()


def trial_points(space: tuple[Param, ...], n: int, seed: int) -> list[dict[str, float]]:
    """``n`` hyperparameter settings from ``space`` (the same for every batch size)."""
    return [{p.name: p.value(u) for p, u in zip(space, point, strict=True)}
            for point in sobol_points(n, len(space), seed)]
