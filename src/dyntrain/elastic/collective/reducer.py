"""Gradient buckets reduced while backward still runs, as DDP's bucketed hooks do.

The flat gradient buffer is laid out in reverse parameter order (backward produces the last
layers' gradients first) and cut into buckets of about ``TrainConfig.bucket_mb``. During the
backward of a worker's last chunk of a step, a bucket whose parameters all received their
gradient is final: its wire tensor (the float64 sum of the worker's chunks, exact) is handed to
an asynchronous all-reduce at once, while backward goes on with earlier layers. Buckets are
launched strictly in bucket order, so every member issues the same collectives in the same order
even when its graph differs (an unused parameter's bucket waits for the end of backward).

The math is the same element by element as one all-reduce of the whole buffer: bucketing only
changes when the sums are taken, never which numbers are added, so the result stays independent
of which worker computed which chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.tail import TailLayout


@dataclass(frozen=True)
class Bucket:
    """A contiguous slice of the flat gradient buffer and the parameters whose gradients fill it."""

    start: int
    stop: int
    params: tuple[int, ...]  # indices into the stepper's parameter list


def plan_buckets(numels: Sequence[int], cap: int) -> list[Bucket]:
    """Cut parameters, taken in reverse order, into buckets of at most ``cap`` elements.

    A parameter larger than ``cap`` gets a bucket of its own. The buffer offsets follow the
    same reverse order, so each bucket is one slice and the first bucket is the first final.
    """
    if cap <= 0:
        raise ValueError(f"bucket capacity must be positive, got {cap}")
    buckets: list[Bucket] = []
    start = offset = 0
    members: list[int] = []
    for index in reversed(range(len(numels))):
        n = numels[index]
        if members and offset + n - start > cap:
            buckets.append(Bucket(start, offset, tuple(members)))
            start, members = offset, []
        members.append(index)
        offset += n
    if members:
        buckets.append(Bucket(start, offset, tuple(members)))
    return buckets


class StepReduction:
    """One step's reduction: gradient buckets launched in order as they become final, then the
    small tail (``layout``: BatchNorm rows, noise-scale slots, the caller's slots, loss, flags)
    once the worker set its flags.

    ``wire(b)`` returns bucket ``b``'s pair (what this worker adds, where the rounded sum goes),
    called once, when the bucket is final. With ``ring`` the pair goes to the exact ring sum
    (``dyntrain.elastic.collective.ring``); otherwise the first is summed in place by an all-reduce
    and copied (rounded) into the second. Without a group (a world of one) nothing is sent.
    """

    def __init__(self, group: Group | None, buckets: Sequence[Bucket],
                 wire: Callable[[int], tuple[torch.Tensor, torch.Tensor]], overlap: bool,
                 ring: bool = False, layout: TailLayout | None = None) -> None:
        self.group, self.buckets, self._wire, self.overlap = group, buckets, wire, overlap
        self.ring, self.layout = ring, layout
        self.wires: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(buckets)
        self._missing = [len(b.params) for b in buckets]
        self._next = 0
        self._works: list = []
        self.meta: torch.Tensor | None = None  # the tail (``layout``), set once computed

    @property
    def sends(self) -> bool:
        return self.group is not None and self.group.size > 1

    def param_ready(self, bucket: int) -> None:
        """A parameter of ``bucket`` has its final gradient (a post-accumulate-grad hook)."""
        self._missing[bucket] -= 1
        if self.overlap:
            while self._next < len(self.buckets) and self._missing[self._next] <= 0:
                self._launch(self._next)

    def _launch(self, b: int) -> None:
        contrib, out = self.wires[b] = self._wire(b)
        if self.sends:
            self._works.append(self.group.exact_sum_async(contrib, out) if self.ring
                               else self.group.allreduce_async(contrib))
        self._next = b + 1

    def launch_all(self) -> None:
        """Backward is over: launch every bucket not launched yet, in order."""
        while self._next < len(self.buckets):
            self._launch(self._next)

    def finish(self, meta: torch.Tensor, should_abort: Callable[[], bool]) -> torch.Tensor:
        """Sum ``meta`` too, wait for every sum and put the rounded gradient sums in place;
        returns the summed ``meta``."""
        self.launch_all()
        self.meta = meta
        if self.sends:
            self._works.append(self.group.allreduce_async(meta))
            for work in self._works:
                self.group.wait(work, should_abort)
        if not (self.ring and self.sends):
            for contrib, out in self.wires:
                if contrib.data_ptr() != out.data_ptr():
                    out.copy_(contrib)  # the one rounding back to the parameters' dtype
        return meta
