"""A generation's state hand-over, before its first step: every member ends holding the training
state of the generation's start step.

A generation that resumes from a checkpoint (``Generation.checkpoint``) loads it on every member
(sharded: only the optimizer state of the member's own tensors, ``Sharding.checkpoint_keys``).
One that takes in receivers (joiners; everyone on a fresh start) has the members that hold the
state broadcast it from the generation's source (``collective.transfer.broadcast_state``;
sharded: without the optimizer's per-tensor state, which the re-sharding moves after,
``Sharding.handover_state``). Otherwise every member keeps the state it holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.transfer import broadcast_state
from dyntrain.elastic.runs.checkpoints import read_ref
from dyntrain.elastic.sharding.strategy import Sharding
from dyntrain.elastic.state import TrainingParts, capture_state, restore_state


@dataclass(frozen=True)
class HandedOver:
    """What a member holds after the hand-over."""

    step: int  # the step of the state it holds now
    seconds: float | None  # how long the broadcast took; None: loaded from a checkpoint


def hand_over_state(gen: p.Generation, group: Group, parts: TrainingParts, sharding: Sharding,
                    me: str, step: int, steps_per_epoch: int,
                    should_abort: Callable[[], bool]) -> HandedOver | None:
    """Hand ``gen``'s state over to member ``me``, which holds the state of ``step`` (or none,
    as a receiver), in ``parts``; None where nothing is handed over (every member holds it)."""
    if gen.checkpoint is not None:
        keep = sharding.checkpoint_keys(gen, me)
        return HandedOver(restore_state(parts, read_ref(gen.checkpoint, keep)), None)
    if not (gen.receivers or gen.fresh):
        return None
    began = time.perf_counter()
    holders = [gen.rank_of(w) for w in gen.members if w not in gen.receivers]
    holding = me not in gen.receivers
    state = (sharding.handover_state(capture_state(parts, step, steps_per_epoch))
             if holding else None)
    state = broadcast_state(group, state, gen.rank_of(gen.source), holders, should_abort)
    return HandedOver(step if holding else restore_state(parts, state),
                      time.perf_counter() - began)
