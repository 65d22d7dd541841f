"""Pure: who owns which whole tensor of a sharded model, and what moves when members change.

Sharded data parallelism (ZeRO-1/2/3, ``docs/architecture/sharding.md``) gives each tensor of
the model ``r`` owners (``redundancy``): they hold its optimizer state (and, by level, its reduced
gradient and its parameter) and run its optimizer step. A tensor is always owned whole, never
sliced, so the optimizer step over one member's share runs every element through the same kernel
code path as the step over the whole model: the sharded run stays bitwise the unsharded one.

``plan_ownership`` maps (the model's ordered tensors and their sizes, the ordered members, ``r``,
the level, and the previous plan if any) to a ``ShardPlan``:

- every tensor has ``min(r, N)`` distinct owners, the first of them its primary;
- the members' owned bytes are balanced: none holds more than its share, ``min(r, N) / N`` of
  the model's bytes, plus one tensor (copies placed round by round, largest tensor first, each
  to the member with the least load plus bytes shared with the tensor's other owners, which
  also spreads a member's tensors over many co-owners);
- it is deterministic (ties go by tensor index and member order), and
- where members have failure domains (``domains``: the host each runs on, say), a tensor's
  owners are in as many distinct domains as there can be (``min(r, N, domains)``), so that
  losing a whole domain (a host with several members) loses no tensor while ``r >= 2`` and
  there are two domains; balance yields to that rule where domains hold unequal numbers of
  members;
- it is stable: given the previous plan, every owner that stays keeps what it holds, unless it
  is more than the largest tensor off its new share; the copies that lost an owner go to the
  least loaded members, and a member far above its share hands tensors straight to one far
  below (a joiner), never more than its excess. A join therefore moves about the joiner's
  share (``r / N`` of the bytes), a leave or crash about the leaver's, plus about one tensor
  (``tests/test_shardplan.py`` checks both over random models and membership histories).

``diff_plans`` says which tensor goes from which holder to which new owner; ``group_units``
groups tensors into the units that ZeRO-3 gathers together (one per transformer block).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


class ShardLevel(enum.IntEnum):
    """What the members shard, in ZeRO's levels; each level shards what the one below does."""

    NONE = 0  # every member holds everything: today's replicated data parallelism
    OPTIMIZER = 1  # ZeRO-1: optimizer state
    GRADIENTS = 2  # ZeRO-2: + the reduced gradients
    PARAMETERS = 3  # ZeRO-3: + the parameters, gathered per unit for forward and backward

    @property
    def shards_optimizer(self) -> bool:
        return self >= ShardLevel.OPTIMIZER

    @property
    def shards_gradients(self) -> bool:
        return self >= ShardLevel.GRADIENTS

    @property
    def shards_parameters(self) -> bool:
        return self >= ShardLevel.PARAMETERS


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the model, in the model's order: its name and its size in bytes."""

    name: str
    nbytes: int


@dataclass(frozen=True)
class ShardPlan:
    """Who owns which tensor: ``owners[i]`` are tensor ``i``'s owners, its primary first.

    With ``ShardLevel.NONE`` every member owns every tensor.
    """

    level: ShardLevel
    redundancy: int
    members: tuple[str, ...]
    tensors: tuple[TensorSpec, ...]
    owners: tuple[tuple[str, ...], ...]

    @property
    def copies(self) -> int:
        """Owners per tensor: ``min(redundancy, N)``, or N when nothing is sharded."""
        return len(self.members) if self.level is ShardLevel.NONE else min(
            self.redundancy, len(self.members))

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def owned_by(self, member: str) -> list[int]:
        """The indices of the tensors ``member`` owns, in model order."""
        return [i for i, owners in enumerate(self.owners) if member in owners]

    def load(self, member: str) -> int:
        """The bytes of the tensors ``member`` owns."""
        return sum(self.tensors[i].nbytes for i in self.owned_by(member))

    def loads(self) -> dict[str, int]:
        """Every member's owned bytes, in member order."""
        return _loads(self.members, self.tensors, self.owners)

    def share(self) -> float:
        """A member's fair share of the owned bytes: ``copies / N`` of the model's bytes."""
        return self.copies * self.total_bytes / len(self.members)

    def lost(self, crashed: Collection[str]) -> list[int]:
        """The tensors that no member outside ``crashed`` holds (restore them from a
        checkpoint); empty whenever fewer than ``copies`` members crashed."""
        gone = set(crashed)
        return [i for i, owners in enumerate(self.owners) if gone.issuperset(owners)]


@dataclass(frozen=True)
class Move:
    """One tensor copy that a new owner must receive: from ``source``, an old holder that can
    still send it, or from the newest checkpoint where ``source`` is None (no holder is left)."""

    tensor: int
    name: str
    nbytes: int
    source: str | None
    target: str


@dataclass(frozen=True)
class PlanDiff:
    """What changes between two plans: the copies to send and the copies a member may drop."""

    moves: tuple[Move, ...]
    dropped: tuple[tuple[int, str], ...]  # (tensor, member): held before, not owned now

    @property
    def bytes_moved(self) -> int:
        """Bytes sent member to member (not counting what comes from a checkpoint)."""
        return sum(m.nbytes for m in self.moves if m.source is not None)

    @property
    def lost(self) -> tuple[Move, ...]:
        """The copies that no surviving holder can send: they come from a checkpoint."""
        return tuple(m for m in self.moves if m.source is None)

    def sent_by(self, member: str) -> int:
        """Bytes ``member`` sends."""
        return sum(m.nbytes for m in self.moves if m.source == member)

    def received_by(self, member: str) -> int:
        """Bytes ``member`` receives."""
        return sum(m.nbytes for m in self.moves if m.target == member)


@dataclass(frozen=True)
class Unit:
    """Tensors that ZeRO-3 gathers together, e.g. one transformer block (``name`` is the module
    path; ``""`` is the root unit: everything outside the blocks)."""

    name: str
    tensors: tuple[int, ...]


def plan_ownership(tensors: Sequence[TensorSpec | tuple[str, int]], members: Sequence[str],
                   redundancy: int, level: ShardLevel | int,
                   previous: ShardPlan | None = None,
                   domains: Mapping[str, str] | None = None) -> ShardPlan:
    """The ownership plan of ``tensors`` among ``members`` (see the module's description).

    Args:
        tensors: The model's tensors in a fixed order (e.g. ``named_parameters``), as
            ``TensorSpec`` or ``(name, nbytes)``; names must be unique.
        members: The members in a fixed order (the generation's); ids must be unique.
        redundancy: Owners per tensor (``r``, at least 1); a world of fewer than ``r`` members
            gives every tensor all of them.
        level: The ``ShardLevel`` (NONE: every member owns everything).
        previous: The plan of the previous membership, to keep what stays where it is; None
            plans from scratch.
        domains: Each member's failure domain (members that can fail together share one); a
            member not in it, or every member when None, is a domain of its own. A tensor's
            owners span ``min(r, N, number of domains)`` domains (a kept owner of the previous
            plan that a member of another domain should replace is replaced).

    Returns:
        The plan; the same arguments give the same plan.

    Raises:
        ValueError: No members, a duplicate name or member, ``redundancy`` below 1, a negative
            size, or a ``previous`` plan of other tensors, another level or another redundancy.
    """
    specs = tuple(t if isinstance(t, TensorSpec) else TensorSpec(*t) for t in tensors)
    members = tuple(members)
    level = ShardLevel(level)
    _check(specs, members, redundancy)
    if previous is not None and (previous.tensors != specs or previous.level is not level
                                 or previous.redundancy != redundancy):
        raise ValueError("the previous plan has other tensors, another level or another "
                         "redundancy: plan from scratch")
    if level is ShardLevel.NONE:
        return ShardPlan(level, redundancy, members, specs, tuple(members for _ in specs))
    copies = min(redundancy, len(members))
    order = {m: i for i, m in enumerate(members)}
    spread = {m: (domains or {}).get(m, f"\0{m}") for m in members}
    owners: list[list[str]] = [[] for _ in specs]
    if previous is not None:  # every owner that stays keeps its tensors
        owners = [_kept(held, order, copies, spread) for held in previous.owners]
    load = _loads(members, specs, owners)
    share = copies * sum(t.nbytes for t in specs) / len(members)
    _fill(specs, members, owners, load, copies, order, spread)
    _rebalance(specs, members, owners, load, share, order, spread)
    return ShardPlan(level, redundancy, members, specs, tuple(tuple(o) for o in owners))


def diff_plans(old: ShardPlan, new: ShardPlan, senders: Collection[str] | None = None) -> PlanDiff:
    """The copies that move from ``old`` to ``new``.

    Each new owner of a tensor that it did not hold receives it from one of the tensor's old
    holders that can send (``senders``), the one that has sent the fewest bytes so far (ties:
    old owner order), so that the sending is spread over the holders.

    Args:
        old: The plan before the membership change.
        new: The plan after it (same tensors, level and redundancy).
        senders: The members of ``old`` that can still send: all of them for joins and
            graceful leaves (a leaver hands over before it goes), the survivors after a crash.
            Default: every member of ``old``.

    Returns:
        The moves, in tensor order (a copy with no holder left comes from a checkpoint:
        ``source`` None), and the copies that members hold but no longer own.

    Raises:
        ValueError: The plans are of other tensors, levels or redundancies.
    """
    if old.tensors != new.tensors or old.level is not new.level:
        raise ValueError("plans of other tensors or another level cannot be compared")
    alive = set(old.members if senders is None else senders)
    sent: dict[str, int] = {}
    moves: list[Move] = []
    dropped: list[tuple[int, str]] = []
    for i, spec in enumerate(new.tensors):
        before, after = old.owners[i], new.owners[i]
        holders = [m for m in before if m in alive]
        for target in after:
            if target in before:
                continue
            source = min(holders, key=lambda m: (sent.get(m, 0), before.index(m)),
                         default=None)
            if source is not None:
                sent[source] = sent.get(source, 0) + spec.nbytes
            moves.append(Move(i, spec.name, spec.nbytes, source, target))
        dropped += [(i, m) for m in before if m not in after and m in new.members]
    return PlanDiff(tuple(moves), tuple(dropped))


def group_units(names: Sequence[str], prefixes: Sequence[str] | None = None) -> list[Unit]:
    """Group tensors into ZeRO-3 gathering units by module path.

    Args:
        names: The tensors' names in model order (``model.named_parameters()``).
        prefixes: The units' module paths (e.g. ``["blocks.0", "blocks.1"]``); a tensor goes to
            the longest prefix its name starts with (followed by a dot). None: every numbered
            child of a container is a unit (``blocks.3.attn.qkv.weight`` is in ``blocks.3``),
            found from the names alone.

    Returns:
        The root unit (``""``: every tensor in no other unit, e.g. embeddings and the final norm;
        left out when empty) first, then the units in the order of their first tensor.

    Raises:
        ValueError: A duplicate name or prefix, or a prefix that no tensor falls under.
    """
    if len(set(names)) != len(names):
        raise ValueError("tensor names must be unique")
    if prefixes is not None and len(set(prefixes)) != len(prefixes):
        raise ValueError("unit prefixes must be unique")
    by_unit: dict[str, list[int]] = {"": []}
    for i, name in enumerate(names):
        if prefixes is None:
            match = _NUMBERED.match(name)
            unit = match.group(1) if match else ""
        else:
            unit = max((p for p in prefixes if name.startswith(p + ".")), key=len, default="")
        by_unit.setdefault(unit, []).append(i)
    empty = [p for p in prefixes or () if p not in by_unit]
    if empty:
        raise ValueError(f"no tensor falls under unit {empty[0]!r}")
    return [Unit(name, tuple(idx)) for name, idx in by_unit.items() if idx]


# the shortest module path that ends in a number: the child of a container (ModuleList)
_NUMBERED = re.compile(r"^(.*?\.\d+)\.")


def _check(specs: tuple[TensorSpec, ...], members: tuple[str, ...], redundancy: int) -> None:
    if not members:
        raise ValueError("a plan needs at least one member")
    if len(set(members)) != len(members):
        raise ValueError("member ids must be unique")
    if redundancy < 1:
        raise ValueError(f"redundancy must be at least 1, got {redundancy}")
    if len({t.name for t in specs}) != len(specs):
        raise ValueError("tensor names must be unique")
    if any(t.nbytes < 0 for t in specs):
        raise ValueError("tensor sizes must not be negative")


def _kept(held: Sequence[str], order: dict[str, int], copies: int,
          spread: dict[str, str]) -> list[str]:
    """The owners of a tensor in the previous plan that keep it: those still members, up to
    ``copies``; a second one in a failure domain only where no other domain is left to take
    its place (the first of each domain first, then the others in their order)."""
    staying = [m for m in held if m in order]
    kept: list[str] = []
    for m in staying:
        if _elsewhere(m, kept, spread):
            kept.append(m)
    unused = set(spread.values()) - {spread[k] for k in kept}
    room = copies - len(kept) - len(unused)  # slots no new domain can fill
    kept += [m for m in staying if m not in kept][:max(0, room)]
    return kept[:copies]


def _elsewhere(candidate: str, others: Sequence[str], spread: dict[str, str] | None) -> bool:
    """Whether ``candidate`` is in another failure domain than every one of ``others`` (always,
    without ``spread``)."""
    return spread is None or all(spread[o] != spread[candidate] for o in others)


def _domains(owners: Sequence[str], spread: dict[str, str]) -> int:
    return len({spread[o] for o in owners})


def _rebalance(specs: tuple[TensorSpec, ...], members: tuple[str, ...],
               owners: list[list[str]], load: dict[str, int], share: float,
               order: dict[str, int], spread: dict[str, str] | None = None) -> None:
    """Hand tensors from members above their share straight to members below it, where some
    member is off its share by more than the largest tensor (a joiner, or one left short):
    most loaded donor first, its largest tensor first among those that keep it at or above its
    share, each to the least loaded member below its share that does not hold that tensor. A
    donor gives at most its excess, so a join moves about the joiner's share and no more; after
    a leave, whose copies the fill spread already, it rarely has anything to do. A move never
    leaves a tensor's owners in fewer failure domains (``spread``)."""
    slack = max((t.nbytes for t in specs), default=0)
    for m in sorted(members, key=lambda m: (-load[m], order[m])):
        held = sorted((i for i, o in enumerate(owners) if m in o),
                      key=lambda i: (-specs[i].nbytes, i))
        for i in held:
            size = specs[i].nbytes
            if not 0 < size <= load[m] - share:
                continue
            others = [o for o in owners[i] if o != m]
            target = min((u for u in members if u not in owners[i] and load[u] < share
                          and (spread is None or _domains([*others, u], spread)
                               >= _domains(owners[i], spread))),
                         key=lambda u: (load[u], order[u]), default=None)
            if target is None or (load[m] <= share + slack and load[target] >= share - slack):
                continue
            owners[i][owners[i].index(m)] = target
            load[m] -= size
            load[target] += size


def _fill(specs: tuple[TensorSpec, ...], members: tuple[str, ...], owners: list[list[str]],
          load: dict[str, int], copies: int, order: dict[str, int],
          spread: dict[str, str] | None = None) -> None:
    """Give every tensor its missing owners, one round per copy (first every tensor's first
    owner, then every tensor's second, ...), largest tensor first within a round. A copy goes to
    the member that does not hold the tensor with the least load plus bytes already shared with
    the tensor's other owners (ties: member order): that spreads a member's tensors over many
    different co-owners, so that a leaver's copies can go to many members at once, instead of
    always pairing the same members. With ``spread`` a member in a failure domain that holds
    none of the tensor's copies comes first, while there is one."""
    shared = {(a, b): 0 for a in members for b in members}
    for i, held in enumerate(owners):
        for a in held:
            for b in held:
                if a != b:
                    shared[a, b] += specs[i].nbytes
    by_size = sorted(range(len(specs)), key=lambda i: (-specs[i].nbytes, i))
    for round_ in range(copies):
        for i in by_size:
            if len(owners[i]) > round_:
                continue
            target = min((m for m in members if m not in owners[i]),
                         key=lambda m: (not _elsewhere(m, owners[i], spread),
                                        load[m] + sum(shared[o, m] for o in owners[i]),
                                        order[m]))
            for o in owners[i]:
                shared[o, target] += specs[i].nbytes
                shared[target, o] += specs[i].nbytes
            owners[i].append(target)
            load[target] += specs[i].nbytes


def _loads(members: Sequence[str], specs: Sequence[TensorSpec],
           owners: Sequence[Sequence[str]]) -> dict[str, int]:
    load = dict.fromkeys(members, 0)
    for spec, held in zip(specs, owners, strict=True):
        for m in held:
            load[m] += spec.nbytes
    return load
