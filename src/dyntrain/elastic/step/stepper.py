"""One optimizer step over a fixed global batch, whatever the world size.

``start`` runs this worker's chunks; while the backward of its last chunk runs, the gradient
buckets that are final are already being summed over the group (``reducer``). What else the
members must add up (the per-chunk BatchNorm rows, the loss, two control flags) travels in a
small tail summed after backward. ``finish`` waits for the sums and takes the optimizer step,
identically on every worker. ``compute``/``apply`` are the same step as one flat buffer
``[gradient sum | tail]``, summed by the caller (tests simulate workers that way).

With ``TrainConfig.noise_scale`` on, the stepper also estimates the gradient noise scale B_simple
(McCandlish et al. 2018, App. A.1; see ``dyntrain.elastic.step.noise``) in the same all-reduce:
after each chunk's backward a worker takes the norm of what that chunk added to the gradient,
(chunk_size / global_batch) * g_chunk with g_chunk the chunk's mean gradient (one reduction per
chunk), and the buffer gets one slot per chunk for these norms, between the BatchNorm rows and
the loss (zero for chunks of other workers, like the BatchNorm rows). ``apply`` turns the
summed slots into the mean |g_chunk|^2 over chunks (b_small = ``chunk_size``; undoing the
weight and any loss scale), takes |G|^2 of the reduced global-batch gradient (b_big =
``global_batch``) and feeds both to a ``NoiseScaleTracker``. Every worker feeds the same
numbers, whatever the world size, so all trackers agree; the tracker's state travels with the
training state (``TrainingParts.noise``).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.reducer import StepReduction, plan_buckets
from dyntrain.elastic.collective.tail import SCALARS, TailLayout, set_flags
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.sharding.gradients import SUMS, GradientShards
from dyntrain.elastic.sharding.zero import OptimizerShards
from dyntrain.elastic.state import TrainingParts
from dyntrain.elastic.step.buffers import BatchNormChunkStats
from dyntrain.elastic.step.chunks import assign_chunks
from dyntrain.elastic.step.gradnorm import clip_to_norm_, global_norm, tensor_squares
from dyntrain.elastic.step.noise import NoiseScale, NoiseScaleTracker
from dyntrain.elastic.step.sampler import BatchOrder, chunk_indices, chunk_seed
from dyntrain.errors import ConfigError

LossFn = Callable[[torch.nn.Module, object], torch.Tensor]

#: the flat buffer ends with the tail's scalars (the loss, three flags:
#: ``dyntrain.elastic.collective.tail``)
TAIL = len(SCALARS)


@dataclass
class StepResult:
    loss: float
    reform: bool  # some member asked to re-form after this step
    leavers: int  # how many members leave after this step
    # This step's gradient noise scale estimates (TrainConfig.noise_scale); None when it is off
    # or the step's gradients were not finite (a loss-scaler overflow step).
    noise: NoiseScale | None = None
    # The global norm of the reduced gradient before clipping (TrainConfig.grad_clip_norm).
    grad_norm: float | None = None
    # The learning rate this step was applied with (the optimizer's first parameter group).
    lr: float | None = None
    # The summed slots of the step's tail (``ChunkStepper.finish``): the members' chunk times.
    slots: list[float] = field(default_factory=list)
    # The leader asked for a checkpoint after this step (by time, at sharding levels 1-3).
    checkpoint: bool = False


class ChunkStepper:
    """Computes a worker's share of one step and applies the summed result."""

    def __init__(self, config: TrainConfig, parts: TrainingParts, dataset: Dataset,
                 loss_fn: LossFn, device: torch.device, loader=None) -> None:
        self.config, self.parts, self.dataset = config, parts, dataset
        self.loss_fn, self.device = loss_fn, device
        self.loader = loader  # a dyntrain.data.ChunkLoader, or None: load in this process
        self.dataset_size = len(dataset)
        self.steps_per_epoch = config.steps_per_epoch(self.dataset_size)
        self.params = [q for q in parts.model.parameters() if q.requires_grad]
        dtypes = {q.dtype for q in self.params}
        if len(dtypes) > 1:
            raise ConfigError(f"all trainable parameters must share one dtype, got {dtypes}")
        self.bn = BatchNormChunkStats(parts.model)
        numel = sum(q.numel() for q in self.params)
        param_dtype = dtypes.pop() if dtypes else torch.float32
        # Gradients live in one flat buffer: backward accumulates into views of it. It is laid
        # out in buckets, last parameters first (the order in which backward finishes them).
        cap = max(1, int(config.bucket_mb * 2**20) // param_dtype.itemsize)
        self.buckets = plan_buckets([q.numel() for q in self.params], cap)
        self.offsets = [0] * len(self.params)  # where each parameter starts in the buffer
        self._bucket_of = [0] * len(self.params)
        for b, bucket in enumerate(self.buckets):
            offset = bucket.start
            for index in bucket.params:
                self.offsets[index], self._bucket_of[index] = offset, b
                offset += self.params[index].numel()
        self._live: StepReduction | None = None  # the step whose last backward is running
        # Parameters that the last backward did not reach would hold their bucket back until
        # backward ends (buckets go in order): while there were any, each step finds them in
        # its autograd graph and marks them final before backward.
        self._look_for_unused = True
        for index, q in enumerate(self.params):
            q.register_post_accumulate_grad_hook(functools.partial(self._grad_ready, index))
        self._numel, self._param_dtype = numel, param_dtype
        self._numels = [q.numel() for q in self.params]
        # The flat buffers that a step's sums are written into belong to the generation whose
        # group sums them (``Group.buffers``; ``_bind``): a late write of an abandoned
        # generation cannot reach the next one's. ``compute`` (no group) uses ``_spare``.
        self._spare: dict[str, torch.Tensor] = {}
        self._buffers: dict[str, torch.Tensor] | None = None
        self._grads = self._total = self._grads_row = None
        self._bind(self._spare)
        self.reduce_dtype = torch.float64 if config.exact_reduction else torch.float32
        self.order = BatchOrder(config.seed, self.dataset_size, config.global_batch)
        self.noise: NoiseScaleTracker | None = None
        if config.noise_scale:
            self.noise = NoiseScaleTracker(config.chunk_size, config.global_batch,
                                           ema=config.noise_ema, population=self.dataset_size)
        parts.noise = self.noise  # so that its state travels with the training state
        self._pads: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        # ZeRO-1/2 (``TrainConfig.shard_level``, in a job): this member's share of the optimizer
        # state, set by the trainer (``use_shards``); None steps everything. At level 2 also
        # its share of the reduced gradient (``dyntrain.elastic.sharding.gradients``).
        self.shards: OptimizerShards | None = None
        self.grad_shards: GradientShards | None = None

    def batch_indices(self, step: int) -> torch.Tensor:
        """The sample indices of global step ``step`` (epochs run back to back)."""
        return self.order.indices(step)

    def my_chunks(self, rank: int, world_size: int) -> range:
        return assign_chunks(self.config.num_chunks, world_size)[rank]

    def measures(self, step: int) -> bool:
        """Whether step ``step`` measures the noise scale (every ``noise_every``-th step)."""
        return self.noise is not None and step % self.config.noise_every == 0

    def compute(self, step: int, chunks: Sequence[int]) -> torch.Tensor:
        """Forward/backward over ``chunks`` of step ``step``; returns the flat buffer to sum,
        ``[gradient sum | tail]`` (in the reduction dtype), for ``apply``."""
        red = self.start(step, chunks, None)
        return torch.cat([*(contrib for contrib, _ in red.wires), red.meta])

    def use_shards(self, shards: OptimizerShards, rank: int, size: int) -> None:
        """Step only the tensors ``shards`` owns (its plan of this generation, in which this
        member has rank ``rank`` of ``size``); at level 2 also lay the gradient buckets out by
        primary owner, and sum each step's gradient only into its owners (``gradshard``)."""
        self.shards = shards
        if shards.level >= 2:
            if self.grad_shards is None:
                self.grad_shards = GradientShards(self.buckets, [q.numel() for q in self.params])
            self.offsets = self.grad_shards.arrange(shards.owner_ranks, rank, size)

    def gradient_bytes(self) -> int:
        """Bytes of the gradient buffers held: the flat one backward writes into, the float64
        chunk sum (levels 0-1) or the primaries' float64 sums of several rounds (level 2)."""
        held = self._buffers or {}
        return sum(held[k].numel() * held[k].element_size() for k in ("grads", "total", SUMS)
                   if k in held)

    def start(self, step: int, chunks: Sequence[int], group: Group | None,
              most_chunks: int | None = None, slots: int = 0,
              should_abort: Callable[[], bool] | None = None) -> StepReduction:
        """Forward/backward over ``chunks`` of step ``step``. The gradient buckets of the last
        chunk are summed over ``group`` as backward finishes them (``TrainConfig.overlap``);
        ``finish`` completes the step. ``most_chunks``: the most chunks any member computes in
        this step (1 lets the exact ring send single-chunk gradients as float32). ``slots``:
        how many numbers the members add up besides (see ``finish``). ``should_abort``: at
        level 2 the gradient is summed here, chunk by chunk (waits give up when it is true)."""
        cfg, model, scaler = self.config, self.parts.model, self.parts.scaler
        model.train()
        self._bind(group.buffers if group is not None else self._spare)
        self._attach_grads()
        self._grads.zero_()
        exact = self.reduce_dtype != self._grads.dtype
        measure = self.measures(step)
        chunks = list(chunks)
        ring = (exact and cfg.exact_ring and group is not None and group.ring
                and group.size > 1)
        # One chunk is its own sum: alone, or in the ring when every member computes at most
        # one chunk (it sends the float32 gradient as it is and writes the rounded sum over it),
        # there is no float64 copy at all.
        direct = len(chunks) <= 1 and group is not None and (
            group.size == 1 or (ring and most_chunks is not None and most_chunks <= 1))
        # Level 2: each chunk's gradient is summed into its owners after its backward, in rounds,
        # no float64 copy of the whole (``gradshard``); as level 1 where all own all (N <= r).
        zero2 = (ring and self.grad_shards is not None and most_chunks is not None
                 and not self.shards.replicated)
        units = self.shards.units if zero2 else None  # level 3: parameters gathered per unit
        if zero2:
            self.grad_shards.begin(group, most_chunks)
            direct, measure = True, False  # noise_scale is refused at level 2 (TrainConfig)
        if units is not None:
            units.begin(group, should_abort or _never)
        # A chunk's own gradient is needed apart (float64 sum, or its norm for the noise scale):
        # backward writes it alone into the zeroed buffer, which is then added to ``total``. In
        # float32 that is the very addition backward would have done, so the sum is unchanged.
        separate = (exact or measure) and not direct
        total = self._grads
        if separate:
            if self._total is None:  # kept: a fresh buffer per step costs page faults
                self._total = self._buffers["total"] = torch.zeros_like(
                    self._grads, dtype=self.reduce_dtype)
            total = self._total.zero_()
        # |contribution| of each chunk as a 1-element tensor, from its per-bucket norms (the
        # last chunk's buckets may be overwritten by their sums before backward ends)
        norms: list[torch.Tensor] | None = [] if measure else None
        bucket_norms: list[torch.Tensor] = []

        def wire(b: int) -> tuple[torch.Tensor, torch.Tensor]:
            # bucket b of the last chunk is final: add it (each chunk's gradient is added once,
            # in float64 if exact: exact for any grouping); a worker without chunks adds zeros
            part = slice(self.buckets[b].start, self.buckets[b].stop)
            if norms is not None and chunks:
                bucket_norms.append(_norm(self._grads[part]))
            if separate:
                total[part] += self._grads[part]
            return total[part], self._grads[part]

        # levels 2-3 with clipping: each tensor's primary sends its term of the global norm
        squares = len(self.params) if zero2 and cfg.grad_clip_norm is not None else 0
        layout = TailLayout(self.bn.width * cfg.num_chunks, cfg.num_chunks if measure else 0,
                            slots, squares)
        red = StepReduction(group, [] if zero2 else self.buckets, wire, overlap=cfg.overlap,
                            ring=ring, layout=layout)
        if self.loader is not None:
            self.loader.expect(step, chunks)
        batch_idx = self.batch_indices(step)
        self.bn.begin_step()
        table = torch.zeros(cfg.num_chunks, self.bn.width, device=self.device,
                            dtype=self.reduce_dtype)
        loss_sum = torch.zeros((), device=self.device, dtype=self.reduce_dtype)
        try:
            for i, chunk in enumerate(chunks):
                last = i == len(chunks) - 1
                # randomness (dropout, augmentation): of (seed, step, chunk), not of the worker
                self._seed(chunk_seed(cfg.seed, step, chunk))
                batch = self.fetch(step, chunk, chunk_indices(batch_idx, chunk, cfg.chunk_size))
                self.bn.before_chunk()
                with units.round() if units is not None else contextlib.nullcontext():
                    # the chunk's mean x chunk/global: summed over all chunks, the global mean
                    loss = self.loss_fn(model, batch) * (cfg.chunk_size / cfg.global_batch)
                    scaled = scaler.scale(loss) if scaler is not None else loss
                    if last and cfg.overlap and not zero2:
                        self._mark_unused(scaled, red)
                    self._live = red if last and not zero2 else None
                    try:
                        scaled.backward()
                    finally:
                        self._live = None
                self.bn.record_chunk(table[chunk])
                loss_sum += loss.detach()
                if norms is not None and not last:
                    norms.append(self._bucketed_norm(self._grads))
                if separate and not last:
                    total += self._grads
                    self._grads.zero_()
                if zero2:
                    self.grad_shards.add_round(group, self._grads, should_abort or _never)
            if zero2:
                for _ in range(most_chunks - len(chunks)):  # zeros, as the busiest member's rounds
                    if units is not None:
                        units.phantom()  # and its gathers
                    self.grad_shards.add_round(group, self._grads, should_abort or _never)
                self.grad_shards.finish(group, self._grads, should_abort or _never)
        finally:  # BatchNorm's buffers as the step found them, also if it is abandoned halfway
            self.bn.before_chunk()
        red.launch_all()
        if norms is not None and chunks:
            norms.append(_norm(torch.stack(bucket_norms)).view(1))
        # the tail, part by part (``TailLayout``)
        pieces = [table.reshape(-1)]
        if norms is not None:
            pieces += self._norm_slots(chunks, norms)
        if slots:
            pieces.append(torch.zeros(slots, device=self.device, dtype=self.reduce_dtype))
        if squares:
            pieces.append(tensor_squares(self._grads, self.offsets, self._numels,
                                         self.shards.primary_of(self.grad_shards.rank)))
        # only float64 parameters with a float32 reduction make the norms wider
        red.meta = torch.cat([*pieces, layout.scalars(loss_sum)]).to(self.reduce_dtype)
        return red

    def finish(self, red: StepReduction, reform: bool, leave: bool,
               should_abort: Callable[[], bool], slot: tuple[int, float] | None = None,
               checkpoint: bool = False) -> StepResult:
        """Set this worker's flags (and its ``(index, value)`` slot: the others add zeros),
        wait for every sum of the step and take the optimizer step. ``checkpoint``: the
        leader asks every member for a checkpoint after this step (by time)."""
        set_flags(red.meta, reform, leave, checkpoint)
        if slot is not None:
            red.meta[red.layout.caller_slots.start + slot[0]] = slot[1]
        meta = red.finish(red.meta, should_abort)
        self._attach_grads()
        result = self._apply_meta(meta, red.layout)
        if self.shards is not None:
            self.shards.after_step(red.group, should_abort)
        return result

    def _bucketed_norm(self, grads: torch.Tensor) -> torch.Tensor:
        """|grads| from its per-bucket norms (the same numbers however a chunk's norm is taken)."""
        parts = [_norm(grads[b.start : b.stop]) for b in self.buckets]
        return _norm(torch.stack(parts)).view(1)

    def _mark_unused(self, loss: torch.Tensor, red: StepReduction) -> None:
        """Mark the parameters that ``loss``'s backward cannot reach as final already."""
        if not self._look_for_unused:
            return
        reached = _reachable_leaves(loss)
        unused = [i for i, q in enumerate(self.params) if id(q) not in reached]
        for index in unused:
            red.param_ready(self._bucket_of[index])
        self._look_for_unused = bool(unused)

    def _grad_ready(self, index: int, param: torch.Tensor) -> None:
        if self._live is not None:
            self._live.param_ready(self._bucket_of[index])

    def _norm_slots(self, chunks: list[int], norms: list[torch.Tensor]) -> list[torch.Tensor]:
        """This worker's chunk norms at their chunks' slots of ``num_chunks``, zeros elsewhere."""
        k = self.config.num_chunks
        if not chunks or chunks == list(range(chunks[0], chunks[-1] + 1)):
            key = (chunks[0], chunks[-1] + 1) if chunks else (0, 0)
            pads = self._pads.get(key)
            if pads is None:
                pads = tuple(torch.zeros(n, device=self.device, dtype=self.reduce_dtype)
                             for n in (key[0], k - key[1]))
                self._pads[key] = pads
            return [pads[0], *norms, pads[1]]
        slots = torch.zeros(k, device=self.device, dtype=self.reduce_dtype)
        slots[chunks] = torch.cat(norms).to(self.reduce_dtype)
        return [slots]

    def _seed(self, seed: int) -> None:
        # Only the generators this step can draw from: torch.manual_seed would also seed every
        # accelerator backend, at ~0.1 ms a call.
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.default_generators[self.device.index or 0].manual_seed(seed)

    def _bind(self, buffers: dict[str, torch.Tensor]) -> None:
        """Take the step's flat buffers from ``buffers`` (a generation's ``Group.buffers``),
        making them there on first use. The previous generation's are let go first, gradients
        views included: whatever still writes into them writes where nothing reads."""
        if buffers is self._buffers:
            return
        for q in self.params:
            q.grad = None
        self._buffers = self._grads = self._total = self._grads_row = None
        if "grads" not in buffers:
            buffers["grads"] = torch.zeros(self._numel, dtype=self._param_dtype,
                                           device=self.device)
        self._buffers, self._grads, self._total = buffers, buffers["grads"], buffers.get("total")
        self._grads_row = self._grads.view(1, -1)  # its norm along dim 1 has shape (1,)

    def _attach_grads(self) -> None:
        """Point every parameter's .grad at its slice of the flat buffer (again, if replaced)."""
        for q, offset in zip(self.params, self.offsets, strict=True):
            view = self._grads[offset : offset + q.numel()]
            # a channels_last weight gets a channels_last gradient, so backward writes in place
            view = (view.as_strided(q.shape, q.stride()) if q.dim() == 4 and not
                    q.is_contiguous() and q.is_contiguous(memory_format=torch.channels_last)
                    else view.view_as(q))
            if q.grad is None or q.grad.data_ptr() != view.data_ptr():
                q.grad = view

    @staticmethod
    def set_flags(flat: torch.Tensor, reform: bool, leave: bool) -> None:
        """Set this worker's flags in a flat buffer of ``compute`` (its tail's last numbers)."""
        set_flags(flat, reform, leave)

    def apply(self, flat: torch.Tensor) -> StepResult:
        """Unpack the summed flat buffer, replay BatchNorm updates and take the optimizer step."""
        self._attach_grads()
        offset = self._grads.numel()
        self._grads.copy_(flat[:offset])  # the one rounding back to the parameters' dtype
        meta = flat[offset:]
        # a measuring step's buffer has the norm slots (compute's ``measures``, same on all)
        width, k = self.bn.width * self.config.num_chunks, self.config.num_chunks
        layout = (TailLayout.of_size(meta.numel(), width, k) if self.noise is not None
                  else TailLayout(width))
        return self._apply_meta(meta, layout)

    def _apply_meta(self, meta: torch.Tensor, layout: TailLayout) -> StepResult:
        """With the summed gradient in place: replay BatchNorm, step, read the summed tail."""
        opt, scaler, sched = self.parts.optimizer, self.parts.scaler, self.parts.lr_scheduler
        measured = layout.norms > 0
        # the loss scale this step's chunks were computed with (before the scaler's update)
        loss_scale = scaler.get_scale() if scaler is not None and measured else 1.0
        # Before the optimizer step: the scaler unscales the gradients in place.
        big = _row_norm(self._grads_row) if measured else None
        self.bn.finish_step(meta[layout.bn].view(self.config.num_chunks, -1))
        grad_norm = None
        if self.config.grad_clip_norm is not None:
            if scaler is not None:
                scaler.unscale_(opt)  # clip the true gradient; the scaler knows it is unscaled
            squares = (meta[layout.square_slots] if layout.squares else
                       tensor_squares(self._grads, self.offsets, self._numels))
            grad_norm = global_norm(squares)  # (``gradnorm``: the same at every level)
            clip_to_norm_(self._grads, grad_norm, self.config.grad_clip_norm)
        lr = opt.param_groups[0].get("lr") if opt.param_groups else None
        if self.shards is not None:
            if scaler is not None and self.config.grad_clip_norm is None:
                scaler.unscale_(opt)  # its overflow check must see the whole gradient
            self.shards.before_step()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if sched is not None:
            sched.step()
        tail = layout.read(meta)
        noise = None
        if big is not None:
            noise = self._update_noise(tail.norms, big.item(), loss_scale)
        return StepResult(loss=tail.loss, reform=tail.reform, leavers=tail.leavers, noise=noise,
                          grad_norm=grad_norm, slots=tail.slots, checkpoint=tail.checkpoint,
                          lr=float(lr) if isinstance(lr, int | float) else None)

    def _update_noise(self, chunk_norms: list[float], big_norm: float,
                      loss_scale: float) -> NoiseScale | None:
        """Feed the tracker this step's mean |g_chunk|^2 and |G_big|^2, both from the reduced
        buffer (so every worker feeds the same numbers); None where they are not finite.

        ``chunk_norms`` are the buffer's slots, |(chunk_size / global_batch) * loss_scale *
        g_chunk| for every chunk; ``big_norm`` is |loss_scale * G_big|, from the reduced
        gradient."""
        cfg = self.config
        unscale = 1.0 / loss_scale**2
        big = big_norm**2 * unscale
        small = (math.fsum(x * x for x in chunk_norms) * unscale
                 * (cfg.global_batch / cfg.chunk_size) ** 2 / cfg.num_chunks)
        if not (math.isfinite(big) and math.isfinite(small)):
            return None  # an overflow step, which the scaler skips as well
        return self.noise.update(small, big)

    def fetch(self, step: int, chunk: int, idx: torch.Tensor):
        """Chunk ``chunk`` of step ``step`` (samples ``idx``) on the device."""
        if self.loader is not None:
            return self.loader.fetch(step, chunk, idx)
        ds = self.dataset
        if isinstance(ds, TensorDataset):
            batch = tuple(t[idx] for t in ds.tensors)
        else:
            batch = default_collate([ds[i] for i in idx.tolist()])
        return _to_device(batch, self.device)


def _never() -> bool:
    return False


def _reachable_leaves(loss: torch.Tensor) -> set[int]:
    """The ids of the leaf tensors whose gradient ``loss.backward()`` accumulates."""
    found: set[int] = set()
    seen: set = set()
    stack = [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)  # an AccumulateGrad node
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return found


def _norm(t: torch.Tensor) -> torch.Tensor:
    """|t| as a 0-d tensor, accumulated in at least float32."""
    if t.dtype in (torch.float32, torch.float64):
        return torch.linalg.vector_norm(t)
    return torch.linalg.vector_norm(t, dtype=torch.float32)


def _row_norm(row: torch.Tensor) -> torch.Tensor:
    """|row| of a 1 x n tensor, with shape (1,), accumulated in at least float32. One ATen
    reduction: in the middle of a step it measured cheaper than ``torch.dot`` (a BLAS call) or
    ``(t * t).sum()`` (two ops and a temporary)."""
    if row.dtype in (torch.float32, torch.float64):
        return torch.linalg.vector_norm(row, dim=1)
    return torch.linalg.vector_norm(row, dim=1, dtype=torch.float32)


def _to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        if device.type == "cuda" and batch.device.type == "cpu":
            # pageable, a copy waits till the GPU's queue drains; pinned, it is asynchronous
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
