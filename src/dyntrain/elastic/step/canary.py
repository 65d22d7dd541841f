"""The canary: proof that a worker computes the job's bits, before it is admitted.

Equal settings (``dyntrain.elastic.numerics.observe``) do not prove equal bits: a CPU of
another microarchitecture at the same kernel level, a library built another way, an image
decoder of another version. So every worker computes one forward and backward of the job's own
model on the job's first chunk, in the job's precision (the script's ``loss_fn``, with its
autocast), and reports digests of what it computed; the first worker's become the job's
(``dyntrain.elastic.admission``), and a worker whose digests differ computes other bits.

The parameters are replaced for the computation by values drawn from a fixed generator (and
restored after): the canary must not depend on the model's initial weights, which only the
first worker's need to match a static run's. Buffers, gradients and the random generators are
left as they were found. Two digests are reported apart, so that a refusal can say where the
difference lies: ``data`` (the chunk's tensors as the data set gives them: decoding,
augmentation) and ``compute`` (the loss and every parameter's gradient).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from torch import nn

from dyntrain.elastic.admission import CanaryDigest
from dyntrain.elastic.step.sampler import chunk_indices, chunk_seed
from dyntrain.elastic.step.stepper import ChunkStepper


def job_canary(stepper: ChunkStepper) -> CanaryDigest:
    """The canary of the job ``stepper`` trains: its model and ``loss_fn`` on chunk 0 of step
    0, read as training reads it (through the loader's process code when there is a loader)."""
    cfg = stepper.config
    seed = chunk_seed(cfg.seed, 0, 0)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)  # as the step seeds a chunk it reads here
        if stepper.loader is not None:
            batch = stepper.loader.load_here(0, 0)
        else:
            batch = stepper.fetch(0, 0, chunk_indices(stepper.batch_indices(0), 0,
                                                      cfg.chunk_size))
    return canary_digest(stepper.parts.model, stepper.loss_fn, batch, seed, stepper.device)


def canary_digest(model: nn.Module, loss_fn: Callable[[nn.Module, object], torch.Tensor],
                  batch: object, seed: int, device: torch.device) -> CanaryDigest:
    """One forward and backward of ``model`` on ``batch`` (already on ``device``) with
    canary parameters, seeded with ``seed``; returns its digests and leaves the model, its
    gradients and the random generators as they were.

    Args:
        model: The job's model, with its parameters whole (before any sharding).
        loss_fn: The job's ``loss_fn(model, batch)``.
        batch: The job's first chunk.
        seed: The first chunk's seed (dropout, augmentation).
        device: Where the model is.
    """
    params = list(model.parameters())
    buffers = [b for b in model.buffers()]
    saved_params = [q.detach().clone() for q in params]
    saved_buffers = [b.detach().clone() for b in buffers]
    saved_grads = [q.grad for q in params]
    modes = [m.training for m in model.modules()]
    cpu_rng = torch.random.get_rng_state()
    cuda = device.type == "cuda"
    cuda_rng = torch.cuda.get_rng_state(device) if cuda else None
    try:
        with torch.no_grad():
            for index, q in enumerate(params):
                q.copy_(_canary_values(q, seed, index))
        for q in params:
            q.grad = None
        model.train()
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.default_generators[device.index or 0].manual_seed(seed)
        loss = loss_fn(model, batch)
        loss.backward()
        compute = hashlib.sha256()
        _feed(compute, loss.detach())
        for q in params:
            if q.grad is None:
                compute.update(b"-")
            else:
                _feed(compute, q.grad)
        data = hashlib.sha256()
        _feed_batch(data, batch)
        return CanaryDigest(data=data.hexdigest()[:16], compute=compute.hexdigest()[:16])
    finally:
        with torch.no_grad():
            for q, value, grad in zip(params, saved_params, saved_grads, strict=True):
                q.copy_(value)
                q.grad = grad
            for b, value in zip(buffers, saved_buffers, strict=True):
                b.copy_(value)
        for m, mode in zip(model.modules(), modes, strict=True):
            m.training = mode
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


def _canary_values(q: torch.Tensor, seed: int, index: int) -> torch.Tensor:
    """Values for parameter ``index``: uniform within its default initialisation's range
    (1/sqrt(fan-in) for a matrix or a kernel, 0.5 for a vector), drawn on the CPU from a
    generator of (seed, index), so they are the same on every device."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + index) % (2**63))
    bound = 1.0 / max(1.0, float(q[0].numel())) ** 0.5 if q.dim() >= 2 else 0.5
    values = torch.empty(q.shape, dtype=torch.float32).uniform_(-bound, bound, generator=gen)
    return values.to(device=q.device, dtype=q.dtype)


def _feed(h: hashlib._Hash, t: torch.Tensor) -> None:
    t = t.detach()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
        t = t.view(torch.int16)
    h.update(t.contiguous().cpu().numpy().tobytes())


def _feed_batch(h: hashlib._Hash, batch: object) -> None:
    if isinstance(batch, torch.Tensor):
        _feed(h, batch)
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            _feed_batch(h, item)
    elif isinstance(batch, dict):
        for key in sorted(batch, key=str):
            h.update(str(key).encode())
            _feed_batch(h, batch[key])
    else:
        h.update(repr(batch).encode())
