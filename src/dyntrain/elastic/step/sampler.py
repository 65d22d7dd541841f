"""Pure: the sequence of global batches as a function of (seed, epoch, step)."""

from __future__ import annotations

import hashlib

import torch


def epoch_permutation(seed: int, epoch: int, dataset_size: int) -> torch.Tensor:
    """The shuffled order of sample indices for one epoch; the same on every worker."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, "epoch", epoch))
    return torch.randperm(dataset_size, generator=gen)


def step_indices(
    seed: int, epoch: int, step_in_epoch: int, dataset_size: int, global_batch: int
) -> torch.Tensor:
    """The sample indices of one global batch."""
    perm = epoch_permutation(seed, epoch, dataset_size)
    start = step_in_epoch * global_batch
    if start + global_batch > dataset_size:
        raise ValueError(
            f"step {step_in_epoch} of epoch {epoch} runs past the data ({dataset_size} samples)"
        )
    return perm[start : start + global_batch]


def chunk_indices(batch_indices: torch.Tensor, chunk: int, chunk_size: int) -> torch.Tensor:
    """The sample indices of one chunk of a global batch."""
    return batch_indices[chunk * chunk_size : (chunk + 1) * chunk_size]


class BatchOrder:
    """The sample indices of any global step, epochs back to back (caches one permutation)."""

    def __init__(self, seed: int, dataset_size: int, global_batch: int) -> None:
        self.seed, self.dataset_size, self.global_batch = seed, dataset_size, global_batch
        self.steps_per_epoch = dataset_size // global_batch
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def indices(self, step: int) -> torch.Tensor:
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._perm, self._epoch = epoch_permutation(self.seed, epoch, self.dataset_size), epoch
        g = self.global_batch
        return self._perm[in_epoch * g : (in_epoch + 1) * g]

    def chunk(self, step: int, chunk: int, chunk_size: int) -> torch.Tensor:
        return chunk_indices(self.indices(step), chunk, chunk_size)


def chunk_seed(seed: int, step: int, chunk: int) -> int:
    """The RNG seed for dropout and augmentation of one chunk, whoever computes it."""
    return derive_seed(seed, "chunk", step, chunk)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any tuple of parts, stable across processes and platforms."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
