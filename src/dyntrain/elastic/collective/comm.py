"""Process groups per generation, and collectives that can be abandoned when a peer dies.

A generation's group is created fresh (its own store prefix) and never reused. Every blocking
call waits on an event with a timeout and asks ``should_abort`` in between, so a worker never
hangs on a dead peer for longer than the coordinator takes to notice the death.

A generation owns what its collectives write: the group hands out its own buffers
(``Group.buffers``) and drops them on ``close``, so a late completion of an abandoned
generation's collective writes only into memory that nobody reads any more. An abandoned
group is also cut off (``sever``): on gloo, ``abort()`` and ``shutdown()`` do nothing to pending
operations in this torch, and a peer that was cut off (frozen, or behind a partition that
heals) would later complete them. A receive that times out in gloo closes every connection of
its context (gloo does this so that no data arrives after an application-side timeout): one
receive with a 1 ms timeout per context closes the group's sockets, fails every pending
collective at once, and a late peer's sends find no socket to land in.
"""

from __future__ import annotations

import atexit
import faulthandler
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from dyntrain.elastic.collective.ring import RingThread, Scratch

POLL_SECONDS = 0.05
# The tag of the receive that severs a group: no member ever sends with it.
SEVER_TAG = 1 << 30
SEVER_WAIT = timedelta(milliseconds=1)
#: A close that keeps the next generation waiting longer than this says so on stderr, with every
#: thread's stack (severing and stopping the ring thread take milliseconds).
SLOW_CLOSE_SECONDS = 2.0
#: A dropped group whose destructor takes longer than this says so on stderr, with every
#: thread's stack: a gloo operation that severing did not fail (a receive cut off in the middle
#: of a message) keeps the destructor waiting up to the collective timeout. It waits on a thread
#: of its own (``drop_in_background``): the next generation does not wait for it.
SLOW_DROP_SECONDS = 30.0


class Aborted(Exception):
    """The current generation was given up: a peer died or the coordinator said so."""


class CollectiveFailed(Exception):
    """A collective raised (typically: a peer's connection was reset)."""


def wait_future(
    fut: torch.futures.Future, should_abort: Callable[[], bool], poll: float = POLL_SECONDS
) -> object:
    """Wait for ``fut``; raise Aborted if ``should_abort`` says so first."""
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    while not done.wait(poll):
        if should_abort():
            raise Aborted()
    try:
        return fut.value()
    except Exception as exc:  # gloo reports a dead peer as a RuntimeError
        raise CollectiveFailed(str(exc).splitlines()[0]) from exc


def run_abortable(fn: Callable[[], object], should_abort: Callable[[], bool]) -> object:
    """Run a blocking call (such as group creation) in a thread, abandoning it on abort."""
    fut: torch.futures.Future = torch.futures.Future()

    def target() -> None:
        try:
            fut.set_result(fn())
        except Exception as exc:
            fut.set_exception(exc)

    threading.Thread(target=target, daemon=True, name="dyntrain-abortable").start()
    return wait_future(fut, should_abort)


class Group:
    """A process group for one generation, with sum all-reduce and byte broadcast.

    ``ring`` says whether ``exact_sum_async`` (``dyntrain.elastic.collective.ring``) is available:
    on gloo with CPU tensors. ``buffers`` holds the tensors that this generation's collectives write
    (the step's gradient sums): whoever uses them takes them from here, so each generation
    has its own and ``close`` drops them."""

    def __init__(self, pg: dist.ProcessGroup | None, rank: int, size: int, device: torch.device,
                 ring: bool = False):
        self.pg, self.rank, self.size, self.device = pg, rank, size, device
        self.ring = ring and pg is not None and device.type == "cpu"
        self.buffers: dict[str, torch.Tensor] = {}
        self._ring_thread: RingThread | None = None

    def allreduce_sum(self, tensor: torch.Tensor, should_abort: Callable[[], bool]) -> None:
        """Sum ``tensor`` over all members, in place."""
        if self.pg is None:
            return
        self.wait(self.allreduce_async(tensor), should_abort)

    def allreduce_async(self, tensor: torch.Tensor) -> dist.Work:
        """Start summing ``tensor`` over all members, in place; ``wait`` for the returned work.
        Every member must start its collectives in the same order."""
        return self.pg.allreduce([tensor])

    def exact_sum_async(self, contrib: torch.Tensor, out: torch.Tensor) -> torch.futures.Future:
        """Start the exact ring sum of ``contrib`` into ``out`` (see ``ring``); ``wait`` for it.
        Both should be this group's ``buffers``: the ring may still write ``out`` while the
        group is being closed."""
        return self._ring().submit(contrib, out)

    def ring_job_async(self, job) -> torch.futures.Future:
        """Queue ``job(pg, rank, size, fenced)`` on the thread of the exact sums, behind them
        (``RingThread.submit_job``); ``wait`` for it."""
        return self._ring().submit_job(job)

    def ring_scratch(self) -> Scratch:
        """The hop buffers of the thread of the exact sums, for a job's hops (``ring``)."""
        return self._ring().scratch

    def _ring(self) -> RingThread:
        if self._ring_thread is None:
            self._ring_thread = RingThread(self.pg, self.rank, self.size)
        return self._ring_thread

    @staticmethod
    def wait(work: dist.Work | torch.futures.Future, should_abort: Callable[[], bool]) -> None:
        fut = work if isinstance(work, torch.futures.Future) else work.get_future()
        wait_future(fut, should_abort)

    def broadcast_bytes(
        self, payload: bytes | None, root: int, should_abort: Callable[[], bool]
    ) -> bytes:
        """Send ``payload`` from ``root`` to every member; returns it on all."""
        if self.pg is None:
            assert payload is not None
            return payload
        size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
        self._broadcast(size.to(self.device), root, should_abort, out=size)
        if self.rank == root:
            assert payload is not None
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(buf.to(self.device), root, should_abort, out=buf)
        return payload if self.rank == root else buf.numpy().tobytes()

    def broadcast_async(self, tensor: torch.Tensor, root: int) -> dist.Work:
        """Start sending ``tensor`` from ``root`` into ``tensor`` on every member."""
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        return self.pg.broadcast([tensor], opts)

    def send_async(self, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work:
        """Start sending ``tensor`` to the member of rank ``peer`` (matched by ``tag``);
        ``wait_all`` for it.

        Raises:
            CollectiveFailed: The connection to ``peer`` is closed (it died, or the group was
                severed): gloo says so when the send is posted.
        """
        if self._host_only(tensor):
            tensor = tensor.cpu()  # the work holds it until sent
        return _posted(lambda: self.pg.send([tensor], peer, tag))

    def recv_async(self, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work:
        """Start receiving into ``tensor`` what the member of rank ``peer`` sends with ``tag``
        (of exactly ``tensor``'s size); ``wait_all`` for it.

        Raises:
            CollectiveFailed: As ``send_async``.
        """
        if self._host_only(tensor):
            host = torch.empty_like(tensor, device="cpu")
            return _StagedRecv(_posted(lambda: self.pg.recv([host], peer, tag)), host, tensor)
        return _posted(lambda: self.pg.recv([tensor], peer, tag))

    def _host_only(self, tensor: torch.Tensor) -> bool:
        """gloo's send and receive read and write the memory they are given as host memory
        (a CUDA tensor's: ``writev ... Bad address``): such tensors go through host copies."""
        return tensor.device.type != "cpu" and self.pg.name() == "gloo"

    @staticmethod
    def wait_all(works: list[dist.Work], should_abort: Callable[[], bool]) -> None:
        """Wait for ``works`` of ``send_async`` / ``recv_async`` (gloo's have no future: a
        thread waits, abandoned on abort; severing the group fails what it waits for)."""
        run_abortable(lambda: [work.wait() for work in works], should_abort)

    def _broadcast(self, tensor, root, should_abort, out: torch.Tensor) -> None:
        self.wait(self.broadcast_async(tensor, root), should_abort)
        if tensor is not out:
            out.copy_(tensor.cpu())

    def close(self, abandoned: bool = True) -> None:
        """Drop the group and everything it owns.

        ``abandoned``: the generation ended without every collective done (a member was lost,
        or this one gave up): first sever the group, so that pending collectives fail at once
        and nothing a cut-off peer sends later can arrive. A generation that ended cleanly
        (every collective completed on every member) is dropped without severing: a peer may
        still be reading the last bytes this member sent."""
        phase = ["severing the group"]
        watch = watch_slow(lambda: f"rank {self.rank}: closing a process group ({phase[0]})",
                           SLOW_CLOSE_SECONDS)
        try:
            if self._ring_thread is not None:
                self._ring_thread.fence()  # from now on it starts no hop and writes nothing
            if self.pg is not None and abandoned:
                sever(self.pg, self.rank, self.size)
            if self._ring_thread is not None:
                # after severing: its pending receives fail rather than blocking the join (a
                # thread still running when the process exits makes gloo call std::terminate)
                phase[0] = "stopping the ring thread"
                self._ring_thread.stop()
                self._ring_thread = None
            self.buffers = {}
            if self.pg is not None:
                holder, self.pg = [self.pg], None  # the last reference, handed over
                drop_in_background(holder, f"rank {self.rank}: dropping an abandoned process "
                                   "group (gloo waits for its pending operations)")
        finally:
            watch.cancel()


#: the threads dropping process groups (``drop_in_background``), until they are done
_dropping: list[threading.Thread] = []
_dropping_lock = threading.Lock()


def drop_in_background(holder: list, what: str) -> None:
    """Drop the process group in ``holder`` (its only reference) on a thread of its own.

    Dropping a gloo group joins its threads, which wait for their pending operations: one that
    severing did not fail keeps the destructor waiting up to the collective timeout. torch
    releases the GIL in a process group's destructor, so the next generation forms and trains
    meanwhile; the sockets it closes are the old generation's only. Before the process exits,
    ``wait_for_drops`` lets each finish (gloo's threads still running at exit would make it
    call ``std::terminate``)."""

    def drop() -> None:
        watch = watch_slow(lambda: what, SLOW_DROP_SECONDS)
        try:
            holder.clear()  # gloo joins its threads and closes the sockets
        finally:
            watch.cancel()

    thread = threading.Thread(target=drop, daemon=True, name="dyntrain-drop-group")
    with _dropping_lock:
        if not _dropping:
            atexit.register(wait_for_drops)
        _dropping[:] = [t for t in _dropping if t.is_alive()]
        _dropping.append(thread)
    thread.start()


def wait_for_drops(timeout: float | None = None) -> bool:
    """Wait until every group handed to ``drop_in_background`` is dropped (at most ``timeout``
    seconds); whether all are. Runs at exit, saying so when it waits."""
    with _dropping_lock:
        pending = [t for t in _dropping if t.is_alive()]
    if pending and timeout is None:
        print(f"dyntrain: waiting for {len(pending)} abandoned process group(s) to close before "
              "exiting", file=sys.stderr, flush=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in pending:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in pending)


class _StagedRecv:
    """A receive into host memory, copied into its device tensor once waited for."""

    def __init__(self, work: dist.Work, host: torch.Tensor, dest: torch.Tensor):
        self.work, self.host, self.dest = work, host, dest

    def wait(self, *args) -> bool:
        self.work.wait(*args)
        self.dest.copy_(self.host)
        return True


def _posted(post: Callable[[], dist.Work]) -> dist.Work:
    try:
        return post()
    except RuntimeError as exc:  # gloo: a closed connection, at once
        raise CollectiveFailed(str(exc).splitlines()[0]) from exc


def watch_slow(what: Callable[[], str], seconds: float) -> threading.Timer:
    """Start a timer that, unless cancelled within ``seconds``, says on stderr that ``what()``
    has taken that long and prints every thread's stack (where it waits); cancel it when done."""

    def report() -> None:
        print(f"dyntrain: {what()} has taken over {seconds:g} s; every thread's stack follows",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    timer = threading.Timer(seconds, report)
    timer.daemon = True
    timer.start()
    return timer


def sever(pg: dist.ProcessGroup, rank: int, size: int) -> None:
    """Close every connection of ``pg`` now, failing whatever is pending on it.

    NCCL has ``abort``. gloo's ``abort`` and ``shutdown`` leave pending operations and sockets
    as they are; but a receive whose wait times out makes gloo close every pair of its context
    (so that no data can arrive after an application timeout). Such a receive, with a tag
    nobody sends, per context (gloo picks a send/receive's context by its tag) and peer: the
    connection to a peer that severed first is closed already, and a receive on it fails
    without the timeout that closes the others; once one has timed out, the rest fail at
    once."""
    if pg.name() != "gloo":
        try:
            pg.abort()
        except Exception:  # an already broken group may refuse; it is gone either way
            pass
        return
    contexts = len(getattr(getattr(pg, "options", None), "_devices", None) or ()) or 1
    for index in range(contexts):
        for peer in range(size):
            if peer == rank:
                continue
            try:
                pg.recv([torch.empty(1)], peer, SEVER_TAG + index).wait(SEVER_WAIT)
            except Exception:  # the timeout that closes the connections (or they already were)
                pass


def create_group(
    store: dist.Store | None,
    generation: int,
    rank: int,
    size: int,
    backend: str,
    device: torch.device,
    timeout: timedelta,
    should_abort: Callable[[], bool],
    address: str | None = None,
) -> Group:
    """Create the process group of one generation under its own store prefix; gloo binds
    ``address`` (the one this worker advertises) and gives it to the peers, instead of what the
    hostname resolves to (127.0.1.1 on stock cloud images)."""
    if size == 1:
        return Group(None, 0, 1, device)
    prefix = dist.PrefixStore(f"pg/{generation}/", store)
    if backend == "nccl":
        def make():
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            return dist.ProcessGroupNCCL(prefix, rank, size, opts)
    else:
        def make():
            if address is None:
                return dist.ProcessGroupGloo(prefix, rank, size, timeout)
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
            return dist.ProcessGroupGloo(prefix, rank, size, opts)
    pg = run_abortable(make, should_abort)
    return Group(pg, rank, size, device, ring=backend == "gloo")
