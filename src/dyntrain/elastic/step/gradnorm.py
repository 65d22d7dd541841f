"""Clipping by the global norm, the same function at every sharding level.

The global norm of the reduced gradient is defined from per-tensor terms: for each trainable
tensor (in the stepper's order), its reduced gradient copied into a fresh contiguous float64
tensor and its sum of squares taken there (``tensor_squares``); the norm is the square root of
``math.fsum`` of these terms (``global_norm``: correctly rounded, so independent of their order).
A fresh allocation puts every tensor at the same alignment whatever the layout of the flat
buffer it comes from, so a vectorised kernel adds its elements the same way at every level and
every world size: a term depends only on the tensor's gradient bits.

At levels 0 and 1 every member holds the whole reduced gradient and takes every term itself. At
levels 2 and 3 no member holds it: each tensor's primary owner takes its term and puts it in the
tensor's slot of the step's tail (``TailLayout.squares``), the other members add zeros there, so
the tail's sum carries every term exactly to every member, which then clips the tensors it owns.
The clip coefficient is today's float32 ``min(1, max_norm / (norm + 1e-6))``, and each element is
multiplied by it in the gradient's dtype (a correctly rounded product: its bits depend only on
the element and the coefficient, not on where the element lies).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch


def sum_of_squares(grad: torch.Tensor) -> torch.Tensor:
    """The float64 sum of squares of ``grad``'s elements as a 0-d tensor, taken over a fresh
    contiguous float64 copy (so the result does not depend on where ``grad`` lies in memory)."""
    copy = grad.detach().to(torch.float64, memory_format=torch.contiguous_format, copy=True)
    return copy.reshape(-1).square_().sum()


def tensor_squares(grads: torch.Tensor, offsets: Sequence[int], numels: Sequence[int],
                   tensors: Iterable[int] | None = None) -> torch.Tensor:
    """Each tensor's term of the global norm, as a float64 vector (one slot per tensor).

    Args:
        grads: The flat gradient buffer.
        offsets: Where each tensor's gradient starts in ``grads``.
        numels: Elements of each tensor.
        tensors: The tensors whose terms to take (None: all); the other slots stay zero.
    """
    out = torch.zeros(len(numels), dtype=torch.float64, device=grads.device)
    for t in range(len(numels)) if tensors is None else tensors:
        out[t] = sum_of_squares(grads[offsets[t] : offsets[t] + numels[t]])
    return out


def global_norm(squares: torch.Tensor | Sequence[float]) -> float:
    """The global L2 norm from the per-tensor terms: the square root of their exact sum."""
    values = squares.tolist() if isinstance(squares, torch.Tensor) else list(squares)
    return math.sqrt(math.fsum(values))


def clip_to_norm_(grads: torch.Tensor, norm: float, max_norm: float) -> None:
    """Scale ``grads`` (the flat buffer, or one tensor's gradient) in place by the clip
    coefficient of a gradient whose global norm is ``norm``: ``min(1, max_norm / (norm +
    1e-6))`` in float32, applied in ``grads``' dtype."""
    norm32 = torch.tensor(norm, dtype=torch.float32, device=grads.device)
    grads.mul_(torch.clamp(max_norm / (norm32 + 1e-6), max=1.0).to(grads.dtype))


def clip_flat_(grads: torch.Tensor, max_norm: float) -> float:
    """Scale the flat reduced gradient in place so its global L2 norm is at most ``max_norm``,
    with ``grads`` taken as one tensor; returns the norm before clipping.

    Args:
        grads: A reduced gradient that every worker holds alike.
        max_norm: The largest global norm to leave unscaled.
    """
    norm = global_norm([float(sum_of_squares(grads))])
    clip_to_norm_(grads, norm, max_norm)
    return norm
