"""Pure: parse ``--events`` specs and decide which injected events are due.

Syntax: events separated by ``,`` or ``;``; each is ``TRIGGER:ACTION``.

- TRIGGER: ``step=N`` (once the job has applied N steps) or ``t=SECONDS`` (after the job started).
- ACTION: ``join=K`` (start K more workers), ``leave=WHO`` (SIGTERM: a preemption notice; the
  worker finishes its step and leaves), ``kill=WHO`` (SIGKILL: a crash) or ``hang=WHO``
  (SIGSTOP: a host that stops answering; found by the heartbeat timeout, then killed).
- WHO: a count K (the K highest-ranked members), ``rank:R`` (the member at rank R), ``all``, or
  a worker id such as ``w2``.

Example: ``step=5:join=2,step=10:leave=1,step=15:kill=rank:0,t=30:join=1``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dyntrain.errors import ConfigError

_ITEM = re.compile(r"^(step|t)=([0-9]+(?:\.[0-9]+)?):(join|leave|kill|hang)=(.+)$")


@dataclass(frozen=True)
class Event:
    trigger: str  # "step" or "t"
    at: float
    action: str  # "join", "leave", "kill" or "hang"
    target: str  # count, "rank:R", "all" or a worker id
    text: str

    def due(self, step: int, elapsed: float) -> bool:
        return step >= self.at if self.trigger == "step" else elapsed >= self.at


def parse_events(spec: str | None) -> list[Event]:
    """Parse an events spec; raises ConfigError naming the bad item."""
    if not spec or not spec.strip():
        return []
    events = []
    for raw in re.split(r"[,;]", spec):
        item = raw.strip().replace(" ", "")
        if not item:
            continue
        m = _ITEM.match(item)
        if m is None:
            raise ConfigError(
                f"bad event {item!r}: expected TRIGGER:ACTION such as step=5:join=2, "
                "t=3.5:leave=1 or step=9:kill=rank:0"
            )
        trigger, at, action, target = m.groups()
        if trigger == "step" and "." in at:
            raise ConfigError(f"bad event {item!r}: a step must be a whole number")
        if action == "join" and (not _is_count(target) or int(target) < 1):
            raise ConfigError(f"bad event {item!r}: join takes a positive count")
        if action != "join" and not _valid_target(target):
            raise ConfigError(
                f"bad event {item!r}: say who leaves with a count, rank:R, all or a worker id"
            )
        events.append(Event(trigger, float(at), action, target, item))
    return events


def _is_count(text: str) -> bool:
    return re.fullmatch(r"[0-9]+", text) is not None


def _valid_target(target: str) -> bool:
    if _is_count(target):
        return int(target) >= 1
    if target.startswith("rank:"):
        return _is_count(target[5:])
    return target == "all" or re.fullmatch(r"[A-Za-z0-9_.-]+", target) is not None


def choose_targets(target: str, members: Sequence[str]) -> list[str]:
    """The members an event's WHO names, given the current members in rank order."""
    if target == "all":
        return list(members)
    if _is_count(target):
        count = int(target)
        return list(members[-count:]) if count <= len(members) else list(members)
    if target.startswith("rank:"):
        rank = int(target[5:])
        return [members[rank]] if rank < len(members) else []
    return [target] if target in members else []


class EventSchedule:
    """Hands out each event once, in the given order, when it is due."""

    def __init__(self, events: Sequence[Event]) -> None:
        self._pending = list(events)

    def pop_next(self, step: int, elapsed: float) -> Event | None:
        """The next event if it is due; events never overtake each other."""
        if self._pending and self._pending[0].due(step, elapsed):
            return self._pending.pop(0)
        return None

    def skip_fired(self, fired: Sequence[str]) -> list[Event]:
        """Drop the events that an earlier launch of the same run already fired and return them.

        ``fired`` holds the texts of the events fired before, in firing order. Events fire in
        order, so they are a prefix of the schedule; the matching prefix is dropped (a different
        schedule matches no prefix and is kept whole)."""
        skipped = []
        for text in fired:
            if not self._pending or self._pending[0].text != text:
                break
            skipped.append(self._pending.pop(0))
        return skipped

    @property
    def pending(self) -> list[Event]:
        return list(self._pending)

    def can_add_workers(self, step: int) -> bool:
        """Whether a pending join can still fire if the job makes no more progress."""
        for event in self._pending:
            if event.trigger == "step" and event.at > step:
                return False  # events fire in order: this one waits for progress
            if event.action == "join":
                return True
        return False


def parse_workers(text: str, flag: str = "--workers") -> tuple[int, int]:
    """``MIN:MAX`` or ``N`` (= N:N), as ``dyntrain run`` and ``dyntrain submit`` take it."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{flag} must be MIN:MAX (e.g. 1:4), got {text!r}") from None
    if not 1 <= low <= high:
        raise ConfigError(f"{flag} MIN:MAX needs 1 <= MIN <= MAX, got {text!r}")
    return low, high
