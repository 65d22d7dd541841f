"""Fair-share scheduling, as AWS Batch's fair-share scheduling policies define it: pure values
and functions, no state of the service.

A ``FairsharePolicy`` (AWS's ``fairsharePolicy``) on a job queue divides the queue between
share identifiers (teams, users). Every job of such a queue carries a ``shareIdentifier``, and:

* **Weights.** A share's ``weightFactor`` (default 1.0, ``0.0001``-``999.9999``) is AWS's: a
  *lower* factor gets *more*: a share of factor 0.125 gets 8 times the slots of one of factor 1.
  Its weight is ``1 / weightFactor``; an entry ending in ``*`` covers every identifier with that
  prefix (the longest prefix wins; entries may not overlap).
* **Entitlement.** The active shares (those with a job queued or running) divide the slots the
  queue may use: each is entitled to ``weight / sum of active weights`` of them.
* **Compute reservation.** ``computeReservation`` (0-99) keeps slots for shares that are not
  active yet: with ``n`` active shares, ``(computeReservation / 100) ** n`` of the slots are
  reserved (50 and one active share: half; two: a quarter). A job of an inactive share may use
  them; jobs of active shares may not.
* **Usage decay.** What a share used fades with ``shareDecaySeconds`` (0: AWS's minimum window,
  600 s): ``ShareUsage`` keeps each share's slots averaged exponentially over that window. A
  share's load is the larger of the slots it holds now and that average, over its weight;
  admission takes the next job from the share of least load (``fair_order``), so a share that
  just used much waits behind one that did not.
* **Priority within a share.** ``schedulingPriority`` (0-9999, the job definition's, or the
  job's ``schedulingPriorityOverride``) orders a share's jobs, higher first, then first in,
  first out; it never orders jobs of different shares.

The allocation policy that shares a fair-share queue's slots between running elastic jobs
(``fairshare``, growth and taking slots back by shrinking) is ``core/fairshare_alloc.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dyntrain.service.core.model import ValidationError

if TYPE_CHECKING:
    from dyntrain.service.core.plan import JobView

DEFAULT_WINDOW_S = 600.0  # shareDecaySeconds 0: AWS's minimum time window
MAX_DECAY_S = 604800  # one week
MAX_SHARES = 500
MAX_PRIORITY = 9999
_IDENTIFIER = re.compile(r"^[A-Za-z0-9]{1,255}\*?$")


@dataclass(frozen=True, slots=True)
class ShareAttributes:
    """One entry of ``shareDistribution``: an identifier (or a prefix ending in ``*``) and its
    weight factor."""

    identifier: str
    weight_factor: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.identifier, str) or not _IDENTIFIER.match(self.identifier):
            raise ValidationError(f"shareIdentifier {self.identifier!r} must be 1-255 letters or "
                                  "digits, optionally followed by *")
        if not 0.0001 <= self.weight_factor <= 999.9999:
            raise ValidationError(f"weightFactor of share {self.identifier} must be between "
                                  f"0.0001 and 999.9999, got {self.weight_factor}")

    @property
    def is_prefix(self) -> bool:
        return self.identifier.endswith("*")


@dataclass(frozen=True, slots=True)
class FairsharePolicy:
    """A fair-share scheduling policy (module doc), checked with AWS's ranges."""

    share_decay_seconds: int = 0
    compute_reservation: int = 0
    shares: tuple[ShareAttributes, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "shares", tuple(self.shares))
        if not 0 <= self.share_decay_seconds <= MAX_DECAY_S:
            raise ValidationError(f"shareDecaySeconds must be between 0 and {MAX_DECAY_S}, got "
                                  f"{self.share_decay_seconds}")
        if not 0 <= self.compute_reservation <= 99:
            raise ValidationError(f"computeReservation must be between 0 and 99, got "
                                  f"{self.compute_reservation}")
        if len(self.shares) > MAX_SHARES:
            raise ValidationError(f"shareDistribution takes at most {MAX_SHARES} entries, got "
                                  f"{len(self.shares)}")
        for i, a in enumerate(self.shares):
            for b in self.shares[i + 1:]:
                if _overlap(a, b):
                    raise ValidationError(f"shareDistribution: shareIdentifier {a.identifier} "
                                          f"overlaps {b.identifier}")

    @property
    def window_s(self) -> float:
        """The time constant usage decays with."""
        return float(self.share_decay_seconds or DEFAULT_WINDOW_S)

    def weight_factor(self, share: str) -> float:
        """The weight factor of ``share``: its entry, else the longest prefix entry, else 1."""
        best: tuple[int, float] | None = None
        for a in self.shares:
            if a.identifier == share:
                return a.weight_factor
            if a.is_prefix and share.startswith(a.identifier[:-1]):
                if best is None or len(a.identifier) > best[0]:
                    best = (len(a.identifier), a.weight_factor)
        return best[1] if best is not None else 1.0

    def weight(self, share: str) -> float:
        """What ``share`` gets relative to others: ``1 / weightFactor``."""
        return 1.0 / self.weight_factor(share)

    def reserved_fraction(self, active: int) -> float:
        """The part of the slots kept for shares not active yet, with ``active`` shares active
        (none reserved when no share is active: the first one takes what it needs)."""
        if active <= 0 or self.compute_reservation == 0:
            return 0.0
        return (self.compute_reservation / 100.0) ** active


def _overlap(a: ShareAttributes, b: ShareAttributes) -> bool:
    if a.identifier == b.identifier:
        return True
    for p, q in ((a, b), (b, a)):
        if p.is_prefix and q.identifier.rstrip("*").startswith(p.identifier[:-1]):
            return True
    return False


def check_share_identifier(share: str) -> str:
    """A job's ``shareIdentifier``: 1-255 letters or digits (no ``*``)."""
    if not isinstance(share, str) or not re.fullmatch(r"[A-Za-z0-9]{1,255}", share):
        raise ValidationError(f"shareIdentifier {share!r} must be 1-255 letters or digits")
    return share


def check_priority(value: int, what: str = "schedulingPriority") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        raise ValidationError(f"{what} must be an integer between 0 and {MAX_PRIORITY}, got "
                              f"{value!r}")
    return value


def entitlements(policy: FairsharePolicy, active: Iterable[str], slots: float
                 ) -> dict[str, float]:
    """Slots each active share is entitled to out of ``slots``, after the compute
    reservation."""
    shares = sorted(set(active))
    if not shares:
        return {}
    usable = slots * (1.0 - policy.reserved_fraction(len(shares)))
    weights = {s: policy.weight(s) for s in shares}
    total = sum(weights.values())
    return {s: usable * w / total for s, w in weights.items()}


def load(policy: FairsharePolicy, share: str, held: float, usage: float) -> float:
    """How much ``share`` has had, relative to its weight (module doc: Usage decay)."""
    return max(held, usage) / policy.weight(share)


def fair_order(jobs: Sequence[JobView], policy: FairsharePolicy, held: Mapping[str, int],
               usage: Mapping[str, float]) -> list[JobView]:
    """A fair-share queue's RUNNABLE jobs in the order to admit them: each next job comes from
    the share of least load, counting the jobs placed before it at their min workers; within
    a share by scheduling priority (higher first), then first in, first out."""
    by_share: dict[str, list[JobView]] = {}
    for job in jobs:
        by_share.setdefault(job.share or "", []).append(job)
    for queued in by_share.values():
        queued.sort(key=lambda j: (-j.scheduling_priority, j.created, j.id), reverse=True)
    taken = {s: float(held.get(s, 0)) for s in by_share}
    out: list[JobView] = []
    while by_share:
        share = min(by_share, key=lambda s: (load(policy, s, taken[s], usage.get(s, 0.0)), s))
        job = by_share[share].pop()
        out.append(job)
        taken[share] += job.min_workers
        if not by_share[share]:
            del by_share[share]
    return out


@dataclass
class ShareUsage:
    """Each share's slots averaged exponentially over its queue's window (module doc): the
    controller and the simulator feed it the slots shares hold, pass by pass."""

    averages: dict[str, float] = field(default_factory=dict)
    at: float | None = None

    def update(self, now: float, held: Mapping[str, int], window_s: Mapping[str, float]
               ) -> dict[str, float]:
        """Advance to ``now`` with ``held`` (share -> slots held since the last update);
        ``window_s``: share -> its time constant (``DEFAULT_WINDOW_S`` when missing)."""
        dt = 0.0 if self.at is None else max(0.0, now - self.at)
        self.at = now
        for share in set(self.averages) | set(held):
            tau = window_s.get(share, DEFAULT_WINDOW_S)
            keep = math.exp(-dt / tau) if tau > 0 else 0.0
            value = self.averages.get(share, 0.0) * keep + held.get(share, 0) * (1.0 - keep)
            if value < 1e-6 and share not in held:
                self.averages.pop(share, None)
            else:
                self.averages[share] = value
        return dict(self.averages)


def check_share(queue: str, policy: str | None, share: str | None,
                priority: int | None) -> None:
    """A job's share identifier and scheduling priority against its queue: a queue with a
    fair-share policy (``policy``) needs a share identifier, a first in, first out one refuses
    it (AWS Batch's rules)."""
    if share is not None:
        check_share_identifier(share)
    if priority is not None:
        check_priority(priority, "schedulingPriority")
    if policy is not None and share is None:
        raise ValidationError(f"job queue {queue} has a fair share scheduling policy "
                              f"({policy}): the job needs a shareIdentifier")
    if policy is None and share is not None:
        raise ValidationError(f"job queue {queue} has no fair share scheduling policy: a job "
                              "submitted to it cannot have a shareIdentifier")
