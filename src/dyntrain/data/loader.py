"""This worker's chunks, produced ahead of time by DataLoader worker processes.

The trainer tells the loader which chunks it will compute next (``expect(step, chunks)``, at the
start of every step); the loader predicts that the following steps keep the same chunks and keeps
``prefetch`` chunks in flight in a ``torch.utils.data.DataLoader`` with persistent worker
processes. Every request is keyed by (step, chunk) and carries its sample indices; the loader
process seeds torch's generator (and Python's ``random``) from (seed, step, chunk, position)
before each sample, so a chunk's content is a pure function of its key: it does not depend on
which loader process or training worker produced it, and prefetching cannot change the result.

When the plan changes (a membership change, a re-balanced assignment, a step recomputed after a
failure) ``expect`` is told different chunks or a step out of sequence: chunks already prefetched
that are still in the plan are kept, the others are discarded, and requests for the new plan
follow at once. The plan lives in a small shared-memory tensor that the loader processes read
before every sample: a request the plan no longer needs is dropped where it stands (queued or
half loaded) and comes back empty, so the new plan's chunks do not wait behind the old plan's
(a rescale does not pay for loading what nobody will compute). The loader processes stay up the
whole time, and die with the training process however it ends (``dyntrain.lifeline``; they
are tied to the thread that builds the loader, the one that builds the ``ElasticTrainer``).

A failing sample (missing, unreadable or corrupt file) comes back as a one-line ``DataError``
naming the file, raised in the training process.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import random
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

from dyntrain.elastic.step.sampler import BatchOrder, derive_seed
from dyntrain.elastic.step.stepper import _to_device
from dyntrain.errors import ConfigError, DataError
from dyntrain.lifeline import die_with_parent

Key = tuple[int, int]  # (step, chunk)


@dataclass(frozen=True)
class LoaderConfig:
    """Loader processes per training worker and how many chunks they keep in flight.

    ``workers`` 0 loads in the training process (same results, no parallelism). ``pin_memory``
    None pins when the device is CUDA. ``start_method`` is the multiprocessing context of the
    loader processes (None: the platform default, ``fork`` on Linux). ``timeout`` (seconds) turns
    a loader process that stops answering into an error instead of a hang.

    Pass it as ``ElasticTrainer(..., loader=LoaderConfig(workers=2))``. The data set's
    randomness must come from torch's generator or Python's ``random``, which every loader
    process seeds per sample from (seed, step, chunk, position).

    Args:
        workers: Loader processes per training worker (0: load in the training process).
        prefetch: Chunks requested ahead of the one being computed (at least 1).
        pin_memory: Pin the chunks' memory for faster copies to the GPU (None: on CUDA).
        start_method: ``fork``, ``spawn`` or ``forkserver`` (None: the platform's default).
        timeout: Seconds a loader process may take to answer before it is an error.

    Raises:
        ConfigError: A value is out of range.
    """

    workers: int = 2
    prefetch: int = 4
    pin_memory: bool | None = None
    start_method: str | None = None
    timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ConfigError(f"loader workers must be >= 0, got {self.workers}")
        if self.prefetch < 1:
            raise ConfigError(f"loader prefetch must be >= 1 chunk, got {self.prefetch}")
        if self.timeout <= 0:
            raise ConfigError(f"loader timeout must be positive, got {self.timeout}")

    def build(self, dataset: Dataset, order: BatchOrder, chunk_size: int, total_steps: int,
              seed: int, device: torch.device) -> ChunkLoader:
        """The loader the trainer uses (the runtime does not import this package).

        Called by ``ElasticTrainer``; not needed in a training script.

        Args:
            dataset: The training set.
            order: The run's data order (``dyntrain.elastic.step.sampler.BatchOrder``).
            chunk_size: Samples per chunk.
            total_steps: Steps of the whole run.
            seed: The run's seed.
            device: Where the chunks go.
        """
        return ChunkLoader(dataset, order, chunk_size, total_steps, seed, device, self)


@dataclass(frozen=True)
class ChunkRequest:
    """What a loader process loads: the samples of chunk ``chunk`` of step ``step``."""

    step: int
    chunk: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class _Failure:
    message: str


@dataclass(frozen=True)
class _Small:
    """A small tensor sent by value through the result pipe (as bytes): passing a shared-memory
    segment costs a socket connection and an authentication handshake per tensor in both
    processes, about 1 ms, far more than copying up to ``BY_VALUE`` bytes."""

    data: object  # numpy uint8 array of the tensor's bytes
    dtype: torch.dtype
    shape: tuple[int, ...]


BY_VALUE = 1 << 20  # bytes: tensors up to this size leave a loader process by value


def _pack(batch):
    if isinstance(batch, torch.Tensor):
        if batch.nbytes > BY_VALUE:
            return batch
        raw = batch.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        return _Small(raw, batch.dtype, tuple(batch.shape))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pack(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _pack(v) for k, v in batch.items()}
    return batch


def _unpack(batch, pin: bool):
    if isinstance(batch, _Small):
        t = torch.from_numpy(batch.data).view(batch.dtype).reshape(batch.shape)
        return t.pin_memory() if pin else t
    if isinstance(batch, (list, tuple)):
        return type(batch)(_unpack(b, pin) for b in batch)
    if isinstance(batch, dict):
        return {k: _unpack(v, pin) for k, v in batch.items()}
    return batch


class _Dropped:
    """A request the plan no longer needed when a loader process got to it (or mid-chunk)."""


class SharedPlan:
    """The loader's plan in shared memory: ``[first step, chunk 0 in plan, chunk 1 in plan, ...]``.

    Written by the training process, read by the loader processes (inherited by fork, passed
    as a shared tensor otherwise). A torn read can only drop a request that is still needed
    (it is asked again) or load one that is not (it is discarded), never change a chunk."""

    def __init__(self, num_chunks: int) -> None:
        self.tensor = torch.full((1 + num_chunks,), -1, dtype=torch.int64).share_memory_()
        self._view = None

    def set(self, step: int, chunks: Sequence[int]) -> None:
        t = self.tensor
        t[1:] = 0
        if chunks:
            t[1 + torch.tensor(chunks)] = 1
        t[0] = step

    def wanted(self, step: int, chunk: int) -> bool:
        if self._view is None:  # a numpy view: reading two numbers costs ~100 ns, not ~2 us
            self._view = self.tensor.numpy()
        v = self._view
        return step >= v[0] and 0 <= chunk < len(v) - 1 and v[1 + chunk] == 1

    def __getstate__(self) -> dict:
        return {"tensor": self.tensor}

    def __setstate__(self, state: dict) -> None:
        self.tensor, self._view = state["tensor"], None


def sample_seed(seed: int, step: int, chunk: int, position: int) -> int:
    """The generator seed for one sample's augmentation, whoever loads it."""
    return derive_seed(seed, "sample", step, chunk, position)


class SeededChunks(Dataset):
    """Loads whole chunks: seeds the generators per sample, then ``dataset[i]``, collated.
    With a ``plan``, a chunk it no longer wants is dropped before its next sample."""

    def __init__(self, dataset: Dataset, seed: int, plan: SharedPlan | None = None) -> None:
        self.dataset, self.seed, self.plan = dataset, seed, plan

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, request: ChunkRequest | None):
        if request is None:  # nothing to load yet: an idle slot in the pipeline
            return None, None
        key = (request.step, request.chunk)
        # In the training process the generators belong to the step: leave them as they were.
        guard = torch.random.fork_rng(devices=[]) if get_worker_info() is None else nullcontext()
        state = random.getstate() if get_worker_info() is None else None
        try:
            with guard:
                samples = []
                for pos, index in enumerate(request.indices):
                    if self.plan is not None and not self.plan.wanted(*key):
                        return key, _Dropped()
                    s = sample_seed(self.seed, request.step, request.chunk, pos)
                    torch.default_generator.manual_seed(s)
                    random.seed(s)
                    samples.append(self.dataset[index])
                batch = default_collate(samples)
                return key, batch if get_worker_info() is None else _pack(batch)
        except Exception as exc:  # sent back as data: DataLoader would wrap it in a traceback
            return key, _Failure(f"{exc}" if isinstance(exc, DataError)
                                 else f"{type(exc).__name__}: {exc}".splitlines()[0])
        finally:
            if state is not None:
                random.setstate(state)


def _identity(batch):
    return batch


def _tie_to_owner(owner: int | None, _loader_id: int) -> None:
    """In a loader process, first thing: die with the training process that started it."""
    die_with_parent(owner)


class _PlanSampler:
    """The DataLoader's batch sampler: an endless stream of requests from the loader's plan."""

    def __init__(self, loader: ChunkLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[ChunkRequest | None]:
        while True:
            yield self.loader._next_request()


class ChunkLoader:
    """Prefetches this worker's chunks in DataLoader processes; ``fetch`` returns one on
    ``device``. Used by the ``ChunkStepper`` when ``ElasticTrainer(loader=...)`` is given."""

    def __init__(self, dataset: Dataset, order: BatchOrder, chunk_size: int, total_steps: int,
                 seed: int, device: torch.device, config: LoaderConfig | None = None) -> None:
        self.config = config or LoaderConfig()
        self.order, self.chunk_size, self.total_steps = order, chunk_size, total_steps
        self.device = device
        self.plan_step, self.plan_chunks = -2, ()  # nothing expected yet
        self._cursor: tuple[int, int] = (total_steps, 0)
        self._in_flight: set[Key] = set()
        self._ready: dict[Key, object] = {}
        self.discarded = 0  # prefetched chunks the plan no longer needed
        self.dropped = 0  # of those, the ones a loader process dropped before finishing them
        self._plan = SharedPlan(order.global_batch // chunk_size)
        cfg = self.config
        pin = cfg.pin_memory if cfg.pin_memory is not None else device.type == "cuda"
        self._pin = pin and cfg.workers > 0  # (the DataLoader pins the shared-memory tensors)
        extra = {}
        if cfg.workers:
            # a loader process dies with this process (whatever kills it), not minutes later
            # or never (torch's own check waits for the loader to be idle, and a loader whose
            # results fill the pipe to a dead worker never is); with ``forkserver`` its parent
            # is multiprocessing's server, which ends with this process
            owner = None if cfg.start_method == "forkserver" else os.getpid()
            extra = {"prefetch_factor": max(1, math.ceil(cfg.prefetch / cfg.workers)),
                     "persistent_workers": True, "timeout": cfg.timeout,
                     "multiprocessing_context": cfg.start_method,
                     "worker_init_fn": functools.partial(_tie_to_owner, owner)}
        self._loader = DataLoader(SeededChunks(dataset, seed, self._plan),
                                  batch_sampler=_PlanSampler(self), collate_fn=_identity,
                                  num_workers=cfg.workers, pin_memory=pin, **extra)
        # Start the loader processes now (before the trainer starts its own threads); the
        # pipeline holds idle requests until the first ``expect``. Unreachable cycles are
        # collected first, here: a forked process that collected an inherited one would run
        # its destructors there (a torch TCPStore server's aborts the process: its thread is
        # not in the child).
        if cfg.workers and cfg.start_method in (None, "fork"):
            gc.collect()
        self._it = iter(self._loader)

    def expect(self, step: int, chunks: Sequence[int]) -> None:
        """This worker computes ``chunks`` of ``step`` now, and (presumably) the same chunks of
        the following steps."""
        chunks = tuple(chunks)
        if chunks != self.plan_chunks or step != self.plan_step + 1:
            self._replan(step, chunks)
            return
        self.plan_step = step
        self._plan.tensor[0] = step
        self._cursor = max(self._cursor, (step, 0))
        self._purge()

    def _replan(self, step: int, chunks: tuple[int, ...]) -> None:
        """Request from (step, first chunk) on again; in-flight and ready keys are skipped, so
        only chunks never requested or already consumed (a recomputed step) load again. The
        loader processes drop the in-flight requests outside the new plan."""
        self.plan_step, self.plan_chunks, self._cursor = step, chunks, (step, 0)
        self._plan.set(step, chunks)
        self._purge()

    def _purge(self) -> None:
        for key in [k for k in self._ready if not self._useful(k)]:
            del self._ready[key]
            self.discarded += 1

    def fetch(self, step: int, chunk: int, indices: torch.Tensor):
        """The batch of (``step``, ``chunk``) on the device; ``indices`` must be its samples."""
        key = (step, chunk)
        while key not in self._ready:
            if key not in self._in_flight:
                # next in the plan but not requested yet (no loader processes), consumed before
                # (a recomputed step), dropped, or outside the plan: request from it on
                if chunk in self.plan_chunks and step >= self.plan_step:
                    self._cursor = (step, self.plan_chunks.index(chunk))
                else:
                    self._replan(step, (chunk,))
            got, batch = self._next()
            if got is None:
                continue
            self._in_flight.discard(got)
            if isinstance(batch, _Dropped):
                self.discarded += 1
                self.dropped += 1
                if self._useful(got):  # the plan changed back meanwhile: ask for it again
                    self._cursor = min(self._cursor, (got[0], self.plan_chunks.index(got[1])))
            elif self._useful(got):
                self._ready[got] = batch
            else:
                self.discarded += 1
        batch = self._ready.pop(key)
        if isinstance(batch, _Failure):
            raise DataError(f"loading step {step} chunk {chunk}: {batch.message}")
        expected = self.order.chunk(step, chunk, self.chunk_size)
        if not torch.equal(expected, indices):
            raise RuntimeError(f"loader and stepper disagree on the samples of chunk {key}")
        return _to_device(_unpack(batch, self._pin), self.device)

    def load_here(self, step: int, chunk: int):
        """The batch of (``step``, ``chunk``) loaded in this process as a loader process loads
        it, on the device; the loader processes and their plan are left alone (the canary's
        chunk, read before training)."""
        idx = self.order.chunk(step, chunk, self.chunk_size)
        chunks = self._loader.dataset
        _, batch = SeededChunks(chunks.dataset, chunks.seed).__getitems__(
            ChunkRequest(step, chunk, tuple(idx.tolist())))
        if isinstance(batch, _Failure):
            raise DataError(f"loading step {step} chunk {chunk}: {batch.message}")
        return _to_device(batch, self.device)

    def close(self) -> None:
        """Stop the loader processes."""
        it, self._it = self._it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()

    # ---- the request stream (called by the DataLoader on this thread) --------------------------

    def _next(self):
        try:
            return next(self._it)
        except StopIteration:  # cannot happen with an endless sampler; restart to be safe
            self._it = iter(self._loader)
            return None, None

    def _useful(self, key: Key) -> bool:
        return key[0] >= self.plan_step and key[1] in self.plan_chunks

    def _next_request(self) -> ChunkRequest | None:
        step, i = self._cursor
        while step < self.total_steps and self.plan_chunks:
            if i >= len(self.plan_chunks):
                step, i = step + 1, 0
                continue
            key = (step, self.plan_chunks[i])
            i += 1
            if key in self._in_flight or key in self._ready:
                continue
            self._cursor = (step, i)
            self._in_flight.add(key)
            idx = self.order.chunk(step, key[1], self.chunk_size)
            return ChunkRequest(step, key[1], tuple(idx.tolist()))
        self._cursor = (step, i)
        return None
