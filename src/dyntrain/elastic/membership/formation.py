"""Generations that end before their first step: who is unreachable, when to try again, when to
stop trying. Pure bookkeeping for the coordinator (``dyntrain.elastic.membership.coordinator``).

A generation whose members report that they cannot reach a peer
(``dyntrain.elastic.collective.reach``) ends with that peer removed and told why. One whose group
fails to form for another reason, with no member dead or gone to explain it, counts as a failed
formation: the next attempt waits (0, then 0.25 s, doubling to 8 s), and after ``attempts`` in a
row the members that were not in the last generation that trained are removed with the error (they
are the change that broke it), or, when there are none, the job fails with it. A generation that
completes a step starts the count again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dyntrain.elastic.collective.reach import unreachable_members
from dyntrain.elastic.protocol import Ready, ReadyReason

FIRST_BACKOFF = 0.25
MAX_BACKOFF = 8.0
ATTEMPTS = 6
FIX = ("start it with --advertise-address ADDRESS or --iface NAME, an address its peers can "
       "reach")


@dataclass
class Verdict:
    """What the coordinator does once an ended generation's members have all reported."""

    remove: dict[str, str] = field(default_factory=dict)  # worker -> why (told to the worker)
    fail: str | None = None  # the job ends with this error
    log: list[str] = field(default_factory=list)


class Formation:
    """Watches generations from publication to their first completed step.

    Args:
        attempts: failed formations in a row before giving up on the newcomers (or the job).
    """

    def __init__(self, attempts: int = ATTEMPTS) -> None:
        self.attempts = attempts
        self.trained: tuple[str, ...] = ()  # members of the last generation that completed a step
        self.failures = 0  # failed formations in a row
        self.not_before = 0.0  # no new generation before this time (backoff)
        self._gen: int | None = None
        self._members: tuple[str, ...] = ()
        self._stepped = self._explained = self._concluded = False
        self._errors: dict[str, str] = {}
        self._unreachable: dict[str, list[dict]] = {}
        self._advertised: dict[str, str] = {}

    def published(self, number: int, members: tuple[str, ...], probes: tuple[str, ...]) -> None:
        self._gen, self._members = number, members
        self._stepped = self._explained = self._concluded = False
        self._errors, self._unreachable = {}, {}
        self._advertised = dict(zip(members, probes, strict=False))

    def stepped(self, number: int) -> None:
        """A step of generation ``number`` completed: it formed."""
        if number == self._gen and not self._stepped:
            self._stepped, self.trained, self.failures = True, self._members, 0

    def gone(self, worker: str) -> None:
        """A member died or left: that explains why its generation did not form."""
        if worker in self._members:
            self._explained = True

    def reported(self, worker: str, ready: Ready) -> None:
        """A member's ``Ready`` report of its generation (why it left it)."""
        if ready.gen != self._gen or self._stepped:
            return
        if ready.reason is ReadyReason.UNREACHABLE:
            self._unreachable[worker] = [u.to_dict() for u in ready.unreachable]
        elif ready.reason is ReadyReason.ERROR:
            self._errors[worker] = ready.error

    def conclude(self, now: float) -> Verdict:
        """Once per ended generation, when all its members reported or are gone."""
        verdict = Verdict()
        if self._concluded or self._gen is None or self._stepped:
            return verdict
        self._concluded = True
        newcomers = [w for w in self._members if w not in self.trained]
        for worker, said in unreachable_members(self._unreachable, newcomers).items():
            verdict.remove[worker] = (f"its peers cannot reach it at "
                                      f"{self._advertised.get(worker) or '?'}, the address it "
                                      f"advertised ({'; '.join(said)}); {FIX}")
        if verdict.remove or self._explained or not (self._errors or self._unreachable):
            return verdict
        self.failures += 1
        errors = "; ".join(f"{w}: {e}" for w, e in sorted(self._errors.items())) or \
            "peers unreachable"
        if self.failures >= self.attempts:
            self.failures = 0
            if newcomers:
                for worker in newcomers:
                    verdict.remove[worker] = (f"the group could not form with it "
                                              f"{self.attempts} times in a row ({errors})")
            else:
                verdict.fail = (f"the workers could not form their group {self.attempts} times "
                                f"in a row: {errors}")
            return verdict
        wait = 0.0 if self.failures == 1 else \
            min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (self.failures - 2))
        self.not_before = now + wait
        verdict.log.append(f"generation {self._gen} could not form ({errors}); attempt "
                           f"{self.failures + 1} of {self.attempts} in {wait:g} s")
        return verdict
