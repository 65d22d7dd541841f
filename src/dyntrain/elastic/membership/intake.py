"""What the workers said: the coordinator's reading of the store, one poll at a time.

One round trip per poll reads the roster count and every watched worker's inbox count and
heartbeat (``board.CoordinatorBoard.poll``, the steady state's only store traffic); newcomers
on the roster are watched from then on. A gap between two polls longer than the coordinator's
own stall limit is its own stall (a frozen host): its workers' beats could not be seen then,
so their silence in that time is not counted (``Membership.pause``). Each worker's new messages
are taken in order and decoded (``protocol.decode``); one the protocol does not know is
refused, and logged. What the messages mean is the coordinator's business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from dyntrain.elastic import protocol as p
from dyntrain.elastic.membership.board import CoordinatorBoard
from dyntrain.elastic.membership.members import CoordinatorConfig, Membership
from dyntrain.elastic.membership.phases import Sink


class Intake:
    """Reads the store for one coordinator.

    Args:
        board: The coordinator's view of the store.
        membership: Whom it watches, and each worker's heartbeat and inbox position.
        config: The failure timeout and the coordinator's own stall limit.
        sink: Where refusals and silences are logged.
        clock: Seconds, as the coordinator's.
    """

    def __init__(self, board: CoordinatorBoard, membership: Membership,
                 config: CoordinatorConfig, sink: Sink, clock: Callable[[], float]) -> None:
        self.board, self.membership, self.config = board, membership, config
        self.sink, self.clock = sink, clock
        self._last_poll, self._last_poll_known = 0.0, False

    def read_roster(self) -> None:
        """Watch the workers new on the roster."""
        for worker in self.board.new_on_roster():
            if self.membership.list_worker(worker, self.clock()):
                self.board.watch(worker)

    def poll(self) -> tuple[float, list[tuple[str, int]]]:
        """One round trip for the roster count and every live worker's inbox count and
        heartbeat: the beats are noted (a long silence is logged); returns when (the clock's
        seconds) and each watched worker's inbox count. Workers of a previous coordinator
        that have not re-attached yet have no keys here: they are only timed out."""
        m, timeout = self.membership, self.config.failure_timeout
        while (polled := self.board.poll(watched := m.watched())) is None:
            self.read_roster()  # newcomers: poll again with them
        counts, beats = polled
        now = self.clock()
        self._own_stall(now)
        for worker, counter in zip(watched, beats, strict=True):
            silence = m.known[worker].beat(counter, now, timeout)
            if silence is not None:
                self.sink.log(f"worker {worker} was silent for {silence:.1f} s (lost after "
                              f"{timeout:g} s)")
        return now, list(zip(watched, counts, strict=True))

    def messages(self, worker: str, count: int) -> Iterator[p.Message]:
        """``worker``'s messages not read yet of the ``count`` it sent, in order; each is read
        (taken from the store) as it is yielded."""
        info = self.membership.known[worker]
        if count <= info.inbox_read:
            return
        for seq, raw in self.board.take(worker, info.inbox_read, count):
            info.inbox_read = seq + 1
            msg = self._decode(worker, raw)
            if msg is not None:
                yield msg

    def leftovers(self) -> Iterator[tuple[str, p.Message]]:
        """Every worker's messages not read yet, sent after the job ended (final results,
        last metrics), as ``(worker, message)``."""
        self.read_roster()
        for worker, info in list(self.membership.known.items()):
            count = self.board.inbox_count(worker)
            if count is None:
                continue
            for seq in range(info.inbox_read, count):
                msg = self._decode(worker, self.board.message(worker, seq))
                if msg is not None:
                    yield worker, msg
            info.inbox_read = count

    def _decode(self, worker: str, raw: bytes) -> p.Message | None:
        try:
            return p.decode(raw, worker)
        except p.ProtocolError as exc:
            self.sink.log(f"refused a message from {worker}: {exc}")
            return None

    def _own_stall(self, now: float) -> None:
        """A gap between two polls longer than ``stall_gap`` is the coordinator's own stall (a
        frozen host): its workers' beats could not be seen then, so it is not their silence."""
        gap, self._last_poll = now - self._last_poll, now
        if self._last_poll_known and gap > self.config.own_stall():
            self.membership.pause(gap)
            self.sink.log(f"the coordinator did not run for {gap:.1f} s: its workers' silence "
                          f"in that time is not counted")
        self._last_poll_known = True
