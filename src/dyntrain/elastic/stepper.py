"""One optimizer step over a fixed global batch, whatever the world size.

``compute`` runs this worker's chunks and packs everything the all-reduce must add up into one flat
buffer: the chunk-gradient sum, the per-chunk BatchNorm rows, the loss, and two control flags.
``apply`` unpacks the summed buffer and takes the optimizer step, identically on every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from dyntrain.elastic.buffers import BatchNormChunkStats
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.plan import assign_chunks
from dyntrain.elastic.sampler import chunk_indices, chunk_seed, epoch_permutation
from dyntrain.elastic.state import TrainingParts
from dyntrain.errors import ConfigError

LossFn = Callable[[torch.nn.Module, object], torch.Tensor]

# The flat buffer ends with three scalars: the loss and two control flags.
TAIL = 3


@dataclass
class StepResult:
    loss: float
    reform: bool  # some member asked to re-form after this step
    leavers: int  # how many members leave after this step


class ChunkStepper:
    """Computes a worker's share of one step and applies the summed result."""

    def __init__(self, config: TrainConfig, parts: TrainingParts, dataset: Dataset,
                 loss_fn: LossFn, device: torch.device) -> None:
        self.config, self.parts, self.dataset = config, parts, dataset
        self.loss_fn, self.device = loss_fn, device
        self.dataset_size = len(dataset)
        self.steps_per_epoch = config.steps_per_epoch(self.dataset_size)
        self.params = [q for q in parts.model.parameters() if q.requires_grad]
        dtypes = {q.dtype for q in self.params}
        if len(dtypes) > 1:
            raise ConfigError(f"all trainable parameters must share one dtype, got {dtypes}")
        self.bn = BatchNormChunkStats(parts.model)
        numel = sum(q.numel() for q in self.params)
        param_dtype = dtypes.pop() if dtypes else torch.float32
        # Gradients live in one flat buffer: backward accumulates into views of it.
        self._grads = torch.zeros(numel, dtype=param_dtype, device=device)
        self.reduce_dtype = torch.float64 if config.exact_reduction else torch.float32
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def batch_indices(self, step: int) -> torch.Tensor:
        """The sample indices of global step ``step`` (epochs run back to back)."""
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        if epoch != self._perm_epoch:
            self._perm = epoch_permutation(self.config.seed, epoch, self.dataset_size)
            self._perm_epoch = epoch
        g = self.config.global_batch
        return self._perm[in_epoch * g : (in_epoch + 1) * g]

    def my_chunks(self, rank: int, world_size: int) -> range:
        return assign_chunks(self.config.num_chunks, world_size)[rank]

    def compute(self, step: int, chunks: range) -> torch.Tensor:
        """Forward/backward over ``chunks`` of step ``step``; returns the flat buffer to sum."""
        cfg, model, scaler = self.config, self.parts.model, self.parts.scaler
        model.train()
        self._attach_grads()
        self._grads.zero_()
        exact = self.reduce_dtype != self._grads.dtype
        total = torch.zeros_like(self._grads, dtype=self.reduce_dtype) if exact else self._grads
        batch_idx = self.batch_indices(step)
        self.bn.begin_step()
        table = torch.zeros(cfg.num_chunks, self.bn.width, device=self.device,
                            dtype=self.reduce_dtype)
        loss_sum = torch.zeros((), device=self.device, dtype=self.reduce_dtype)
        for chunk in chunks:
            # Randomness (dropout, augmentation) depends on (seed, step, chunk), not on the worker.
            self._seed(chunk_seed(cfg.seed, step, chunk))
            batch = self._fetch(chunk_indices(batch_idx, chunk, cfg.chunk_size))
            self.bn.before_chunk()
            # loss_fn returns the chunk mean; each .backward() adds to .grad, so weighting by
            # chunk/global makes the sum over all chunks of all workers the global-batch mean.
            loss = self.loss_fn(model, batch) * (cfg.chunk_size / cfg.global_batch)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            self.bn.record_chunk(table[chunk])
            loss_sum += loss.detach()
            if exact:
                # Each chunk's gradient is added once in float64: exact for any grouping.
                total += self._grads
                self._grads.zero_()
        self.bn.before_chunk()
        tail = torch.zeros(TAIL, device=self.device, dtype=self.reduce_dtype)
        tail[0] = loss_sum
        return torch.cat([total.to(self.reduce_dtype), table.reshape(-1), tail])

    def _seed(self, seed: int) -> None:
        # Only the generators this step can draw from: torch.manual_seed would also seed every
        # accelerator backend, at ~0.1 ms a call.
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.default_generators[self.device.index or 0].manual_seed(seed)

    def _attach_grads(self) -> None:
        """Point every parameter's .grad at its slice of the flat buffer (again, if replaced)."""
        offset = 0
        for q in self.params:
            n = q.numel()
            view = self._grads[offset : offset + n].view_as(q)
            if q.grad is None or q.grad.data_ptr() != view.data_ptr():
                q.grad = view
            offset += n

    @staticmethod
    def set_flags(flat: torch.Tensor, reform: bool, leave: bool) -> None:
        flat[-2] = float(reform)
        flat[-1] = float(leave)

    def apply(self, flat: torch.Tensor) -> StepResult:
        """Unpack the all-reduced buffer, replay BatchNorm updates and take the optimizer step."""
        self._attach_grads()
        offset = self._grads.numel()
        self._grads.copy_(flat[:offset])  # the one rounding back to the parameters' dtype
        width = self.bn.width * self.config.num_chunks
        self.bn.finish_step(flat[offset : offset + width].view(self.config.num_chunks, -1))
        opt, scaler, sched = self.parts.optimizer, self.parts.scaler, self.parts.lr_scheduler
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if sched is not None:
            sched.step()
        loss, reform, leavers = flat[-TAIL:].tolist()
        return StepResult(loss=loss, reform=reform > 0, leavers=round(leavers))

    def _fetch(self, idx: torch.Tensor):
        ds = self.dataset
        if isinstance(ds, TensorDataset):
            batch = tuple(t[idx] for t in ds.tensors)
        else:
            batch = default_collate([ds[i] for i in idx.tolist()])
        return _to_device(batch, self.device)


def _to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
