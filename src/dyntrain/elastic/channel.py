"""The worker's side of the protocol: say hello, heartbeat, read control keys, await generations."""

from __future__ import annotations

import json
import os
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
    """One worker's connection to its job's coordinator."""

    def __init__(self, address: str, worker_id: str | None = None, connect_timeout: float = 30.0,
                 heartbeat_interval: float = 0.5) -> None:
        self.address = address
        self.worker = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.store = connect_store(address, connect_timeout)
        self._seq = 0
        self._lock = threading.Lock()
        self.lost: str | None = None
        self._stop = threading.Event()
        self._heartbeat_store = connect_store(address, connect_timeout)
        # Group creation blocks on store keys in another thread: it gets its own connection.
        self.pg_store = connect_store(address, connect_timeout)
        self._heartbeat = threading.Thread(target=self._beat, args=(heartbeat_interval,),
                                           daemon=True, name="dyntrain-heartbeat")
        self._heartbeat.start()
        self._gens: dict[int, p.Generation] = {}

    def _beat(self, interval: float) -> None:
        key = p.heartbeat_key(self.worker)
        while not self._stop.is_set():
            try:
                self._heartbeat_store.add(key, 1)
            except Exception as exc:
                self.lost = f"lost the coordinator at {self.address}: {str(exc).splitlines()[0]}"
                return
            self._stop.wait(interval)

    def close(self) -> None:
        self._stop.set()

    def send(self, kind: str, **fields) -> None:
        """Append a message to this worker's inbox."""
        msg = p.Message(kind, self.worker, fields).to_json()
        with self._lock:
            self.store.set(p.inbox_key(self.worker, self._seq), msg)
            self._seq += 1
            self.store.set(p.inbox_count_key(self.worker), str(self._seq))

    def hello(self, fingerprint: str, config: dict) -> None:
        self.send("hello", fingerprint=fingerprint, config=config, host=socket.gethostname(),
                  pid=os.getpid())
        self.store.append(p.ROSTER, self.worker + " ")

    def ctl(self, generation: int) -> str:
        return self.store.get(p.ctl_key(generation, self.worker)).decode()

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
