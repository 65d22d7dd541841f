"""The coordinator's reads and writes of its job's TCPStore, in the protocol's terms.

One round trip per tick in the steady state (``poll``: the roster count, every watched worker's
inbox count and heartbeat); everything the coordinator tells workers goes through ``tell``
(a generation's control word), ``reply`` (one worker, outside any generation), ``publish``
(a new generation) and ``set_job`` (the job's state).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch.distributed as dist

from dyntrain.elastic import protocol as p


class CoordinatorBoard:
    """A job's TCPStore as the coordinator uses it.

    Args:
        store: The job's store (under its secret's prefix in the service).
    """

    def __init__(self, store: dist.Store) -> None:
        self.store = store
        self._roster_len = 0  # roster entries read so far
        self._roster_count = 0  # the last roster count polled
        store.set(p.GEN_LATEST, "-1")
        store.add(p.ROSTER_COUNT, 0)  # exists from the start: polled with the other keys
        self.set_job(p.JobVerdict(p.JobState.RUNNING))

    # ---- reading ----------------------------------------------------------------------------

    def poll(self, watched: list[str]) -> tuple[list[int], list[int]] | None:
        """Every watched worker's inbox count and heartbeat counter, in one round trip; None
        when the roster grew since the last poll (read ``new_on_roster`` and poll again)."""
        keys = [p.ROSTER_COUNT, *(p.inbox_count_key(w) for w in watched),
                *(p.heartbeat_key(w) for w in watched)]
        values = [int(v) for v in self.store.multi_get(keys)]
        if values[0] != self._roster_count:
            self._roster_count = values[0]
            return None
        return values[1 : len(watched) + 1], values[len(watched) + 1 :]

    def new_on_roster(self) -> list[str]:
        """The workers added to the roster since the last call."""
        if not self.store.check([p.ROSTER]):
            return []
        names = self.store.get(p.ROSTER).decode().split()
        new, self._roster_len = names[self._roster_len :], len(names)
        return new

    def watch(self, worker: str) -> None:
        """Create the worker's heartbeat counter: polled from now on with the others
        (``multi_get`` waits for missing keys)."""
        self.store.add(p.heartbeat_key(worker), 0)

    def take(self, worker: str, first: int, count: int) -> Iterator[tuple[int, bytes]]:
        """Inbox messages ``first`` to ``count - 1`` of ``worker``, each deleted from the store
        as it is taken."""
        keys = [p.inbox_key(worker, seq) for seq in range(first, count)]
        for seq, raw in zip(range(first, count), self.store.multi_get(keys), strict=True):
            self.store.delete_key(p.inbox_key(worker, seq))
            yield seq, raw

    def inbox_count(self, worker: str) -> int | None:
        """How many messages ``worker`` ever sent here (None: it has no inbox here)."""
        key = p.inbox_count_key(worker)
        return int(self.store.get(key)) if self.store.check([key]) else None

    def message(self, worker: str, seq: int) -> bytes:
        return self.store.get(p.inbox_key(worker, seq))

    # ---- writing ----------------------------------------------------------------------------

    def tell(self, generation: int, worker: str, word: p.Control) -> None:
        """Set ``worker``'s control word in ``generation``."""
        self.store.set(p.ctl_key(generation, worker), word.value)

    def reply(self, worker: str, reply: p.Reply) -> None:
        self.store.set(p.reply_key(worker), reply.encode())

    def tell_all(self, generation: int, workers: list[str], word: p.Control) -> None:
        """Set the control word of each of ``workers`` in ``generation``: one round trip,
        whatever their number."""
        if workers:
            self.store.multi_set([p.ctl_key(generation, w) for w in workers],
                                 [word.value] * len(workers))

    def publish(self, gen: p.Generation) -> None:
        """Make ``gen`` the latest generation: its members' control words first, so that a
        member that finds it finds its word (two round trips, whatever the members' number)."""
        self.tell_all(gen.number, list(gen.members), p.Control.RUN)
        self.store.multi_set([p.gen_key(gen.number), p.GEN_LATEST],
                             [gen.to_json(), str(gen.number)])

    def set_job(self, status: p.JobVerdict) -> None:
        self.store.set(p.JOB_STATE, status.encode())
