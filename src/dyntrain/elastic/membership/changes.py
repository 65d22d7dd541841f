"""Membership changes, from request to the first step completed in the new world: the records
of ``events.jsonl``. Pure bookkeeping for the coordinator
(``dyntrain.elastic.membership.coordinator``).

A change is ``pending`` until a generation is published that includes it; then it awaits that
world's first completed step, when it is reported with its latency (request to first step).
Changes whose world never completed a step are reported with the next one that does. Several
changes that one re-formation takes in (two workers told to leave at once) are each reported
with their own world before and after, in the order they were requested: each starts from the
world the one before it left, and the last ends at the world formed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dyntrain.elastic.protocol import Generation
from dyntrain.elastic.runs.rows import EventKind, EventRow


@dataclass(eq=False)
class Change:
    """One membership change, from request to the first step completed in the new world."""

    kind: EventKind
    workers: list[str]
    requested_at: float
    detected_at: float
    world_before: int
    fields: dict = field(default_factory=dict)

    def moved(self) -> int:
        """How many workers this change adds to the world (negative: takes away)."""
        if self.kind in (EventKind.JOIN, EventKind.START, EventKind.RESUME):
            return len(self.workers)
        if self.kind is EventKind.REATTACH:
            return 0
        return -len(self.workers)

    def record(self, started_at: float) -> dict:
        """Its ``events.jsonl`` row (an ``EventRow``'s JSON object), times relative to
        ``started_at``; call once it completed a step in its new world."""
        f, t0 = dict(self.fields), started_at
        reformed, first = f.pop("reformed_at"), f.pop("first_step_at")
        return EventRow(
            kind=self.kind, workers=tuple(self.workers), world_before=self.world_before,
            world_after=f.pop("world_after", None), generation=f.pop("generation", None),
            start_step=f.pop("start_step", None), steps_redone=f.pop("steps_redone", 0),
            origin=f.pop("origin", None), reason=f.pop("reason", None),
            state_sync_s=f.pop("state_sync_s", None),
            group_connect_s=f.pop("group_connect_s", None),
            requested_at=round(self.requested_at - t0, 4),
            detected_at=round(self.detected_at - t0, 4), reformed_at=round(reformed - t0, 4),
            first_step_at=round(first - t0, 4), latency_s=round(first - self.requested_at, 4),
            extra={k: v for k, v in f.items() if not k.endswith("_at")}).to_json()


class ChangeLog:
    """The changes not reported yet: ``pending`` (folded into the next generation), ``awaiting``
    (published; reported at the new world's first step) and ``reattach`` (the rebuild after a
    restart, while it lasts)."""

    def __init__(self) -> None:
        self.pending: list[Change] = []
        self.awaiting: list[Change] = []
        self.reattach: Change | None = None

    def settled(self) -> bool:
        """Every change so far completed a step in its new world."""
        return not self.pending and not self.awaiting

    def add(self, change: Change) -> None:
        self.pending.append(change)

    def crash(self, worker: str, requested: float, now: float, world: int, reason: str) -> None:
        """A member was declared dead: the same failure (or a survivor's report of it) already
        pending takes it, so that one failure is one event."""
        crashes = [c for c in self.pending if c.kind is EventKind.CRASH]
        if crashes:
            change = crashes[0]
            change.workers.append(worker)
            change.requested_at = min(change.requested_at, requested)
            change.fields["reason"] = reason
        else:
            self.pending.append(Change(EventKind.CRASH, [worker], requested, now, world,
                                       {"reason": reason}))

    def removed(self, worker: str, now: float, world: int, why: str) -> None:
        """A worker was taken out of a generation that never stepped with it: a join it was
        part of never happened for it."""
        for change in self.pending + self.awaiting:
            if change.kind in (EventKind.JOIN, EventKind.START) and worker in change.workers:
                change.workers.remove(worker)
        self.pending = [c for c in self.pending if c.workers or c.kind is not EventKind.JOIN]
        self.awaiting = [c for c in self.awaiting if c.workers or c.kind is not EventKind.JOIN]
        self.pending.append(Change(EventKind.REMOVED, [worker], now, now, world,
                                   {"reason": why}))

    def published(self, gen: Generation, now: float, redone: int, origin: str) -> None:
        """Generation ``gen`` was published: every pending change (and every one whose world
        never completed a step) awaits its first step."""
        self.awaiting += self.pending
        self.pending = []
        for change in self.awaiting:
            change.fields.update(generation=gen.number, reformed_at=now,
                                 world_after=gen.world_size, start_step=gen.start_step,
                                 steps_redone=redone, origin=origin)
        # each from the world the one before it left, in the order they were asked for (and
        # are reported in): module doc
        self.awaiting.sort(key=lambda c: c.requested_at)
        for change, later in zip(self.awaiting, self.awaiting[1:], strict=False):
            change.fields["world_after"] = max(0, change.world_before + change.moved())
            later.world_before = change.fields["world_after"]

    def went_on(self, change: Change, gen: Generation, now: float) -> None:
        """After a re-attach, ``gen`` simply goes on: ``change`` awaits its next step."""
        change.fields.update(generation=gen.number, reformed_at=now, world_after=gen.world_size,
                             steps_redone=0, origin="members")
        self.awaiting.append(change)

    def stepped(self, at: float, extra: dict) -> list[Change]:
        """The current generation completed a step at ``at``: the changes now reported, with
        ``extra`` (the leader's ``state_sync_s``). A re-attached generation's rows from while
        its coordinator was away come first: they complete nothing."""
        due = [c for c in self.awaiting
               if c.kind is not EventKind.REATTACH or at >= c.fields["reformed_at"]]
        for change in due:
            change.fields["first_step_at"] = at
            change.fields.update(extra)
        self.awaiting = [c for c in self.awaiting if all(c is not d for d in due)]
        return due
