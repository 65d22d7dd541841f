"""Pure: which worker computes which chunks of a global batch."""

from __future__ import annotations


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
