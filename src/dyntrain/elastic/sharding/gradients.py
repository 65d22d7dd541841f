"""ZeRO-2: the reduced gradient sharded too; a member keeps only the sums of the tensors it owns.

Per generation (``arrange``), each gradient bucket of the flat buffer is laid out by primary
owner: the tensors whose primary is rank 0 first, then rank 1's, ..., so that a bucket is one
contiguous segment per member. A step's gradient is then summed by the exact ring's
reduce-scatter phase alone (``ring.ring_reduce_scatter``) over these uneven segments: each
element's float64 sum of the same float32 terms as today's all-reduce, rounded once, lands at
its tensor's primary owner, and nothing is gathered. The primary forwards the rounded bits to the
tensor's other ``r - 1`` owners, point to point. Only owners step a tensor
(``zero.OptimizerShards``), and the new parameters travel from the primaries as at level 1.

A member that computes several chunks sums every chunk's gradient in its own round (``rounds``:
the most chunks any member computes, the others adding zeros), and the primaries add the rounds
in float64 over their own segments only (``8 / N`` bytes per parameter instead of the unsharded
run's whole float64 chunk sum), rounding once after the last: the float64 sum of the same terms.

What stays allocated: the flat float32 buffer backward writes every chunk's gradient into (the
parameters' ``.grad`` views, as at levels 0 and 1); the owned sums are written into it in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.reducer import Bucket
from dyntrain.elastic.collective.ring import Scratch, exchange, ring_reduce_scatter

#: ``Group.buffers`` key of the primaries' float64 sums of several rounds
SUMS = "zero2/sums"


class GradientShards:
    """A member's part of the level-2 gradient reduction: the layout and the rounds.

    Args:
        buckets: The stepper's gradient buckets (``reducer.plan_buckets``).
        numels: Elements of each trainable tensor, in the stepper's order.
    """

    def __init__(self, buckets: Sequence[Bucket], numels: Sequence[int]) -> None:
        self.buckets, self.numels = list(buckets), list(numels)
        self.offsets: list[int] = []
        self.rank, self.size = 0, 1
        self._bounds: list[list[int]] = []  # per bucket: the members' segments, from its start
        self._sends: dict[int, list[int]] = {}  # rank -> the tensors forwarded to it
        self._recvs: dict[int, list[int]] = {}  # rank -> the tensors received from it
        self._rounds = self._done = 0
        self._sums: torch.Tensor | None = None

    def arrange(self, owners: Sequence[Sequence[int]], rank: int, size: int) -> list[int]:
        """Lay each bucket out by primary owner and return where each tensor's gradient starts
        in the flat buffer. ``owners[t]``: the ranks owning tensor ``t``, its primary first."""
        self.rank, self.size = rank, size
        self.offsets, self._bounds = [0] * len(self.numels), []
        for bucket in self.buckets:
            offset = bucket.start
            for t in sorted(bucket.params, key=lambda t: owners[t][0]):  # stable
                self.offsets[t] = offset
                offset += self.numels[t]
            self._bounds.append([sum(self.numels[t] for t in bucket.params if owners[t][0] < m)
                                 for m in range(size + 1)])
        self._sends = {m: [t for t in range(len(owners)) if owners[t][0] == rank
                           and m in owners[t][1:]] for m in range(size)}
        self._recvs = {m: [t for t in range(len(owners)) if owners[t][0] == m
                           and rank in owners[t][1:]] for m in range(size)}
        return list(self.offsets)

    def owned_numel(self) -> int:
        """Elements of the gradient sums this member is primary for."""
        return sum(b[self.rank + 1] - b[self.rank] for b in self._bounds)

    def begin(self, group: Group, rounds: int) -> None:
        """A step of ``rounds`` rounds starts (one round per chunk of the busiest member)."""
        self._rounds, self._done, self._sums = rounds, 0, None
        if rounds > 1:
            sums = group.buffers.get(SUMS)
            if sums is None:  # the generation's own: a late write of another lands nowhere
                sums = group.buffers[SUMS] = torch.zeros(self.owned_numel(),
                                                         dtype=torch.float64,
                                                         device=group.device)
            self._sums = sums.zero_()

    def add_round(self, group: Group, grads: torch.Tensor,
                  should_abort: Callable[[], bool]) -> None:
        """Sum ``grads`` (this member's gradient of one chunk, or zeros) into the primaries;
        after the last round (one round: now) the primaries' segments of ``grads`` hold the
        rounded sums. Before the next round ``grads`` is zeroed."""
        works, pos = [], 0
        for bucket, bounds in zip(self.buckets, self._bounds, strict=True):
            lo, hi = bounds[self.rank], bounds[self.rank + 1]
            contrib = grads[bucket.start : bucket.stop]
            into = self._sums[pos : pos + hi - lo] if self._sums is not None else None
            pos += hi - lo
            works.append(group.ring_job_async(
                _summing(contrib, bounds, lo, hi, into, group.ring_scratch())))
        for work in works:
            group.wait(work, should_abort)
        self._done += 1
        if self._done < self._rounds:
            grads.zero_()

    def finish(self, group: Group, grads: torch.Tensor,
               should_abort: Callable[[], bool]) -> None:
        """Round the primaries' float64 sums of several rounds into ``grads`` and forward every
        owned tensor's rounded sum from its primary to its other owners, as bits."""
        if self._sums is not None:
            pos = 0
            for bucket, bounds in zip(self.buckets, self._bounds, strict=True):
                lo, hi = bounds[self.rank], bounds[self.rank + 1]
                grads[bucket.start + lo : bucket.start + hi].copy_(self._sums[pos : pos + hi - lo])
                pos += hi - lo
        sends = [(torch.cat([self._view(grads, t) for t in ts]), m)
                 for m, ts in self._sends.items() if ts]
        recvs = [(torch.empty(sum(self.numels[t] for t in ts), dtype=grads.dtype,
                              device=grads.device), m) for m, ts in self._recvs.items() if ts]
        if sends or recvs:
            group.wait(group.ring_job_async(
                lambda pg, rank, size, fenced: exchange(pg, sends, recvs, fenced)), should_abort)
        for flat, m in recvs:
            offset = 0
            for t in self._recvs[m]:
                self._view(grads, t).copy_(flat[offset : offset + self.numels[t]])
                offset += self.numels[t]

    def _view(self, grads: torch.Tensor, t: int) -> torch.Tensor:
        return grads[self.offsets[t] : self.offsets[t] + self.numels[t]]


def _summing(contrib: torch.Tensor, bounds: Sequence[int], lo: int, hi: int,
             into: torch.Tensor | None, scratch: Scratch):
    """The ring job that reduce-scatters one bucket: this rank's float64 sum is rounded into
    its segment of ``contrib`` (``into`` None) or added to ``into`` (a round of several)."""

    def job(pg, rank: int, size: int, fenced) -> None:
        total = ring_reduce_scatter(pg, rank, size, contrib, bounds, fenced, scratch)
        if into is None:
            contrib[lo:hi] = total  # the one rounding back to the parameters' dtype
        else:
            into.add_(total)

    return job
