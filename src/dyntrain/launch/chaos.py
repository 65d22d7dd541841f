"""Pure: ``dyntrain run --chaos SEED:N`` — random joins, leaves, kills and hangs at the worst times.

Unlike ``--events``, chaos never waits for a change to take effect. After each strike it draws
what to aim at next and when:

- ``any``: a random action at a random time (a gap of up to ``2 * mean_gap`` seconds);
- ``reform``: while the job re-forms (members reporting, no generation running);
- ``sender`` / ``receiver``: while a new generation hands the training state to joiners, kill
  the member that sends it or one that receives it;
- ``checkpoint``: while the leader writes a checkpoint, kill the leader;
- ``burst``: two or three strikes at once.

An aim whose moment does not come within ``aim_timeout`` seconds becomes ``any``, unless the
aims were chosen (``SEED:N:sender,receiver``: every strike waits for one of them). Actions:
``join`` (1 or 2 workers), ``leave`` (SIGTERM to a member), ``kill`` (SIGKILL to any live
worker: member, joiner or one waiting on standby) and ``hang`` (SIGSTOP to a worker the
coordinator knows, so that its heartbeat timeout finds it). When no worker is left, the next
strike is a join, so the job always finishes; the last strike never removes the last worker.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from dyntrain.errors import ConfigError

AIMS = ("any", "reform", "sender", "receiver", "checkpoint", "burst")
AIM_WEIGHTS = (40, 15, 10, 10, 10, 15)
ACTIONS = ("join", "leave", "kill", "hang")
ACTION_WEIGHTS = (30, 25, 30, 15)


def parse_chaos(text: str) -> tuple[int, int, tuple[str, ...]]:
    """``SEED:N[:AIM,...]`` -> (seed, number of strikes, aims; () for all of them)."""
    seed, sep, rest = text.partition(":")
    count, _, aims = rest.partition(":")
    if not sep or not seed.isdigit() or not count.isdigit() or int(count) < 1:
        raise ConfigError(f"--chaos must be SEED:N[:AIM,...] with N >= 1 (e.g. 7:100), "
                          f"got {text!r}")
    chosen = tuple(a for a in aims.split(",") if a) if aims else ()
    unknown = [a for a in chosen if a not in AIMS]
    if unknown:
        raise ConfigError(f"--chaos: unknown aim {unknown[0]!r} (aims: {', '.join(AIMS)})")
    return int(seed), int(count), chosen


@dataclass(frozen=True)
class Situation:
    """What the launcher sees in one tick."""

    now: float
    members: tuple[str, ...] = ()  # the current generation, rank order
    live: tuple[str, ...] = ()  # local worker processes alive and not hung
    known: tuple[str, ...] = ()  # of those, the ones the coordinator knows (said hello)
    reforming: bool = False
    sender: str | None = None  # while a generation hands its state to receivers
    receivers: tuple[str, ...] = ()
    checkpointing: bool = False  # a checkpoint file is being written
    leader: str | None = None


@dataclass(frozen=True)
class Strike:
    action: str  # join, leave, kill or hang
    targets: tuple[str, ...] = ()  # workers (leave, kill, hang)
    count: int = 0  # workers to start (join)
    aim: str = "any"


@dataclass
class Chaos:
    """Decides, tick by tick, which strikes to make now."""

    seed: int
    count: int
    max_workers: int
    aims: tuple[str, ...] = ()  # only these aims, each waited for (default: all, weighted)
    mean_gap: float = 1.0
    aim_timeout: float = 5.0
    left: int = field(init=False)
    _aim: str = field(init=False, default="any")
    _at: float | None = field(init=False, default=None)
    _deadline: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.left = self.count

    def strikes(self, s: Situation) -> list[Strike]:
        if self.left <= 0:
            return []
        if self._at is None:
            self._draw(s.now)
        if not s.live:  # nobody left: bring a worker back before anything else
            return self._done([Strike("join", count=1, aim="refill")], s.now)
        if s.now < self._at:
            return []
        aim = self._aim
        if aim != "any" and aim != "burst" and not self.aims and s.now >= self._deadline:
            aim = "any"
        if aim == "reform" and s.reforming:
            return self._done([self._random(s, aim)], s.now, s.live)
        if aim == "sender" and s.sender in s.live:
            return self._done([Strike("kill", (s.sender,), aim=aim)], s.now, s.live)
        if aim == "receiver" and set(s.receivers) & set(s.live):
            target = self.rng.choice(sorted(set(s.receivers) & set(s.live)))
            return self._done([Strike("kill", (target,), aim=aim)], s.now, s.live)
        if aim == "checkpoint" and s.checkpointing and s.leader in s.live:
            return self._done([Strike("kill", (s.leader,), aim=aim)], s.now, s.live)
        if aim == "burst":
            n = min(self.left, self.rng.choice((2, 3)))
            return self._done(self._burst(s, n), s.now, s.live)
        if aim == "any":
            return self._done([self._random(s, aim)], s.now, s.live)
        return []  # waiting for the aimed-at moment

    def _burst(self, s: Situation, n: int) -> list[Strike]:
        out, live = [], list(s.live)
        for _ in range(n):
            strike = self._random(Situation(s.now, s.members, tuple(live), tuple(
                w for w in s.known if w in live)), "burst", budget=self.left - len(out))
            out.append(strike)
            live = [w for w in live if w not in strike.targets]
        return out

    def _random(self, s: Situation, aim: str, budget: int | None = None) -> Strike:
        budget = self.left if budget is None else budget
        action = self.rng.choices(ACTIONS, ACTION_WEIGHTS)[0]
        members = [w for w in s.members if w in s.live]
        if action == "leave" and not members:
            action = "kill"
        if action == "hang" and not s.known:
            action = "kill"
        # the last strike leaves a worker behind, so that the job can finish
        if action != "join" and len(s.live) <= 1 and budget <= 1:
            action = "join"
        if action == "join" or len(s.live) == 0:
            room = max(1, self.max_workers + 1 - len(s.live))
            return Strike("join", count=self.rng.randint(1, min(2, room)), aim=aim)
        pool = {"leave": members, "kill": list(s.live), "hang": list(s.known)}[action]
        return Strike(action, (self.rng.choice(sorted(pool)),), aim=aim)

    def _done(self, strikes: list[Strike], now: float, live: tuple[str, ...] = ()) -> list[Strike]:
        if len(strikes) >= self.left:  # the last strikes leave a worker behind
            gone = {w for st in strikes for w in st.targets}
            if live and not any(st.action == "join" for st in strikes) \
                    and not set(live) - gone:
                strikes = [*strikes[:-1], Strike("join", count=1, aim=strikes[-1].aim)]
        self.left -= len(strikes)
        self._draw(now)
        return strikes

    def _draw(self, now: float) -> None:
        self._aim = (self.rng.choice(self.aims) if self.aims
                     else self.rng.choices(AIMS, AIM_WEIGHTS)[0])
        self._at = now + self.rng.uniform(0.0, 2 * self.mean_gap)
        self._deadline = self._at + self.aim_timeout
