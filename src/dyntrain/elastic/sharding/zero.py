"""ZeRO-1/2/3: the optimizer state sharded by whole tensors among a generation's members.

After the exact all-reduce every member holds the whole reduced gradient (and clips it by the
global norm: ``dyntrain.elastic.step.gradnorm``), but only the owners of a tensor
(``owners.plan_ownership``, ``r`` owners per tensor) hold its optimizer state and step it:
the other members' gradients of that tensor are set to None for the step, which every allowed
optimizer skips. Each updated parameter then travels as bits from its primary owner to every
member (one broadcast per primary, into buffers of the generation's group). Owning whole tensors
keeps every element of a tensor on the kernel path of the unsharded step, so the run is bitwise
the unsharded one for the optimizers that are elementwise within a tensor (``SHARDABLE``).

Re-sharding happens at the start of every generation, after the state hand-over: the members
all-reduce which tensors' state each holds (a 0/1 matrix, exact), derive the new plan from
that (stable: owners that stay keep their tensors), and the state of every tensor whose owners
change is sent by one holder to exactly its new owners, point to point
(``dyntrain.elastic.sharding.moves``). At levels 1-2 every member holds the same parameters already
(a receiver got them in the hand-over), unless a step was interrupted in the parameters'
broadcast: it counts where it was applied (``settle_interrupted``), and the member says in the
re-sharding's all-reduce that its parameters are stale; then every parameter is sent again
from a member that holds its state (at level 3 always: members hold only their own). A tensor
that no member holds any more (``r`` or more members crashed; with ``r = 1`` one crash) is
lost: the trainer then falls back to the newest checkpoint. A graceful leave loses nothing
even with ``r = 1``: right after the step in which it is agreed, the ending generation gives
the members that stay every tensor that only leavers hold (``hand_over``), then the leavers
go. Copies a member no longer owns are dropped after the generation's first applied step, once
every member has finished the re-sharding.

At level 2 the members also keep only the reduced gradients of the tensors they own: the
stepper sums each tensor's gradient into its owners only (``dyntrain.elastic.sharding.gradients``,
laid out from this plan's ``owner_ranks``); the rest of this module is the same at both levels. At
level 3 they keep only the parameters of the tensors they hold too
(``dyntrain.elastic.sharding.parameters``, ``units``): every owner steps its tensors, so no
parameter is sent after a step; the whole model is gathered only where it is read whole (the
re-sharding, a checkpoint, a validation).

Checkpoints on a local run folder are sharded: every member writes its share in torch's DCP
format and the leader commits the folder (``dyntrain.elastic.runs.dcp``). On an object store
they keep today's full format: before one, the primaries send their tensors' state to the
writer, which holds the whole optimizer state just for the write (``gather``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.transfer import broadcast_state
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.protocol import Generation
from dyntrain.elastic.runs.checkpoints import latest_valid_checkpoint
from dyntrain.elastic.runs.storage import RunStore
from dyntrain.elastic.sharding.moves import MoveStats, Payload, send_moves
from dyntrain.elastic.sharding.owners import (
    ShardLevel,
    ShardPlan,
    TensorSpec,
    diff_plans,
    plan_ownership,
)
from dyntrain.elastic.sharding.parameters import ParamUnits
from dyntrain.errors import ConfigError, DyntrainError

#: Optimizers whose step for one tensor reads only that tensor, its gradient and its own state
#: (and ``dyntrain.recipes.LARS``, whose trust ratio is per tensor); the exact types, not
#: subclasses (which may read across tensors).
SHARDABLE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def check_shardable(optimizer: torch.optim.Optimizer) -> None:
    """Refuse an optimizer that cannot be sharded by whole tensors exactly.

    Raises:
        ConfigError: ``optimizer`` is not one of ``SHARDABLE`` (one line, naming it).
    """
    # An optimizer is a LARS only where the recipes are loaded already: importing them here
    # would pull in what their extras install (a bare install's GPT job failed on it)
    recipes = sys.modules.get("dyntrain.recipes.optim")
    lars = (recipes.LARS,) if recipes is not None else ()
    if type(optimizer) not in (*SHARDABLE, *lars):
        raise ConfigError(f"optimizer {type(optimizer).__name__} cannot be sharded exactly; "
                          "shardable: SGD, Adam, AdamW, LARS; or shard_level 0")


def shards_for(config: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
               params: Sequence[torch.Tensor], scaler=None) -> OptimizerShards | None:
    """The member's ``OptimizerShards`` for ``config.shard_level`` 1 to 3, None at level 0.

    Args:
        config: The run's settings (``shard_level``, ``shard_redundancy``).
        model: The model, for its parameters' names.
        optimizer: The user's optimizer.
        params: The trainable parameters in the stepper's order.
        scaler: The run's loss scaler, if any (refused from level 2 on).

    Raises:
        ConfigError: The optimizer cannot be sharded exactly, a loss scaler from level 2 on,
            or parameters that level 3 cannot gather (``parameters.check_level_3``).
    """
    if not config.shard_level:
        return None
    if config.shard_level >= 2 and scaler is not None:
        raise ConfigError(f"a loss scaler is not supported with shard_level "
                          f"{config.shard_level}: its overflow "
                          "check needs the whole reduced gradient, which no member holds (an "
                          "exact all-reduce of the check is not built); use shard_level 1, or "
                          "bf16 without a scaler")
    names = {id(q): n for n, q in model.named_parameters()}
    shards = OptimizerShards(optimizer, params, [names[id(q)] for q in params],
                             config.shard_redundancy, config.shard_level)
    if config.shard_level >= 3:
        shards.units = ParamUnits(model, params, [names[id(q)] for q in params], shards)
    return shards


def lost_message(lost: Sequence[str], redundancy: int, checkpoint_step: int | None) -> str:
    """What a member says when no member holds the optimizer state of the tensors ``lost``:
    it resumes from the checkpoint of ``checkpoint_step`` (None: there is none)."""
    what = (f"lost the optimizer state of {len(lost)} tensor(s) ({', '.join(lost[:3])}"
            f"{', ...' if len(lost) > 3 else ''}) with the crashed member(s) "
            f"(shard_redundancy {redundancy})")
    if checkpoint_step is None:
        return f"{what}, and the run folder has no checkpoint to resume from"
    return f"{what}: resuming from the newest checkpoint (step {checkpoint_step})"


def checkpoint_due(config: TrainConfig, step: int, total_steps: int, all_leave: bool) -> bool:
    """Whether the leader checkpoints after ``step`` by steps, as every member can tell (they
    write their shares of it, or gather the optimizer state for it). A checkpoint by time is
    agreed in the step itself instead (``StepResult.checkpoint``: the leader's clock)."""
    every = config.checkpoint_every_steps
    return all_leave or step == total_steps or bool(every and step % every == 0)


def without_tensor_state(state: dict) -> dict:
    """``state`` (``state.capture_state``) with the optimizer's per-tensor state left out: what
    all members hold alike at level 1 (parameters, hyperparameters, RNG, scheduler, ...)."""
    optimizer = {**state["optimizer"], "state": {}}
    return {**state, "optimizer": optimizer}


class OptimizerShards:
    """This member's share of the optimizer state, and the collectives that keep it right.

    Args:
        optimizer: The user's optimizer (one of ``SHARDABLE``); its ``state`` holds only the
            tensors this member holds.
        params: The trainable parameters in the stepper's order (``ChunkStepper.params``).
        names: Their names, in the same order.
        redundancy: Owners per tensor (``TrainConfig.shard_redundancy``).
        level: The ``TrainConfig.shard_level`` (1 to 3; at 3 the caller sets ``units``).

    Raises:
        ConfigError: The optimizer cannot be sharded exactly.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                 names: Sequence[str], redundancy: int, level: int = 1) -> None:
        check_shardable(optimizer)
        self.optimizer, self.params, self.redundancy = optimizer, list(params), redundancy
        self.level = ShardLevel(level)
        self.specs = tuple(TensorSpec(n, q.numel() * q.element_size())
                           for n, q in zip(names, self.params, strict=True))
        # the tensors whose state this member holds, valid at the trainer's step (the whole
        # state to begin with: the fresh optimizer's, or a checkpoint's)
        self.held: set[int] = set(range(len(self.params)))
        self.plan: ShardPlan | None = None
        self.domains: dict[str, str] = {}  # each member's failure domain (host): see reshard
        self._loading: set[int] | None = None  # the tensors a resume loads: checkpoint_keys
        self.owned: set[int] = set(self.held)
        self._by_primary: list[list[int]] = []  # per rank: the tensors it is primary for
        self._sent: list[list[int]] = []  # of those, the ones not every member owns
        self.owner_ranks: list[tuple[int, ...]] = []  # per tensor: its owners' ranks, primary first
        self.torn = False  # a step applied here whose parameters did not all arrive
        self.units: ParamUnits | None = None  # level 3: the parameters held, gathered per unit
        # a torn step was settled here: some parameters may be older than the other members'
        # until a re-sharding sends them all again
        self.params_stale = False
        self.stats = MoveStats()  # what the last re-sharding (or hand-over) moved
        # parameters whose optimizer keeps ``step`` on their device (capturable or fused groups)
        self._step_on_device = {id(q) for g in optimizer.param_groups
                                if g.get("capturable") or g.get("fused") for q in g["params"]}

    # ---- what this member holds --------------------------------------------------------------

    def hold_all(self) -> None:
        """The optimizer holds the whole state (loaded from a checkpoint)."""
        self.held = set(range(len(self.params)))

    def checkpoint_keys(self, gen: Generation, me: str) -> Callable[[str], bool]:
        """For a generation that resumes from a checkpoint (``gen.checkpoint``): which of its
        keys this member loads (``checkpoints.read_ref``'s ``keep``): everything but the
        optimizer state of the tensors that the generation's plan, as ``reshard`` makes it
        when every member loaded the checkpoint, gives to other members only. So a member
        never holds the whole optimizer state on a resume; ``reshard`` then finds each tensor
        held by its owners. Call before loading, then ``reshard``."""
        plan = plan_ownership(self.specs, tuple(gen.members), self.redundancy, self.level,
                              None, gen.failure_domains())
        self._loading = set(plan.owned_by(me))
        index = {id(q): i for i, q in enumerate(q for g in self.optimizer.param_groups
                                                for q in g["params"])}
        skip = {str(index[id(self.params[t])]) for t in range(len(self.params))
                if t not in self._loading}
        return lambda key: not (key.startswith("optimizer.state.")
                                and key.split(".", 3)[2] in skip)

    def hold_none(self) -> None:
        """Forget every tensor's state (a receiver of the hand-over; a lost shard)."""
        self.optimizer.state.clear()
        self.held = set()

    def give_up(self, lost: Sequence[str], store: RunStore | None, worker: str) -> str:
        """No member holds the state of the tensors ``lost``: drop the rest, say so on the
        terminal and return the line (the generation resumes from the newest checkpoint).

        Raises:
            DyntrainError: The run folder has no checkpoint to resume from.
        """
        found = latest_valid_checkpoint(store) if store is not None else None
        what = lost_message(lost, self.redundancy, found and found[0])
        if found is None:
            raise DyntrainError(what)
        print(f"dyntrain: worker {worker}: {what}", file=sys.stderr, flush=True)
        self.hold_none()
        return what

    def primary_of(self, rank: int) -> list[int]:
        """The tensors whose primary owner is the member of ``rank`` in this generation's plan
        (each takes its tensors' terms of the global norm at levels 2-3: ``gradnorm``)."""
        return list(self._by_primary[rank])

    def owned_state_bytes(self) -> int:
        """Bytes of tensor data in the optimizer state of the tensors this member owns: what it
        holds between checkpoints (the writer holds all of it while it writes one)."""
        return sum(v.numel() * v.element_size() for t in self.owned
                   for v in self.optimizer.state.get(self.params[t], {}).values()
                   if isinstance(v, torch.Tensor))

    # ---- a generation's re-sharding ------------------------------------------------------------

    def reshard(self, group: Group, gen: Generation, me: str,
                should_abort: Callable[[], bool]) -> list[str]:
        """After the generation's state hand-over (a checkpoint's state, of its own tensors
        where ``checkpoint_keys`` chose them, or none for a receiver), plan the generation's
        ownership from what every member holds and move the state of the tensors whose owners
        change; returns the names of the tensors no member holds (nothing was changed then:
        the caller falls back to a checkpoint)."""
        self.stats = stats = MoveStats()
        if gen.checkpoint is not None:
            self.hold_all()
            if self._loading is not None:  # loaded the state of its own tensors only
                for t in self.held - self._loading:  # (a full-format file holds them all)
                    self.optimizer.state.pop(self.params[t], None)
                self.held = set(self._loading)
            self.params_stale = False  # every member loaded the checkpoint's parameters
        elif me in gen.receivers:
            self.hold_none()
            self.params_stale = False  # the hand-over's (a stale holder says so below)
        self._loading = None
        members = tuple(gen.members)
        self.domains = gen.failure_domains()  # no tensor's copies on one host, where possible
        count = len(self.params)
        began = time.perf_counter()
        holders, _, stale = self._survey(group, members, False, should_abort)
        stats.timed("survey", began)
        lost = [self.specs[t].name for t in range(count) if not holders[t]]
        if lost:
            return lost
        held = ShardPlan(self.level, self.redundancy, members, self.specs, holders)
        everywhere = all(len(h) == len(members) for h in holders)
        plan = self._replan(group, members, held, None if everywhere else held, me, False,
                            should_abort)
        if self.units is not None or stale:
            # every parameter from a member that holds its state (its parameter is of this
            # step even where the last step was interrupted: settle_interrupted). At levels
            # 1-2 only after a torn step: otherwise every member holds the same bits already
            # (a receiver got them in the hand-over)
            began = time.perf_counter()
            self._send_params(group, [[t for t in range(count) if holders[t][0] == m]
                                      for m in members], False, should_abort)
            stats.timed("params", began)
            stats.params_received_bytes += sum(
                self.specs[t].nbytes for t in range(count) if holders[t][0] != me)
            self.params_stale = False
        self.plan, self.owned = plan, set(plan.owned_by(me))
        self._by_primary = [[t for t in range(count) if plan.owners[t][0] == m]
                            for m in members]
        self.owner_ranks = [tuple(members.index(o) for o in plan.owners[t])
                            for t in range(count)]
        # a tensor every member owns is stepped by every member to the same bits: none is sent
        self._sent = [[t for t in ts if len(plan.owners[t]) < len(members)]
                      for ts in self._by_primary]
        return []

    @property
    def replicated(self) -> bool:
        """Every member owns every tensor (a world of at most ``r``): levels 2-3 then sum the
        gradient as level 1 does, and no parameter is sent after a step."""
        return not any(self._sent)

    def hand_over(self, group: Group, me: str, leaving: bool, leavers: int,
                  should_abort: Callable[[], bool]) -> None:
        """After the step in which ``leavers`` members (this one if ``leaving``) agreed to
        leave, before they go: give the members that stay the state (at level 3 also the
        parameter) of every tensor that only leavers hold, planned for the staying members from
        this generation's plan as ``reshard`` plans (their copies stay where they are); the
        next generation's re-sharding then finds every tensor held. Nothing when no member
        leaves, or all do (the leader checkpoints then: ``checkpoint_due``)."""
        members = self.plan.members if self.plan is not None else ()
        if not 0 < leavers < len(members):
            return
        self.stats = MoveStats()
        holders, leaving_members, _ = self._survey(group, members, leaving, should_abort)
        stayers = tuple(m for m in members if m not in leaving_members)
        if not stayers or all(set(h) - set(leaving_members) for h in holders):
            return  # every tensor is held by a member that stays
        held = ShardPlan(self.level, self.redundancy, members, self.specs, holders)
        self._replan(group, stayers, held, self.plan, me, self.units is not None, should_abort)

    def _survey(self, group: Group, members: tuple[str, ...], leaving: bool,
                should_abort: Callable[[], bool]) -> tuple[tuple[tuple[str, ...], ...],
                                                           tuple[str, ...], bool]:
        """Which members hold each tensor's state, which members leave (``leaving`` says
        this one does), and whether any member's parameters are stale (``params_stale``): one
        exact all-reduce of a 0/1 matrix, a row per member."""
        count = len(self.params)
        rows = torch.zeros(len(members), count + 2, dtype=torch.int32, device=group.device)
        if self.held:
            rows[group.rank, sorted(self.held)] = 1
        rows[group.rank, count] = int(leaving)
        rows[group.rank, count + 1] = int(self.params_stale)
        group.allreduce_sum(rows, should_abort)
        rows = rows.cpu()
        holders = tuple(tuple(members[m] for m in range(len(members)) if rows[m, t])
                        for t in range(count))
        return (holders, tuple(members[m] for m in range(len(members)) if rows[m, count]),
                bool(rows[:, count + 1].any()))

    def _replan(self, group: Group, owners: tuple[str, ...], held: ShardPlan,
                previous: ShardPlan | None, me: str, params: bool,
                should_abort: Callable[[], bool]) -> ShardPlan:
        """Plan the ownership among ``owners`` (from ``previous``, None: from scratch) and send
        each tensor that a new owner lacks from one of its holders (``held``, whose members
        are the group's) to that owner alone (``moves.send_moves``); ``params``: its parameter
        too. Returns the plan."""
        began = time.perf_counter()
        plan = plan_ownership(self.specs, owners, self.redundancy, self.level, previous,
                              self.domains)
        moves = diff_plans(held, plan).moves
        self.stats.timed("plan", began)
        began = time.perf_counter()

        def payload_of(t: int) -> Payload:
            return (self.optimizer.state.get(self.params[t], {}),
                    self.params[t].detach() if params else None)

        got = send_moves(group, held.members, moves, me, payload_of, should_abort, self.stats)
        for t, (state, param) in sorted(got.items()):
            if param is not None:
                self.units.fill(t, param)
            self._load(t, state, copy=False)
        self.stats.timed("moves", began)
        return plan

    def _load(self, t: int, state: dict, copy: bool = True) -> None:
        """Take tensor ``t``'s received state (``copy``: out of a transfer's buffers, which it
        does not own; else the tensors are its own); an empty one (a tensor not stepped yet) is
        left to the optimizer to create, as it would. Its tensors go to the parameter's device
        (small ones arrive on the CPU, in a transfer's pickled header) but a ``step`` that the
        optimizer keeps on the CPU (torch's rule: on the device when capturable or fused)."""
        q = self.params[t]
        if state:
            self.optimizer.state[q] = {k: self._placed(q, k, v, copy) for k, v in state.items()}
        self.held.add(t)

    def _placed(self, q: torch.Tensor, key: str, value, copy: bool):
        if not isinstance(value, torch.Tensor):
            return value
        on_cpu = key == "step" and id(q) not in self._step_on_device
        moved = value if on_cpu else value.to(q.device)
        return moved.clone() if copy and moved is value else moved

    # ---- one step ------------------------------------------------------------------------------

    def before_step(self) -> None:
        """Leave only the owned tensors' gradients for the optimizer (it skips the others)."""
        for t, q in enumerate(self.params):
            if t not in self.owned:
                q.grad = None

    def after_step(self, group: Group, should_abort: Callable[[], bool]) -> None:
        """Send every updated parameter from its primary owner to every member, as bits; then
        drop the copies this member no longer owns (every member has re-sharded by now). Until
        it returns the step is ``torn``: applied here, but not all parameters are in. At level 3
        every owner stepped its tensors' parameters: nothing is sent, the rest is freed."""
        if self.units is not None:
            if self.held != self.owned:
                self._keep_owned()
            self.units.release()
            return
        self.torn = True
        self._send_params(group, self._sent, True, should_abort)
        self.torn = False
        if self.held != self.owned:
            self._keep_owned()

    def settle_interrupted(self) -> int:
        """After a generation ended in ``after_step``: the step was applied to the tensors this
        member owns (state and parameter), so it counts (returns 1; else 0); the rest of its
        parameters may be old (``params_stale``), and the next re-sharding sends every
        parameter again from a member that holds its tensor's state."""
        if not self.torn:
            return 0
        self.torn, self.params_stale = False, True
        self._keep_owned()
        return 1

    def _keep_owned(self) -> None:
        for t in self.held - self.owned:
            self.optimizer.state.pop(self.params[t], None)
        self.held = set(self.owned)

    def _send_params(self, group: Group, by_rank: Sequence[Sequence[int]], keep: bool,
                     should_abort: Callable[[], bool]) -> None:
        """Overwrite every member's parameters ``by_rank[r]`` with rank ``r``'s, as bits; into
        the group's buffers first (``keep``: they stay there for the next step)."""
        if group.pg is None or group.size == 1:
            return
        works, flats = [], []
        for rank, tensors in enumerate(by_rank):
            if not tensors:
                continue
            key = f"zero1/params/{rank}"
            flat = group.buffers.get(key) if keep else None
            if flat is None:
                flat = torch.empty(sum(self.params[t].numel() for t in tensors),
                                   dtype=self.params[tensors[0]].dtype, device=group.device)
                if keep:
                    group.buffers[key] = flat
            if rank == group.rank:
                torch.cat([self.params[t].detach().reshape(-1) for t in tensors], out=flat)
            works.append(group.broadcast_async(flat, rank))
            flats.append((rank, tensors, flat))
        for work in works:
            group.wait(work, should_abort)
        with torch.no_grad():
            for rank, tensors, flat in flats:
                if rank == group.rank:
                    continue
                offset = 0
                for t in tensors:
                    q = self.params[t]
                    q.copy_(flat[offset : offset + q.numel()].view(q.shape))
                    offset += q.numel()

    # ---- checkpoints ---------------------------------------------------------------------------

    def whole(self) -> None:
        """At level 3, allocate every parameter again (a generation starts: the hand-over and
        the re-sharding read and write the whole model); nothing at levels 1-2."""
        if self.units is not None:
            self.units.whole()

    def after_applied(self, group: Group, checkpoint: bool, validate: bool,
                      should_abort: Callable[[], bool]) -> None:
        """After a step: for a ``checkpoint`` give the leader (rank 0) the whole optimizer
        state; at level 3, for a checkpoint or a ``validate`` (the leader's), give every member
        the whole model (the next step frees it again)."""
        if checkpoint:
            self.gather(group, 0, should_abort)
        if self.units is not None and (checkpoint or validate):
            self.units.whole()
            self._send_params(group, self._by_primary, False, should_abort)

    def gather(self, group: Group, root: int, should_abort: Callable[[], bool]) -> None:
        """Give the member of rank ``root`` the whole optimizer state (in the order an
        unsharded optimizer holds it), for a checkpoint; it drops the copies it does not
        own again after its next step."""
        for rank, tensors in enumerate(self._by_primary):
            if not tensors or rank == root:
                continue
            payload = None
            if group.rank == rank:
                payload = {"optimizer": {t: dict(self.optimizer.state.get(self.params[t], {}))
                                         for t in tensors}}
            got = broadcast_state(group, payload, rank, [rank], should_abort)["optimizer"]
            if group.rank == root:
                for t in tensors:
                    self._load(t, got[t])
        if group.rank == root:  # in the optimizer's order, as an unsharded step creates it
            state = self.optimizer.state
            ordered = [(q, state[q]) for g in self.optimizer.param_groups for q in g["params"]
                       if q in state]
            state.clear()
            state.update(ordered)
