"""Who is in the job: the coordinator's membership state, as named sets, and the pure decisions
taken over it (admit the joiners now? form which generation?).

Nothing here touches the store or the clock: ``dyntrain.elastic.membership.coordinator`` reads the
store, feeds these, and writes what they decide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dyntrain.elastic import protocol as p
from dyntrain.elastic.numerics import Numerics
from dyntrain.elastic.protocol import Generation


@dataclass
class CoordinatorConfig:
    """How a job's coordinator forms generations.

    Args:
        min_workers: No generation runs with fewer members.
        max_workers: No generation has more; further joiners wait.
        expected_initial: Workers the first generation waits for (else ``settle_seconds`` of
            quiet with at least ``min_workers``).
        settle_seconds: Quiet after the last hello before a first generation forms with fewer
            than ``expected_initial``.
        failure_timeout: Seconds without a heartbeat before a worker is declared dead.
        stall_gap: A gap between two of the coordinator's polls longer than this is its own
            stall (a frozen host), not its workers' silence; None: half the failure timeout.
        numerics: What the job pins (``dyntrain.elastic.numerics``): a worker that does not
            run it is refused; None pins nothing (the first worker's numerics are the job's).
        allow_mixed_numerics: Admit a worker that computes other bits than the job, and
            record from which step the run is no longer bitwise (``admission.judge``).
    """

    min_workers: int
    max_workers: int
    expected_initial: int = 1
    settle_seconds: float = 2.0
    failure_timeout: float = p.FAILURE_TIMEOUT
    stall_gap: float | None = None
    numerics: Numerics | None = None
    allow_mixed_numerics: bool = False

    def own_stall(self) -> float:
        return self.failure_timeout / 2 if self.stall_gap is None else self.stall_gap


@dataclass
class WorkerInfo:
    """What the coordinator knows of one worker: who it is and when its heartbeat last moved."""

    host: str = ""
    pid: int = 0
    probe: str = ""  # "address:port" it advertised (dyntrain.elastic.collective.reach)
    inbox_read: int = 0
    heartbeat: int = -1
    heartbeat_seen: float = 0.0
    silence: float = 0.0  # the longest it was seen unchanged since its last change
    listed: bool = True  # on this store's roster (has an inbox); False: known from before a restart

    def beat(self, counter: int, now: float, timeout: float) -> float | None:
        """Take the heartbeat counter read at ``now``; returns the silence that ended, when it
        was longer than half the timeout (a near miss: the timeout is close to what this
        machine needs). The silence is measured where it is compared: a late poll finds the
        counter moved, and does not count as silence."""
        if counter != self.heartbeat:
            near = (self.silence if self.heartbeat >= 0 and self.silence > timeout / 2
                    else None)
            self.heartbeat, self.heartbeat_seen, self.silence = counter, now, 0.0
            return near
        self.silence = max(self.silence, now - self.heartbeat_seen)
        return None

    def pause(self, seconds: float) -> None:
        """The observer was away for ``seconds`` (its process or host stalled): that time is
        not this worker's silence."""
        self.heartbeat_seen += seconds

    def overdue(self, now: float, timeout: float, reattach_wait: float) -> float | None:
        """The bound its heartbeat missed at ``now`` (None: it has not). A worker of a previous
        coordinator must first notice the loss and reconnect: it gets ``reattach_wait``."""
        limit = timeout if self.listed else max(timeout, reattach_wait)
        return limit if now - self.heartbeat_seen > limit else None


@dataclass
class Membership:
    """The coordinator's view of who takes part, as named sets.

    ``known`` holds every worker heard of, in arrival order. ``joining``: said hello, not yet a
    member (arrival order). ``ready``: reported for the next generation, with the last step it
    applied (None: holds no state). ``gone``: left, rejected, removed or declared dead, never
    admitted again; ``dead``, the part of it declared dead, is fenced (whatever it sends is
    refused). ``draining``: asked to leave at the next boundary. ``awaited``: workers of a
    previous coordinator that have not re-attached yet; ``still_running``: those that
    re-attached while training in the current generation. ``expected``: joiners announced by
    the host, admitted together until ``expect_deadline``.
    """

    current: Generation | None = None
    known: dict[str, WorkerInfo] = field(default_factory=dict)
    joining: list[str] = field(default_factory=list)
    ready: dict[str, int | None] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    draining: set[str] = field(default_factory=set)
    awaited: set[str] = field(default_factory=set)
    still_running: set[str] = field(default_factory=set)
    expected: set[str] = field(default_factory=set)
    expect_deadline: float = 0.0
    hello_at: dict[str, float] = field(default_factory=dict)  # worker -> when it said hello
    last_hello: float = 0.0
    requested: dict[str, float] = field(default_factory=dict)  # worker -> leave/kill requested

    def live(self) -> list[str]:
        """Known workers not gone, in arrival order."""
        return [w for w in self.known if w not in self.gone]

    def pause(self, seconds: float) -> None:
        """The coordinator did not run for ``seconds`` (its process or host stalled; its loop
        polls many times a second): that time is no live worker's silence (on a host frozen
        as a whole their beats were not even sent)."""
        for worker in self.live():
            self.known[worker].pause(seconds)

    def watched(self) -> list[str]:
        """Live workers with keys in this store (polled for messages and heartbeats)."""
        return [w for w in self.live() if self.known[w].listed]

    def in_current(self, worker: str) -> bool:
        return self.current is not None and worker in self.current.members

    def is_current(self, generation: int | None) -> bool:
        """Whether a message for ``generation`` acts for the current one."""
        return self.current is not None and generation == self.current.number

    def drop(self, worker: str) -> None:
        """It no longer waits to join or for the next generation."""
        if worker in self.joining:
            self.joining.remove(worker)
        self.ready.pop(worker, None)

    def leave(self, worker: str) -> None:
        """It left, was rejected or removed: never admitted again."""
        self.gone.add(worker)
        self.drop(worker)

    def fence(self, worker: str) -> None:
        """It was declared dead: gone, and whatever it sends from now on is refused."""
        self.dead.add(worker)
        self.leave(worker)

    def await_reattach(self, workers: list[str], now: float) -> None:
        """``workers`` ran under a previous coordinator: they are awaited until they re-attach
        or are gone (timed out from ``now`` on)."""
        for worker in workers:
            self.known.setdefault(worker, WorkerInfo(heartbeat_seen=now, listed=False))
            self.awaited.add(worker)

    def list_worker(self, worker: str, now: float) -> bool:
        """A worker found on this store's roster; True when it is new here (its heartbeat
        counter must be created)."""
        info = self.known.get(worker)
        if info is not None and info.listed:
            return False
        if info is None:
            self.known[worker] = info = WorkerInfo(heartbeat_seen=now)
        info.listed = True
        return True

    def greet(self, worker: str, hello: p.Hello, now: float) -> WorkerInfo:
        """Record who a worker that said hello (or re-attached) is."""
        info = self.known.setdefault(worker, WorkerInfo())
        info.host, info.pid, info.heartbeat_seen = hello.host, hello.pid, now
        info.probe = hello.probe
        self.awaited.discard(worker)
        return info

    def reported(self, worker: str, ready: p.Ready) -> bool:
        """A worker reported ``ready``; True when it left the current generation (a stale
        report of one that is over only makes a waiting worker ready)."""
        if not self.is_current(ready.gen):
            if worker not in self.joining and worker not in self.gone and worker not in self.ready:
                self.ready[worker] = ready.step
            return False
        self.ready[worker] = ready.step
        self.still_running.discard(worker)
        return True

    def adopt(self, gen: Generation, now: float) -> None:
        """After a restart: a re-attaching worker reports ``gen``, newer than any so far; its
        members train on in it."""
        self.current = gen
        for worker in gen.members:
            self.known.setdefault(worker, WorkerInfo(heartbeat_seen=now, listed=False))

    def rejoined(self, worker: str, where: p.Position) -> bool:
        """Place a re-attached worker that took part in a generation: True when it trains on
        in the current one, else it is ready for the next."""
        if where.state is p.WorkerState.RUNNING and \
                where.generation.number == self.current.number:
            self.still_running.add(worker)
            return True
        self.ready[worker] = where.step
        return False

    def install(self, gen: Generation) -> list[str]:
        """``gen`` is published: it becomes current; returns the members that joined with it
        (said hello, not in the previous one)."""
        previous = self.current.members if self.current else ()
        admitted = [w for w in gen.members if w in self.hello_at and w not in previous]
        self.joining = [w for w in self.joining if w not in gen.members]
        self.ready = {w: s for w, s in self.ready.items() if w not in gen.members}
        self.current = gen
        return admitted

    def accounted(self) -> bool:
        """Every member of the current generation reported ready or is gone."""
        members = self.current.members if self.current else ()
        return all(w in self.ready or w in self.gone for w in members)

    def missing_expected(self) -> list[str]:
        """Announced joiners that have not said hello yet (and are not gone)."""
        return [w for w in self.expected if w not in self.hello_at and w not in self.gone]

    def admission_due(self, max_workers: int, now: float) -> bool:
        """Whether the running generation should re-form now to admit the joiners: there is
        room, and every announced joiner said hello (or its deadline passed)."""
        if not self.joining or self.current.world_size >= max_workers:
            return False
        return not (self.missing_expected() and now < self.expect_deadline)

    def survived(self) -> bool:
        """After a re-attach: every member of the current generation still trains in it."""
        return self.current is not None and all(w in self.still_running
                                                for w in self.current.members)


@dataclass
class Forming:
    """What the coordinator does when the current generation is over (or none runs yet).

    ``release``: drained workers whose generation was aborted before their boundary, told to
    leave now. ``generation``: the one to publish. ``short``: how many workers are available
    when fewer than ``min_workers`` are (the coordinator waits for more).
    """

    release: list[str] = field(default_factory=list)
    generation: Generation | None = None
    short: int | None = None


def decide_forming(m: Membership, cfg: CoordinatorConfig, now: float,
                   find_checkpoint: Callable[[], tuple[int, str] | None]) -> Forming:
    """Whether and how to form the next generation, once ``m.accounted()``.

    ``find_checkpoint`` is asked only when no ready worker holds state and enough are there.
    """
    if m.current is None:
        enough = len(m.joining) >= min(cfg.expected_initial, cfg.max_workers)
        settled = (len(m.joining) >= cfg.min_workers
                   and now - m.last_hello >= cfg.settle_seconds)
        if not (enough or settled):
            return Forming()
    release = list(m.draining & set(m.ready))
    ready = {w: s for w, s in m.ready.items() if w not in m.gone and w not in release}
    if not ready and m.missing_expected() and now < m.expect_deadline:
        return Forming(release)  # nothing runs anyway: start the announced workers together
    if len(ready) + len(m.joining) < cfg.min_workers:
        return Forming(release, short=len(ready) + len(m.joining))
    holders = [s for s in ready.values() if s is not None]
    checkpoint = None if holders else find_checkpoint()
    number = m.current.number + 1 if m.current else 0
    gen = next_generation(number, m.current.members if m.current else (), ready, m.joining,
                          cfg.min_workers, cfg.max_workers, checkpoint)
    return Forming(release, gen)


def next_generation(
    number: int,
    previous_members: Sequence[str],
    ready: Mapping[str, int | None],
    joiners: Sequence[str],
    min_workers: int,
    max_workers: int,
    checkpoint: tuple[int, str] | None,
) -> Generation | None:
    """Decide generation ``number``, or None while there are fewer than ``min_workers``.

    ``ready`` maps each worker that can take part to the last step it applied (None: it holds no
    state). Survivors keep their relative rank order and come first; joiners are admitted in
    arrival order up to ``max_workers``. The new generation starts from the most advanced state any
    survivor holds, so an interrupted step is recomputed and no applied step is applied twice.
    """
    survivors = [w for w in previous_members if w in ready]
    survivors += [w for w in ready if w not in survivors and w not in joiners]
    admitted = [w for w in joiners if w not in survivors][: max(0, max_workers - len(survivors))]
    members = (survivors + admitted)[:max_workers]
    if len(members) < min_workers or not members:
        return None
    steps = {w: ready.get(w) for w in members}
    holders = [w for w in members if steps[w] is not None]
    if holders:
        best = max(steps[w] for w in holders)
        source = next(w for w in holders if steps[w] == best)
        receivers = tuple(w for w in members if steps[w] != best)
        return Generation(number, tuple(members), best, source=source, receivers=receivers)
    if checkpoint is not None:
        step, path = checkpoint
        return Generation(number, tuple(members), step, checkpoint=path)
    return Generation(
        number, tuple(members), 0, source=members[0], receivers=tuple(members[1:]), fresh=True
    )
