"""Process groups per generation, and collectives that can be abandoned when a peer dies.

A generation's group is created fresh (its own store prefix) and never reused, so a group that
lost a member is simply aborted and dropped. Every blocking call waits on an event with a timeout
and asks ``should_abort`` in between, so a worker never hangs on a dead peer for longer than the
coordinator takes to notice the death.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from dyntrain.elastic.ring import RingThread

POLL_SECONDS = 0.05


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

    ``ring`` says whether ``exact_sum_async`` (``dyntrain.elastic.ring``) is available: on gloo
    with CPU tensors."""

    def __init__(self, pg: dist.ProcessGroup | None, rank: int, size: int, device: torch.device,
                 ring: bool = False):
        self.pg, self.rank, self.size, self.device = pg, rank, size, device
        self.ring = ring and pg is not None and device.type == "cpu"
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
        """Start the exact ring sum of ``contrib`` into ``out`` (see ``ring``); ``wait`` for it."""
        if self._ring_thread is None:
            self._ring_thread = RingThread(self.pg, self.rank, self.size)
        return self._ring_thread.submit(contrib, out)

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

    def _broadcast(self, tensor, root, should_abort, out: torch.Tensor) -> None:
        self.wait(self.broadcast_async(tensor, root), should_abort)
        if tensor is not out:
            out.copy_(tensor.cpu())

    def close(self) -> None:
        """Abort the group: pending collectives on dead peers must not block anyone."""
        if self.pg is not None:
            try:
                self.pg.abort()
            except Exception:  # aborting an already broken group may raise; it is gone either way
                pass
            self.pg = None
        if self._ring_thread is not None:
            # after the abort: a send to a dead peer fails rather than blocking the join (a
            # thread still running when the process exits makes gloo call std::terminate)
            self._ring_thread.stop()
            self._ring_thread = None


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
