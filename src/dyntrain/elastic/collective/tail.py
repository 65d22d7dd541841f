"""The tail of a step's reduced buffer: what the members add up besides the gradient.

A tail holds, in buffer order: ``bn``, the BatchNorm rows (``num_chunks`` rows of the model's
BatchNorm width: each chunk's statistics, zeros for chunks of other workers); ``norms``, with the
noise scale measured in this step, one number per chunk (the norm of what that chunk added to the
gradient); ``slots``, the caller's numbers (the balancer's chunk times, one per member);
``squares``, with clipping at sharding levels 2-3, one number per trainable tensor (its term of
the global norm, put there by its primary owner: ``dyntrain.elastic.step.gradnorm``); and four
scalars: the ``loss`` and three flags: ``reform`` and ``leave``, by which the members
agree, without a round trip to the coordinator, to re-form after this step, and
``checkpoint``, by which the leader's clock tells every member that a checkpoint by time is due
after it (at sharding levels 1-3 every member writes its part of one). Every member builds
the same layout, so after the sum every member reads the same numbers at the same offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: the scalars every tail ends with, in this order: the loss, the re-form, leave and checkpoint
#: flags
SCALARS = ("loss", "reform", "leave", "checkpoint")
_LOSS, _REFORM, _LEAVE, _CHECKPOINT = range(-len(SCALARS), 0)  # their offsets from the end


@dataclass(frozen=True)
class TailValues:
    """A summed tail's numbers after the BatchNorm rows."""

    norms: list[float]  # per chunk; empty when the step did not measure the noise scale
    slots: list[float]
    squares: list[float]  # per tensor; empty unless the step's owners sent their norm terms
    loss: float
    reform: bool  # some member asked to re-form after this step
    leavers: int  # how many members leave after this step
    checkpoint: bool = False  # the leader asked for a checkpoint (by time) after this step


@dataclass(frozen=True)
class TailLayout:
    """Where each part of a tail lies (offsets from the tail's start).

    Args:
        bn_numel: Numbers in the BatchNorm rows (``num_chunks`` x width).
        norms: Chunk-norm slots (``num_chunks`` when the step measures the noise scale, else 0).
        slots: The caller's slots.
        squares: Per-tensor terms of the global norm (the trainable tensors' count at levels
            2-3 with clipping, else 0).
    """

    bn_numel: int
    norms: int = 0
    slots: int = 0
    squares: int = 0

    @property
    def bn(self) -> slice:
        return slice(0, self.bn_numel)

    @property
    def norm_slots(self) -> slice:
        return slice(self.bn_numel, self.bn_numel + self.norms)

    @property
    def caller_slots(self) -> slice:
        start = self.bn_numel + self.norms
        return slice(start, start + self.slots)

    @property
    def square_slots(self) -> slice:
        start = self.bn_numel + self.norms + self.slots
        return slice(start, start + self.squares)

    @property
    def loss(self) -> int:
        return self.bn_numel + self.norms + self.slots + self.squares

    @property
    def reform(self) -> int:
        return self.loss + 1

    @property
    def leave(self) -> int:
        return self.loss + 2

    @property
    def checkpoint(self) -> int:
        return self.loss + 3

    @property
    def size(self) -> int:
        return self.loss + len(SCALARS)

    @classmethod
    def of_size(cls, size: int, bn_numel: int, num_chunks: int, slots: int = 0) -> TailLayout:
        """The layout of a tail of ``size`` numbers from a stepper that measures the noise
        scale on some steps: with the chunk norms when it has their room."""
        with_norms = cls(bn_numel, num_chunks, slots)
        return with_norms if size == with_norms.size else cls(bn_numel, 0, slots)

    def scalars(self, loss: torch.Tensor) -> torch.Tensor:
        """The tail's last numbers for this worker: its loss and both flags down."""
        out = torch.zeros(len(SCALARS), device=loss.device, dtype=loss.dtype)
        out[_LOSS] = loss
        return out

    def read(self, tail: torch.Tensor) -> TailValues:
        """The numbers of a summed ``tail`` after its BatchNorm rows (one transfer to Python)."""
        values = tail[self.bn_numel : self.size].tolist()
        start, squares = self.norms, self.norms + self.slots
        return TailValues(norms=values[:start], slots=values[start:squares],
                          squares=values[squares : squares + self.squares], loss=values[_LOSS],
                          reform=values[_REFORM] > 0, leavers=round(values[_LEAVE]),
                          checkpoint=values[_CHECKPOINT] > 0)


def set_flags(buffer: torch.Tensor, reform: bool, leave: bool, checkpoint: bool = False) -> None:
    """Set this worker's flags at the end of ``buffer`` (a tail, or the flat buffer it ends)."""
    buffer[_REFORM] = float(reform)
    buffer[_LEAVE] = float(leave)
    buffer[_CHECKPOINT] = float(checkpoint)
