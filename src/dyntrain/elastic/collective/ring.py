"""The exact sum of float32 gradients at float32 cost: a ring all-reduce that adds in float64.

A float64 all-reduce makes the sum independent of who added what (float64 holds the sum of a few
float32 terms exactly in practice), but it moves twice DDP's bytes. Only two places need float64:
a partial sum of two or more terms on its way, and the additions themselves. So the ring sends a
worker's own contribution as it is (float32 when it is one chunk's gradient), adds in float64 at
each hop, forwards partial sums in float64, and the owner of a segment rounds the full sum to
float32 once; the all-gather then moves float32. With two workers no partial sum ever travels:
each sends half of its float32 gradient and receives half of the rounded result, exactly DDP's
bytes. Per element a worker sends (4 + 8 (W - 2) + 4 (W - 1)) / W bytes against a float64 ring
all-reduce's 16 (W - 1) / W: half at W = 2, two thirds at W = 4.

The rounded result is the float64 sum rounded once, as with a float64 all-reduce.

``ring_reduce_scatter`` is the first phase alone, over segments of any sizes, each member ending
with the float64 sum of its own segment: ZeRO-2 (``dyntrain.elastic.sharding.gradients``) cuts a
bucket into one segment per member (the tensors it is primary owner of) and gathers no gradient.

The hops are point-to-point sends on the generation's gloo group, driven by one thread per group
(``RingThread``) that takes buckets in the order they were submitted, so every member runs the
same sends in the same order while backward goes on. Once its generation is abandoned the
thread is fenced: it starts no further hop and writes no further sum (``RingThread.fence``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist


class Fenced(Exception):
    """The ring's generation was abandoned: the sum was given up between two hops."""


class Scratch:
    """The buffers of one ring's hops, reused: hops run one at a time on the ring's thread, and
    a fresh tensor of megabytes costs page faults every time. They belong to the ring (its
    generation's group): a late hop of an abandoned generation writes only into its own."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.device], torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device
            ) -> torch.Tensor:
        """``numel`` elements of ``dtype`` (uninitialised) in buffer ``name``."""
        nbytes = numel * dtype.itemsize
        buf = self._bufs.get((name, device))
        if buf is None or buf.numel() < nbytes:
            buf = self._bufs[name, device] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return buf[:nbytes].view(dtype)


def exact_ring_sum(pg: dist.ProcessGroup, rank: int, size: int, contrib: torch.Tensor,
                   out: torch.Tensor, fenced: threading.Event | None = None,
                   scratch: Scratch | None = None) -> None:
    """Sum ``contrib`` (float32 or float64, 1-D, same dtype on every member) over the group and
    write the float64 sum rounded to ``out``'s dtype into ``out`` (which may be ``contrib``).
    Raises ``Fenced`` before any hop once ``fenced`` is set. ``scratch``: the hops' buffers
    (None: new ones)."""
    n = contrib.numel()
    bounds = [i * n // size for i in range(size + 1)]

    def seg(i: int) -> slice:
        i %= size
        return slice(bounds[i], bounds[i + 1])

    nxt, prv = (rank + 1) % size, (rank - 1) % size
    # reduce-scatter: at hop h, send the partial sum of segment rank - h, add to segment
    # rank - h - 1; after size - 1 hops this rank holds the whole sum of segment rank + 1
    outgoing = contrib[seg(rank)]
    total = outgoing.to(torch.float64) if size == 1 else outgoing  # (replaced by hop 0)
    for h in range(size - 1):
        part = seg(rank - h - 1)
        numel = part.stop - part.start
        incoming = _buffer(scratch, "in", numel, contrib.dtype if h == 0 else torch.float64,
                           contrib.device)
        _exchange(pg, outgoing, nxt, incoming, prv, fenced)
        # (the partial sum just sent is no longer needed: its buffer takes the next one)
        total = _add64(contrib[part], incoming, _buffer(scratch, "sum", numel, torch.float64,
                                                        contrib.device))
        outgoing = total
    _check(fenced)
    out[seg(rank + 1)] = total
    # all-gather of the rounded sums
    for h in range(size - 1):
        _exchange(pg, out[seg(rank + 1 - h)], nxt, out[seg(rank - h)], prv, fenced)


def ring_reduce_scatter(pg: dist.ProcessGroup, rank: int, size: int, contrib: torch.Tensor,
                        bounds: Sequence[int], fenced: threading.Event | None = None,
                        scratch: Scratch | None = None) -> torch.Tensor:
    """Sum ``contrib`` (float32 or float64, 1-D, same dtype on every member) over the group,
    segment by segment, and return this rank's segment ``bounds[rank]:bounds[rank + 1]`` of
    the sum in float64, unrounded: the float64 sum of the same terms as ``exact_ring_sum``'s.
    ``bounds`` (``size + 1`` offsets, the same on every member) may cut uneven segments.
    Raises ``Fenced`` before any hop once ``fenced`` is set. With ``scratch`` (the hops'
    buffers) the sum returned is in it: read it before the ring's next job."""

    def seg(i: int) -> slice:
        i %= size
        return slice(bounds[i], bounds[i + 1])

    nxt, prv = (rank + 1) % size, (rank - 1) % size
    # as exact_ring_sum's reduce-scatter, shifted by one segment so that this rank ends with
    # the sum of its own: at hop h send segment rank - 1 - h, add to segment rank - 2 - h
    outgoing = contrib[seg(rank - 1)]
    if size == 1:
        return contrib[seg(rank)].to(torch.float64)
    for h in range(size - 1):
        part = seg(rank - h - 2)
        numel = part.stop - part.start
        incoming = _buffer(scratch, "in", numel, contrib.dtype if h == 0 else torch.float64,
                           contrib.device)
        _exchange(pg, outgoing, nxt, incoming, prv, fenced)
        total = _add64(contrib[part], incoming, _buffer(scratch, "sum", numel, torch.float64,
                                                        contrib.device))
        outgoing = total
    _check(fenced)
    return total


def exchange(pg: dist.ProcessGroup, sends: Sequence[tuple[torch.Tensor, int]],
             recvs: Sequence[tuple[torch.Tensor, int]], fenced: threading.Event | None = None,
             tag: int = 1) -> None:
    """Send each ``(tensor, to)`` and receive each ``(tensor, source)`` at once, then wait for
    all (one message per direction and peer: gloo matches them by peer and tag in order)."""
    _check(fenced)
    works = [pg.send([t], to, tag) for t, to in sends if t.numel()]
    works += [pg.recv([t], source, tag) for t, source in recvs if t.numel()]
    for work in works:
        work.wait()


def _add64(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``a + b`` added in float64 into ``out`` (float64): both terms widened exactly first.
    (``torch.add`` of two float32 tensors adds in float32 even into a float64 ``out``.)"""
    if a.dtype == torch.float64 or b.dtype == torch.float64:
        return torch.add(a, b, out=out)  # promoted to float64 before the addition
    out.copy_(a)
    return out.add_(b)


def _buffer(scratch: Scratch | None, name: str, numel: int, dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    if scratch is None:
        return torch.empty(numel, dtype=dtype, device=device)
    return scratch.get(name, numel, dtype, device)


def _check(fenced: threading.Event | None) -> None:
    if fenced is not None and fenced.is_set():
        raise Fenced()


def _exchange(pg: dist.ProcessGroup, send: torch.Tensor, to: int, recv: torch.Tensor,
              source: int, fenced: threading.Event | None) -> None:
    _check(fenced)
    # an empty segment (fewer elements than members) is skipped by its sender and its receiver
    works = ([pg.send([send], to, 0)] if send.numel() else []) + (
        [pg.recv([recv], source, 0)] if recv.numel() else [])
    for work in works:
        work.wait()


class RingThread:
    """Runs ``exact_ring_sum`` for one group's buckets, one after another, off the caller's thread.

    A failure (a peer died, the group was severed, the thread was fenced) fails that bucket's
    future and every later one; the generation is over anyway."""

    def __init__(self, pg: dist.ProcessGroup, rank: int, size: int) -> None:
        self.pg, self.rank, self.size = pg, rank, size
        self._fenced = threading.Event()
        self.scratch = Scratch()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="dyntrain-ring")
        self._thread.start()

    def submit(self, contrib: torch.Tensor, out: torch.Tensor) -> torch.futures.Future:
        """Queue ``exact_ring_sum`` of ``contrib`` into ``out``."""
        return self.submit_job(lambda pg, rank, size, fenced: exact_ring_sum(
            pg, rank, size, contrib, out, fenced, self.scratch))

    def submit_job(self, job: Callable[[dist.ProcessGroup, int, int, threading.Event], None]
                   ) -> torch.futures.Future:
        """Queue ``job(pg, rank, size, fenced)``: point-to-point exchanges on the group, in
        queue order with the sums (a job checks ``fenced`` before each exchange)."""
        fut: torch.futures.Future = torch.futures.Future()
        self._jobs.put((job, fut))
        return fut

    def fence(self) -> None:
        """The generation is over: start no further hop, write no further sum."""
        self._fenced.set()

    def stop(self) -> None:
        """Fence the thread and let it end (waits up to a second: a hop in progress ends when
        its group is severed)."""
        self.fence()
        self._jobs.put(None)
        self._thread.join(1.0)
        self.pg = None

    def _run(self) -> None:
        failure: Exception | None = None
        while (job := self._jobs.get()) is not None:
            run, fut = job
            if failure is None:
                try:
                    run(self.pg, self.rank, self.size, self._fenced)
                except Exception as exc:  # gloo reports a dead peer as a RuntimeError
                    failure = exc
            if failure is None:
                fut.set_result(None)
            else:
                fut.set_exception(failure)
