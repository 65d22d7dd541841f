"""Mixed precision: bf16 autocast, fp16 with dynamic loss scaling, fp16 with a static scale.

Why the elastic invariant still holds: autocast changes how one chunk's forward and backward are
computed, not who computes it; a chunk's (scaled) gradient is the same on any worker, the
float64 reduction adds chunks exactly, and the scaler unscales the reduced gradient identically
everywhere. So runs stay bitwise equal across world sizes on a CPU (tested) and on GPUs with
deterministic kernels (``torch.use_deterministic_algorithms(True)``). Without deterministic
kernels a GPU's own run-to-run noise applies to both runs (atomics in some backward kernels):
then equality holds to the dtype's rounding per step (bf16 ~4e-3 relative, fp16 ~5e-4), which
training can amplify, so compare accuracies, not parameters.
"""

from __future__ import annotations

import torch

from dyntrain.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16", "fp16-static")


class StaticLossScaler(torch.amp.GradScaler):
    """A fixed loss scale (the article's TensorFlow run used x1024); a step whose gradient is
    not finite is skipped, the scale never changes.

    Args:
        device: ``cuda`` or ``cpu``.
        scale: The loss scale.
    """

    def __init__(self, device: str = "cuda", scale: float = 1024.0) -> None:
        super().__init__(device, init_scale=scale)
        self.static_scale = scale

    def update(self, new_scale=None) -> None:
        """Keep the static scale (``new_scale`` is ignored).

        Args:
            new_scale: Ignored: the scale never changes.
        """
        super().update(self.static_scale)


def make_scaler(precision: str, device_type: str, static_scale: float = 1024.0):
    """The loss scaler a precision needs (None for fp32 and bf16).

    Args:
        precision: ``fp32``, ``bf16``, ``fp16`` or ``fp16-static``.
        device_type: ``cuda`` or ``cpu``.
        static_scale: The scale of ``fp16-static``.

    Raises:
        ConfigError: An unknown precision.
    """
    check(precision)
    if precision == "fp16":
        return torch.amp.GradScaler(device_type, init_scale=2.0**16)
    if precision == "fp16-static":
        return StaticLossScaler(device_type, static_scale)
    return None


def autocast_dtype(precision: str) -> torch.dtype | None:
    check(precision)
    return {"bf16": torch.bfloat16, "fp16": torch.float16,
            "fp16-static": torch.float16}.get(precision)


def check(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
