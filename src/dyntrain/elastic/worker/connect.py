"""Reaching a job's coordinator: its address, a connection to its store, its ``job/info``."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.errors import DyntrainError, Unreachable


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DyntrainError(f"coordinator address must be HOST:PORT, got {address!r}")
    return host, int(port)


def connect_store(address: str, timeout: float) -> dist.Store:
    """A client connection to the coordinator's TCPStore, with a one-line error if unreachable;
    under the job's secret (``DYNTRAIN_COORDINATOR_SECRET``) when the environment has one."""
    host, port = parse_address(address)
    _wait_for_listener(host, port, timeout)
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout),
                              wait_for_workers=False)
        secret = os.environ.get(p.ENV_SECRET)
        return dist.PrefixStore(secret, store) if secret else store
    except Exception as exc:  # torch raises RuntimeError/DistNetworkError with a long message
        raise Unreachable(
            f"cannot reach the coordinator at {host}:{port} within {timeout:g} s "
            f"({str(exc).splitlines()[0][:120]})"
        ) from None


def wait_job_info(store: dist.Store, address: str, timeout: float) -> dict:
    """The job's ``job/info`` (its run folder, who hosts it), waiting up to ``timeout`` seconds
    for the coordinator to publish it: a worker may connect between the moment the coordinator
    listens and the moment it publishes (a worker started with the launcher, on a loaded
    machine), and one that read nothing then trained without the run folder - its checkpoints
    and ``final.pt`` went nowhere, silently."""
    deadline, pause = time.monotonic() + timeout, 0.01
    while not store.check([p.JOB_INFO]):  # (store.wait logs a C++ warning on its timeout)
        if time.monotonic() >= deadline:
            raise Unreachable(f"the coordinator at {address} published no job within "
                              f"{timeout:g} s (no {p.JOB_INFO!r} in its store): is it a "
                              f"dyntrain job's coordinator?")
        time.sleep(pause)
        pause = min(0.2, pause * 1.5)
    return json.loads(store.get(p.JOB_INFO))


def _wait_for_listener(host: str, port: int, timeout: float) -> None:
    """Probe the port first: torch logs a C++ stack trace for every failed connect attempt."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, timeout))):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise Unreachable(f"cannot reach the coordinator at {host}:{port} within "
                                    f"{timeout:g} s ({exc.strerror or exc})") from None
            time.sleep(0.1)


def sever(address: str) -> int:
    """Shut down every connection of this process to ``address`` (HOST:PORT); how many.

    A TCPStore call on a connection whose peer went silent (its host cut off: nothing answers,
    nothing resets) blocks for good, whatever the store's timeout; shut down here, the blocked
    call returns with an error at once, as if the peer had closed it."""
    host, port = parse_address(address)
    cut = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = os.dup(int(name))
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # not a socket
            os.close(fd)
            continue
        with sock:
            try:
                peer = sock.getpeername()
            except OSError:
                continue
            if isinstance(peer, tuple) and peer[1] == port and \
                    str(peer[0]).removeprefix("::ffff:") == host:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    cut += 1
                except OSError:
                    pass
    return cut
