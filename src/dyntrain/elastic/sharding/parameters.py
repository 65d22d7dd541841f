"""ZeRO-3: the parameters sharded too; each unit's are gathered for its forward and its backward.

Between uses a member keeps only the parameters of the tensors whose optimizer state it holds
(its owned tensors, ``zero.OptimizerShards.held``: whole tensors, ``r`` owners each); the
storage of every other parameter is freed (resized to zero bytes: the tensor, its shape and the
views autograd saved of it stay, without memory). The units are ``owners.group_units`` of the
parameters' names (the GPT: one per transformer block, and a root unit of everything else,
the tied token embedding included).

One round (a chunk's forward and backward, ``round``) gathers the root unit first and keeps it
for the whole round; a forward pre-hook on each unit's module gathers the unit and a forward
hook frees it again; a backward pre-hook gathers it before its backward, and each parameter is
freed as soon as its gradient is accumulated (nothing reads it after that in a round). A gather
broadcasts each tensor of the unit from its primary owner, one flat buffer per primary, and
writes the bits into the parameter's own storage through ``.data``, so autograd's version
counters and saved tensors are left alone: every chunk computes with the unsharded run's bits.

Every gather is a collective, so every member issues the same sequence: the schedule of a
round is fixed (the root, the units in their order, then the units in reverse), a hook that
fires out of it raises a ``ConfigError`` (a unit called twice, skipped, or recomputed in
backward), what the round did not reach is gathered at its end, and a member with fewer chunks
than the busiest runs the whole schedule without computing (``phantom``). Outside the step the
whole model is allocated again (``whole``): at the start of a generation (zeros, then the
re-sharding sends every parameter), and for a checkpoint, a validation or the final model
(``zero.OptimizerShards.after_applied`` sends them); the next step frees them (``begin``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.sharding.owners import group_units
from dyntrain.errors import ConfigError

if TYPE_CHECKING:
    from dyntrain.elastic.sharding.zero import OptimizerShards

#: a step of a round's schedule: ("root" | "forward" | "backward", the unit's index)
Entry = tuple[str, int]


def check_level_3(params: Sequence[torch.Tensor]) -> None:
    """Refuse parameters that level 3 cannot free and gather one by one.

    Raises:
        ConfigError: A parameter is not on the CPU (the NCCL path is not built), or does not
            fill a storage of its own (one line, naming the reason).
    """
    for q in params:
        if q.device.type != "cpu":
            raise ConfigError("shard_level 3 is built for the CPU (gloo) only: the NCCL path "
                              "is not built; use shard_level 2 on GPUs")
        if (q.storage_offset() or not q.is_contiguous()
                or q.untyped_storage().nbytes() != q.numel() * q.element_size()):
            raise ConfigError("shard_level 3 needs every trainable parameter in a contiguous "
                              "storage of its own (it frees and gathers them one by one)")


class ParamUnits:
    """A member's parameters at level 3: which are allocated, and the hooks that gather them.

    Args:
        model: The model, whose unit modules get the hooks.
        params: The trainable parameters in the stepper's order.
        names: Their names, in the same order.
        shards: The member's ``OptimizerShards`` (what it holds, each tensor's owners).

    Raises:
        ConfigError: ``check_level_3`` refuses the parameters.
    """

    def __init__(self, model: nn.Module, params: Sequence[torch.Tensor], names: Sequence[str],
                 shards: OptimizerShards) -> None:
        check_level_3(params)
        self.params, self.shards = list(params), shards
        self.units = group_units(names)
        blocks = [k for k, u in enumerate(self.units) if u.name]
        self.schedule: list[Entry] = [
            *(("root", k) for k, u in enumerate(self.units) if not u.name),
            *(("forward", k) for k in blocks), *(("backward", k) for k in reversed(blocks))]
        self.present: set[int] = set(range(len(self.params)))  # allocated now
        self._group: Group | None = None
        self._abort: Callable[[], bool] = lambda: False
        self._active, self._cursor = False, 0
        for k in blocks:
            module = model.get_submodule(self.units[k].name)
            module.register_forward_pre_hook(functools.partial(self._on_forward, k))
            module.register_forward_hook(functools.partial(self._after_forward, k))
            module.register_full_backward_pre_hook(functools.partial(self._on_backward, k))
        for t, q in enumerate(self.params):
            q.register_post_accumulate_grad_hook(functools.partial(self._after_grad, t))

    def present_bytes(self) -> int:
        """Bytes of the parameters allocated now (between steps: the held tensors')."""
        return sum(self.params[t].numel() * self.params[t].element_size()
                   for t in self.present)

    # ---- outside the step ----------------------------------------------------------------------

    def whole(self) -> None:
        """Allocate every freed parameter again, as zeros (what they hold is stale until the
        re-sharding or ``OptimizerShards.after_applied`` sends them)."""
        self._active = False
        with torch.no_grad():
            for t, q in enumerate(self.params):
                if t not in self.present:
                    q.untyped_storage().resize_(q.numel() * q.element_size())
                    q.data.zero_()
        self.present = set(range(len(self.params)))

    def release(self) -> None:
        """Free every parameter whose tensor this member does not hold."""
        for t in range(len(self.params)):
            self._free(t)

    # ---- the step ------------------------------------------------------------------------------

    def begin(self, group: Group, should_abort: Callable[[], bool]) -> None:
        """A step over ``group`` starts: gathers wait on ``should_abort``; free what is not held."""
        self._group, self._abort = group, should_abort
        self.release()

    @contextmanager
    def round(self) -> Iterator[None]:
        """One chunk's forward and backward run inside: the root unit is gathered first; at the
        end the rest of the schedule is gathered (and freed) and every parameter not held is
        freed. An exception leaves the parameters as they are (``whole`` comes next)."""
        self._active, self._cursor = True, 0
        try:
            for entry in self.schedule:
                if entry[0] == "root":
                    self._advance(entry)
            yield
            for entry in self.schedule[self._cursor:]:
                self._gather(entry[1])
                self._free_unit(entry[1])
            self._cursor = len(self.schedule)
            self.release()
        finally:
            self._active = False

    def phantom(self) -> None:
        """A round without a chunk: the busiest member's gathers, nothing computed."""
        with self.round():
            pass

    # ---- hooks ---------------------------------------------------------------------------------

    def _on_forward(self, k: int, module: nn.Module, args) -> None:
        if self._active:
            self._advance(("forward", k))

    def _after_forward(self, k: int, module: nn.Module, args, output) -> None:
        if self._active:
            self._free_unit(k)

    def _on_backward(self, k: int, module: nn.Module, grad_output) -> None:
        if self._active:
            self._advance(("backward", k))

    def _after_grad(self, t: int, param: torch.Tensor) -> None:
        if self._active:
            self._free(t)

    # ---- gather and free -----------------------------------------------------------------------

    def _advance(self, entry: Entry) -> None:
        """Gather the unit of ``entry``, the next step of the schedule (or refuse the model)."""
        expected = self.schedule[self._cursor] if self._cursor < len(self.schedule) else None
        if entry != expected:
            order = ", ".join(self.units[k].name for kind, k in self.schedule
                              if kind == "forward")
            raise ConfigError(
                f"shard_level 3 gathers the units in a fixed order (forward: {order}; backward: "
                f"the reverse), but unit {self.units[entry[1]].name or '(root)'} ran its "
                f"{entry[0]} out of it: a unit called twice, skipped, or recomputed in backward "
                "is not supported at level 3")
        self._cursor += 1
        self._gather(entry[1])

    def _gather(self, k: int) -> None:
        """Give every member unit ``k``'s parameters: each tensor that not every member owns
        is broadcast from its primary (one flat buffer per primary) and written into the
        members where it is freed, as bits."""
        group = self._group
        if group is None or group.pg is None or group.size == 1:
            return
        owners = self.shards.owner_ranks
        by_rank: dict[int, list[int]] = {}
        for t in self.units[k].tensors:
            if len(owners[t]) < group.size:
                by_rank.setdefault(owners[t][0], []).append(t)
        works, flats = [], []
        for rank in sorted(by_rank):
            tensors = by_rank[rank]
            flat = torch.empty(sum(self.params[t].numel() for t in tensors),
                               dtype=self.params[tensors[0]].dtype, device=group.device)
            if rank == group.rank:
                torch.cat([self.params[t].detach().reshape(-1) for t in tensors], out=flat)
            works.append(group.broadcast_async(flat, rank))
            flats.append((tensors, flat))
        for work in works:
            group.wait(work, self._abort)
        with torch.no_grad():
            for tensors, flat in flats:
                offset = 0
                for t in tensors:
                    q = self.params[t]
                    if t not in self.present:
                        self.fill(t, flat[offset : offset + q.numel()].view(q.shape))
                    offset += q.numel()

    def fill(self, t: int, value: torch.Tensor) -> None:
        """Write ``value``'s bits into parameter ``t``, allocating it again if it is freed."""
        q = self.params[t]
        with torch.no_grad():
            if t not in self.present:
                q.untyped_storage().resize_(q.numel() * q.element_size())
            q.data.copy_(value)
        self.present.add(t)

    def _free_unit(self, k: int) -> None:
        for t in self.units[k].tensors:
            self._free(t)

    def _free(self, t: int) -> None:
        """Free parameter ``t``'s storage unless this member holds its tensor."""
        if t in self.present and t not in self.shards.held:
            self.params[t].untyped_storage().resize_(0)
            self.present.discard(t)
