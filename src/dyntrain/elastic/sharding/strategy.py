"""The shard level, chosen once before the loop: a strategy per ``TrainConfig.shard_level``.

``sharding_for`` builds it from the config (and refuses what the level cannot shard exactly);
the trainer, the stepper and the run writer then ask it, never the level, what each step and
each generation does:

- what is reduced: the whole gradient, all-reduced (levels 0-1), or each chunk's gradient
  summed into its tensors' owners only (levels 2-3: ``step_rounds``);
- what is stepped: every tensor (level 0) or the owned ones (``before_step``);
- what is gathered: after a step the updated parameters from their primaries (levels 1-2:
  ``after_step``), at level 3 each unit's parameters within the step instead, and the whole
  model where it is read whole (``before_handover``, ``after_applied``);
- what is checkpointed: the whole state by the leader (level 0), or every member's share
  (``shares_checkpoints``);
- what moves on a change of members: the state hand-over (``handover_state``,
  ``checkpoint_keys``), then the owned optimizer state (and at level 3 the parameters) of
  every tensor whose owners change (``reshard``, ``hand_over``).

The mechanics live beside it: ``zero.OptimizerShards`` (owned optimizer state, re-sharding),
``gradients.GradientShards`` (the level-2 layout and rounds), ``parameters.ParamUnits`` (level 3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.reducer import Bucket
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.protocol import Generation
from dyntrain.elastic.runs.storage import RunStore
from dyntrain.elastic.sharding.gradients import GradientShards
from dyntrain.elastic.sharding.owners import ShardLevel
from dyntrain.elastic.sharding.parameters import ParamUnits
from dyntrain.elastic.sharding.zero import OptimizerShards, without_tensor_state
from dyntrain.errors import ConfigError

Abort = Callable[[], bool]


class Sharding(Protocol):
    """What a member shards; every method is a no-op where its level shards nothing of it."""

    level: ShardLevel
    #: every member writes its share of a checkpoint, and one by time is agreed in a step's tail
    shares_checkpoints: bool
    #: the owned optimizer state and its plan (``zero.OptimizerShards``); None: nothing sharded
    shards: OptimizerShards | None
    #: the parameters held and gathered per unit (level 3); None: every member holds them all
    units: ParamUnits | None

    def before_handover(self) -> None:
        """A generation starts: make what the state hand-over reads whole."""

    def handover_state(self, state: dict) -> dict:
        """What of ``state`` (``state.capture_state``) the holders broadcast to receivers."""

    def checkpoint_keys(self, gen: Generation, me: str) -> Callable[[str], bool] | None:
        """Which keys of ``gen``'s checkpoint this member loads (None: all of them)."""

    def reshard(self, group: Group, gen: Generation, me: str, should_abort: Abort,
                store: RunStore | None) -> str | None:
        """After the hand-over, move what the generation's new members must own; returns the
        line saying what no member holds any more (the generation resumes from a checkpoint)."""

    def settle_interrupted(self) -> int:
        """After an abandoned generation: 1 where its last step counts though it was torn."""

    def hand_over(self, group: Group, me: str, leaving: bool, leavers: int,
                  should_abort: Abort) -> None:
        """Before ``leavers`` members go: give the others what only leavers hold."""

    def lay_out(self, offsets: list[int], rank: int, size: int) -> list[int]:
        """Where each tensor's gradient starts in the flat buffer in this generation."""

    def step_rounds(self, group: Group, ring: bool, rounds: int | None,
                    should_abort: Abort) -> ShardedRounds | None:
        """The step's gradient sums chunk by chunk into their owners (None: the all-reduce)."""

    def before_step(self, scaler, unscaled: bool) -> None:
        """Before the optimizer step (``unscaled``: the scaler has unscaled the gradient)."""

    def after_step(self, group: Group, should_abort: Abort) -> None:
        """After the optimizer step: gather what a member must hold for the next one."""

    def after_applied(self, group: Group, gather: bool, validate: bool,
                      should_abort: Abort) -> None:
        """After an applied step: give the leader what a checkpoint (``gather``) or a
        validation (``validate``) reads whole."""

    def owned_state_bytes(self) -> int:
        """Bytes of tensor data in the optimizer state this member holds between steps."""


class ShardedRounds:
    """One step's gradient sums at levels 2-3: each chunk's gradient summed into its owners in a
    round of its own (``gradients.GradientShards``), at level 3 inside the gathers of the
    parameters (``parameters.ParamUnits``); a member with fewer chunks than the busiest adds
    zeros (and runs the gathers) for the rounds it lacks."""

    def __init__(self, shards: OptimizerShards, gradients: GradientShards,
                 units: ParamUnits | None, group: Group, rounds: int,
                 should_abort: Abort) -> None:
        self.shards, self.gradients, self.units = shards, gradients, units
        self.group, self.rounds, self.should_abort = group, rounds, should_abort
        gradients.begin(group, rounds)
        if units is not None:
            units.begin(group, should_abort)

    def gathered(self) -> contextlib.AbstractContextManager:
        """Around one chunk's forward and backward: its parameters gathered (level 3)."""
        return self.units.round() if self.units is not None else contextlib.nullcontext()

    def add(self, grads: torch.Tensor) -> None:
        """Sum one chunk's gradient (in ``grads``) into its owners."""
        self.gradients.add_round(self.group, grads, self.should_abort)

    def finish(self, grads: torch.Tensor, computed: int) -> None:
        """After this member's ``computed`` chunks: the busiest member's remaining rounds as
        zeros, then the owners' rounded sums into ``grads``."""
        for _ in range(self.rounds - computed):
            if self.units is not None:
                self.units.phantom()
            self.add(grads)
        self.gradients.finish(self.group, grads, self.should_abort)

    def primaries(self) -> list[int]:
        """The tensors whose term of the global norm this member sends (its primary ones)."""
        return self.shards.primary_of(self.gradients.rank)


class Replicated:
    """Level 0: every member holds, reduces and steps everything; the leader checkpoints the
    whole state."""

    level = ShardLevel.NONE
    shares_checkpoints = False
    shards = None
    units = None

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def before_handover(self) -> None:
        pass

    def handover_state(self, state: dict) -> dict:
        return state

    def checkpoint_keys(self, gen: Generation, me: str) -> None:
        return None

    def reshard(self, group: Group, gen: Generation, me: str, should_abort: Abort,
                store: RunStore | None) -> None:
        return None

    def settle_interrupted(self) -> int:
        return 0

    def hand_over(self, group: Group, me: str, leaving: bool, leavers: int,
                  should_abort: Abort) -> None:
        pass

    def lay_out(self, offsets: list[int], rank: int, size: int) -> list[int]:
        return offsets

    def step_rounds(self, group: Group, ring: bool, rounds: int | None,
                    should_abort: Abort) -> None:
        return None

    def before_step(self, scaler, unscaled: bool) -> None:
        pass

    def after_step(self, group: Group, should_abort: Abort) -> None:
        pass

    def after_applied(self, group: Group, gather: bool, validate: bool,
                      should_abort: Abort) -> None:
        pass

    def owned_state_bytes(self) -> int:
        return sum(v.numel() * v.element_size() for st in self.optimizer.state.values()
                   for v in st.values() if isinstance(v, torch.Tensor))


class OptimizerSharding:
    """Level 1 (ZeRO-1): each member steps only the tensors it owns (``zero.OptimizerShards``),
    whose optimizer state it alone holds; the gradient is all-reduced whole and the updated
    parameters travel from their primaries. A generation re-shards the state among its
    members; every member writes its share of a checkpoint."""

    level = ShardLevel.OPTIMIZER
    shares_checkpoints = True
    units: ParamUnits | None = None

    def __init__(self, shards: OptimizerShards) -> None:
        self.shards = shards

    def before_handover(self) -> None:
        pass

    def handover_state(self, state: dict) -> dict:
        return without_tensor_state(state)  # the holders' shards differ: re-sharded after

    def checkpoint_keys(self, gen: Generation, me: str) -> Callable[[str], bool]:
        return self.shards.checkpoint_keys(gen, me)

    def reshard(self, group: Group, gen: Generation, me: str, should_abort: Abort,
                store: RunStore | None) -> str | None:
        lost = self.shards.reshard(group, gen, me, should_abort)
        return self.shards.give_up(lost, store, me) if lost else None

    def settle_interrupted(self) -> int:
        return self.shards.settle_interrupted()  # a step torn by the parameters' broadcast

    def hand_over(self, group: Group, me: str, leaving: bool, leavers: int,
                  should_abort: Abort) -> None:
        self.shards.hand_over(group, me, leaving, leavers, should_abort)

    def lay_out(self, offsets: list[int], rank: int, size: int) -> list[int]:
        return offsets

    def step_rounds(self, group: Group, ring: bool, rounds: int | None,
                    should_abort: Abort) -> ShardedRounds | None:
        return None

    def before_step(self, scaler, unscaled: bool) -> None:
        if scaler is not None and not unscaled:
            scaler.unscale_(self.shards.optimizer)  # its overflow check sees the whole gradient
        self.shards.before_step()

    def after_step(self, group: Group, should_abort: Abort) -> None:
        self.shards.after_step(group, should_abort)

    def after_applied(self, group: Group, gather: bool, validate: bool,
                      should_abort: Abort) -> None:
        self.shards.after_applied(group, gather, validate, should_abort)

    def owned_state_bytes(self) -> int:
        return self.shards.owned_state_bytes()


class GradientSharding(OptimizerSharding):
    """Level 2 (ZeRO-2): also the reduced gradient, summed chunk by chunk into each tensor's
    owners only (``gradients.GradientShards``, its buckets laid out by primary owner); as level
    1 where every member owns every tensor (a world of at most ``shard_redundancy``)."""

    level = ShardLevel.GRADIENTS

    def __init__(self, shards: OptimizerShards, gradients: GradientShards) -> None:
        super().__init__(shards)
        self.gradients = gradients

    def lay_out(self, offsets: list[int], rank: int, size: int) -> list[int]:
        return self.gradients.arrange(self.shards.owner_ranks, rank, size)

    def step_rounds(self, group: Group, ring: bool, rounds: int | None,
                    should_abort: Abort) -> ShardedRounds | None:
        if not ring or rounds is None or self.shards.replicated:
            return None
        return ShardedRounds(self.shards, self.gradients, self.units, group, rounds,
                             should_abort)


class ParameterSharding(GradientSharding):
    """Level 3 (ZeRO-3): also the parameters, each member keeping those of its owned tensors
    and gathering each unit's for its forward and backward (``parameters.ParamUnits``); the
    whole model is gathered only where it is read whole (the hand-over, a checkpoint, a
    validation)."""

    level = ShardLevel.PARAMETERS

    def __init__(self, shards: OptimizerShards, gradients: GradientShards,
                 units: ParamUnits) -> None:
        super().__init__(shards, gradients)
        self.units = units

    def before_handover(self) -> None:
        self.shards.whole()  # the hand-over and the re-sharding read the whole model


def sharding_for(config: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                 params: Sequence[torch.Tensor], buckets: Sequence[Bucket],
                 scaler=None) -> Sharding:
    """The member's strategy for ``config.shard_level``.

    Args:
        config: The run's settings (``shard_level``, ``shard_redundancy``).
        model: The model, for its parameters' names (and level 3's units).
        optimizer: The user's optimizer.
        params: The trainable parameters in the stepper's order.
        buckets: The stepper's gradient buckets (level 2 lays them out by owner).
        scaler: The run's loss scaler, if any (refused from level 2 on).

    Raises:
        ConfigError: The optimizer cannot be sharded exactly, a loss scaler from level 2 on,
            or parameters that level 3 cannot gather (``parameters.check_level_3``).
    """
    level = ShardLevel(config.shard_level)
    if level is ShardLevel.NONE:
        return Replicated(optimizer)
    if level.shards_gradients and scaler is not None:
        raise ConfigError(f"a loss scaler is not supported with shard_level "
                          f"{config.shard_level}: its overflow "
                          "check needs the whole reduced gradient, which no member holds (an "
                          "exact all-reduce of the check is not built); use shard_level 1, or "
                          "bf16 without a scaler")
    names = _names(model, params)
    shards = OptimizerShards(optimizer, params, names, config.shard_redundancy, level)
    if level is ShardLevel.OPTIMIZER:
        return OptimizerSharding(shards)
    gradients = GradientShards(buckets, [q.numel() for q in params])
    if level is ShardLevel.GRADIENTS:
        return GradientSharding(shards, gradients)
    shards.units = ParamUnits(model, params, names, shards)
    return ParameterSharding(shards, gradients, shards.units)


def _names(model: nn.Module, params: Sequence[torch.Tensor]) -> list[str]:
    names = {id(q): n for n, q in model.named_parameters()}
    return [names[id(q)] for q in params]

