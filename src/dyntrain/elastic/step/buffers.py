"""BatchNorm running statistics updated from all chunks, in global chunk order, on every worker.

Left alone, a BatchNorm layer updates its running mean and variance from whichever chunks the
local worker ran, so buffers would depend on the world size. Instead each worker records, per
chunk it computes, the buffer values that one forward produced from the step's starting values;
the rows of all chunks are summed across workers (a chunk is computed by exactly one worker, the
others contribute zeros, so the sum is exact), and every worker replays the updates in chunk order.
The result is bitwise the same for any world size.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class BatchNormChunkStats:
    """Records per-chunk BatchNorm updates and replays them in global chunk order."""

    def __init__(self, model: nn.Module) -> None:
        self.modules = [
            m for m in model.modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None
        ]
        self.width = sum(2 * m.num_features for m in self.modules)
        self._snapshot: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def begin_step(self) -> None:
        """Remember the buffers as they were before this step's first forward."""
        self._snapshot = [
            (m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
            for m in self.modules
        ]

    def before_chunk(self) -> None:
        """Reset the buffers so that the chunk's forward updates them from the step's start."""
        for m, (mean, var, count) in zip(self.modules, self._snapshot, strict=True):
            m.running_mean.copy_(mean)
            m.running_var.copy_(var)
            m.num_batches_tracked.copy_(count)

    def record_chunk(self, row: torch.Tensor) -> None:
        """Write the buffers one chunk's forward produced into that chunk's row of the table."""
        offset = 0
        for m in self.modules:
            n = m.num_features
            row[offset : offset + n] = m.running_mean.detach().to(row.dtype)
            row[offset + n : offset + 2 * n] = m.running_var.detach().to(row.dtype)
            offset += 2 * n

    def finish_step(self, table: torch.Tensor) -> None:
        """Replay every chunk's update in chunk order, starting from the step's snapshot.

        ``table`` has one row per chunk of the global batch, summed over all workers.
        """
        num_chunks = table.shape[0]
        offset = 0
        for m, (mean0, var0, count0) in zip(self.modules, self._snapshot, strict=True):
            n = m.num_features
            rows_mean = table[:, offset : offset + n].to(mean0.dtype)
            rows_var = table[:, offset + n : offset + 2 * n].to(var0.dtype)
            m.running_mean.copy_(_replay(rows_mean, mean0, m.momentum, int(count0)))
            m.running_var.copy_(_replay(rows_var, var0, m.momentum, int(count0)))
            m.num_batches_tracked.copy_(count0 + num_chunks)
            offset += 2 * n


def _replay(
    rows: torch.Tensor, start: torch.Tensor, momentum: float | None, count: int
) -> torch.Tensor:
    """Apply the per-chunk updates ``rows`` (each made from ``start``) one after another."""
    value = start.clone()
    if momentum is not None:
        # row = (1 - m) * start + m * stat: the chunk's own part is row - (1 - m) * start.
        keep = 1.0 - momentum
        for row in rows:
            value = keep * value + (row - keep * start)
        return value
    # Cumulative average: torch used factor 1 / (count + 1) for every chunk's forward.
    first = 1.0 / (count + 1)
    for c, row in enumerate(rows):
        stat = (row - (1.0 - first) * start) / first
        factor = 1.0 / (count + c + 1)
        value = (1.0 - factor) * value + factor * stat
    return value
