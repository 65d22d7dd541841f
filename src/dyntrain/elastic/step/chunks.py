"""Pure: which worker computes which chunks of a global batch."""

from __future__ import annotations

from collections.abc import Sequence


def assign_chunks(num_chunks: int, world_size: int) -> list[range]:
    """Cut ``num_chunks`` chunks into ``world_size`` contiguous, near-equal blocks, one per rank.

    Uneven splits are fine (3 workers can share 8 chunks: 3, 3, 2). When there are more workers
    than chunks, the surplus ranks get an empty block and only take part in the all-reduce.
    """
    if num_chunks <= 0:
        raise ValueError(f"num_chunks must be positive, got {num_chunks}")
    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size}")
    base, extra = divmod(num_chunks, world_size)
    blocks, start = [], 0
    for rank in range(world_size):
        size = base + (1 if rank < extra else 0)
        blocks.append(range(start, start + size))
        start += size
    return blocks


def blocks(counts: Sequence[int]) -> list[range]:
    """Contiguous blocks of chunks, ``counts[r]`` of them for rank r, in rank order."""
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def balance_counts(num_chunks: int, seconds_per_chunk: Sequence[float]) -> list[int]:
    """How many chunks each rank computes so that the step's slowest rank finishes first.

    Minimises max_r counts[r] * seconds_per_chunk[r] with the counts summing to ``num_chunks``:
    each chunk in turn goes to the rank that would finish it earliest (ties: the lower rank),
    which is optimal for this objective. A rank with an unknown time (<= 0) is taken to be as
    fast as the average known one; with none known, the split is the even one.
    """
    known = [t for t in seconds_per_chunk if t > 0]
    if not known:
        return [len(b) for b in assign_chunks(num_chunks, len(seconds_per_chunk))]
    mean = sum(known) / len(known)
    times = [t if t > 0 else mean for t in seconds_per_chunk]
    counts = [0] * len(times)
    for _ in range(num_chunks):
        best = min(range(len(times)), key=lambda r: ((counts[r] + 1) * times[r], r))
        counts[best] += 1
    return counts


def step_seconds(counts: Sequence[int], seconds_per_chunk: Sequence[float]) -> float:
    """The predicted compute time of a step: its slowest rank's."""
    return max((n * t for n, t in zip(counts, seconds_per_chunk, strict=True)), default=0.0)
