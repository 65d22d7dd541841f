"""The worker's side of the protocol: say hello, heartbeat, read control keys, await generations."""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.errors import DyntrainError

POLL_SECONDS = 0.005


class JobOver(Exception):
    """The job finished (or failed) while this worker was not a member."""

    def __init__(self, state: str) -> None:
        super().__init__(state)
        self.state = state


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DyntrainError(f"coordinator address must be HOST:PORT, got {address!r}")
    return host, int(port)


def connect_store(address: str, timeout: float) -> dist.TCPStore:
    """A client connection to the coordinator's TCPStore, with a one-line error if unreachable."""
    host, port = parse_address(address)
    _wait_for_listener(host, port, timeout)
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout),
                             wait_for_workers=False)
    except Exception as exc:  # torch raises RuntimeError/DistNetworkError with a long message
        raise DyntrainError(
            f"cannot reach the coordinator at {host}:{port} within {timeout:g} s "
            f"({str(exc).splitlines()[0][:120]})"
        ) from None


def _wait_for_listener(host: str, port: int, timeout: float) -> None:
    """Probe the port first: torch logs a C++ stack trace for every failed connect attempt."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, timeout))):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise DyntrainError(f"cannot reach the coordinator at {host}:{port} within "
                                    f"{timeout:g} s ({exc.strerror or exc})") from None
            time.sleep(0.1)


class WorkerChannel:
    """One worker's connection to its job's coordinator.

    Nothing on the training step's critical path waits for the store: messages go out through a
    sender thread (consecutive metrics rows packed into one message), and the control key of
    the current generation is polled by a watcher thread that also sends the heartbeat.
    """

    def __init__(self, address: str, worker_id: str | None = None, connect_timeout: float = 30.0,
                 heartbeat_interval: float = 0.5, watch_interval: float = 0.02) -> None:
        self.address = address
        self.worker = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.store = connect_store(address, connect_timeout)
        # Each thread gets its own connection; group creation blocks on keys in another thread.
        self.pg_store = connect_store(address, connect_timeout)
        self._send_store = connect_store(address, connect_timeout)
        self._watch_store = connect_store(address, connect_timeout)
        self.lost: str | None = None
        self._seq = 0
        self._outbox: queue.Queue[p.Message] = queue.Queue()
        self._stop = threading.Event()
        self._watched: int | None = None
        self._ctl: tuple[int, str, float] = (-1, p.CTL_RUN, 0.0)  # generation, value, when read
        threading.Thread(target=self._send_loop, daemon=True, name="dyntrain-sender").start()
        threading.Thread(target=self._watch_loop, args=(heartbeat_interval, watch_interval),
                         daemon=True, name="dyntrain-watcher").start()

    # ---- background threads -------------------------------------------------------------------

    def _watch_loop(self, heartbeat_interval: float, interval: float) -> None:
        beat_key, last_beat = p.heartbeat_key(self.worker), 0.0
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now - last_beat >= heartbeat_interval:
                    self._watch_store.add(beat_key, 1)
                    last_beat = now
                gen = self._watched
                if gen is not None:
                    value = self._watch_store.get(p.ctl_key(gen, self.worker)).decode()
                    self._ctl = (gen, value, time.monotonic())
            except Exception as exc:
                self.lost = f"lost the coordinator at {self.address}: {str(exc).splitlines()[0]}"
                return
            self._stop.wait(interval)

    def _send_loop(self) -> None:
        while True:
            batch = [self._outbox.get()]
            while not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            try:
                for msg in _pack_metrics(batch):
                    self._send_store.multi_set(
                        [p.inbox_key(self.worker, self._seq), p.inbox_count_key(self.worker)],
                        [msg.to_json(), str(self._seq + 1)])
                    self._seq += 1
            except Exception as exc:
                self.lost = f"lost the coordinator at {self.address}: {str(exc).splitlines()[0]}"
            finally:
                for _ in batch:
                    self._outbox.task_done()

    # ---- API ----------------------------------------------------------------------------------

    def close(self) -> None:
        self.flush()
        self._stop.set()

    def send(self, kind: str, **fields) -> None:
        """Queue a message for this worker's inbox (in order; see ``flush``)."""
        self._outbox.put(p.Message(kind, self.worker, fields))

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued message reached the store (before exiting, say)."""
        deadline = time.monotonic() + timeout
        while self._outbox.unfinished_tasks and time.monotonic() < deadline and not self.lost:
            time.sleep(0.002)

    def watch(self, generation: int) -> None:
        """Poll this generation's control key in the background from now on."""
        self._watched = generation

    def ctl(self, generation: int) -> str:
        """The control word for this worker in ``generation`` (run/reform/drain/abort)."""
        gen, value, when = self._ctl
        if gen == generation and time.monotonic() - when < 0.5:
            return value
        if self.lost:
            raise DyntrainError(self.lost)
        return self.store.get(p.ctl_key(generation, self.worker)).decode()

    def hello(self, fingerprint: str, config: dict) -> None:
        self.send("hello", fingerprint=fingerprint, config=config, host=socket.gethostname(),
                  pid=os.getpid())
        self.flush()  # the roster entry must not overtake the hello message
        self.store.append(p.ROSTER, self.worker + " ")
        self.store.add(p.ROSTER_COUNT, 1)

    def job_state(self) -> str:
        return self.store.get(p.JOB_STATE).decode()

    def wait_generation(self, after: int, should_stop) -> p.Generation | None:
        """Block until a generation numbered above ``after`` includes this worker.

        Returns None when ``should_stop()`` turns true or the coordinator tells this worker to
        leave; raises JobOver when the job ends and
        DyntrainError when the coordinator rejects this worker or is lost.
        """
        scanned = after
        while True:
            if self.lost:
                raise DyntrainError(self.lost)
            if self.store.check([p.reply_key(self.worker)]):
                reply = self.store.get(p.reply_key(self.worker)).decode()
                if reply == "leave":  # drained while its generation was being torn down
                    return None
                raise DyntrainError(f"the coordinator rejected this worker: {reply[7:]}")
            state = self.job_state()
            if state != "running":
                raise JobOver(state)
            latest = int(self.store.get(p.GEN_LATEST))
            for number in range(scanned + 1, latest + 1):
                gen = p.Generation.from_json(self.store.get(p.gen_key(number)))
                scanned = number
                if self.worker in gen.members:
                    return gen
            if should_stop():
                return None
            time.sleep(POLL_SECONDS)

    def job_info(self) -> dict:
        if self.store.check([p.JOB_INFO]):
            return json.loads(self.store.get(p.JOB_INFO))
        return {}


def _pack_metrics(batch: list[p.Message]) -> list[p.Message]:
    """Merge runs of consecutive metrics messages into one message carrying their rows."""
    packed: list[p.Message] = []
    for msg in batch:
        if msg.kind == "metrics" and packed and packed[-1].kind == "metrics":
            packed[-1].fields["rows"].append(msg.fields)
        elif msg.kind == "metrics":
            packed.append(p.Message("metrics", msg.worker, {"rows": [msg.fields]}))
        else:
            packed.append(msg)
    return packed
