"""The supervisor's warm workers: forked on request by one zygote that imported torch once.

The zygote is ``python -m dyntrain.service.executors.warm --zygote`` (``warm.py``), started by the
supervisor with its own interpreter and environment at the first request that could use a warm
worker. Its stdin is one end of a Unix ``SOCK_SEQPACKET`` socketpair; the pool holds the other.
Messages, one per packet: the zygote says ``ready`` once its imports are done; the pool sends
``fork``; the zygote answers ``forked PID`` with the write end of the new worker's stdin pipe
attached (``SCM_RIGHTS``), or ``error WHY``.

The zygote double-forks: an intermediate child forks the worker and exits, and the supervisor,
a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), adopts the orphan before the zygote has
reaped the intermediate and answered. So a warm worker is the supervisor's own child like a cold
one: it is reaped, recorded and its group killed by the same code.

The pool keeps ``size`` workers ready (the first request's latency) and forks one on demand when
a request finds none, waiting up to ``ZYGOTE_ANSWER_S``: every eligible worker of a grow starts
warm, not just the first. A zygote that is gone (killed, import error) or does not answer means
cold starts from then on, with a line in the supervisor's log; workers it forked already stay
usable. The zygote is not restarted: what killed it would likely kill the next one too.

Standard library only: the supervisor, run by path, loads it from its file.
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import BinaryIO

ZYGOTE_ANSWER_S = 5.0  # how long a start waits for a worker forked on demand
WARM_MAX_FAILURES = 3  # ready warm workers that died unused before the pool gives up
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


class ZygoteState(enum.Enum):
    """Where the pool's zygote is."""

    NOT_STARTED = "not started"
    IMPORTING = "importing"  # started, not ready yet: starts are cold meanwhile
    READY = "ready"  # forks workers on request
    GONE = "gone"  # exited, killed, unanswering or let go: starts are cold


@dataclass
class WarmWorker:
    """A warm worker the zygote forked: the supervisor's child, waiting for one assignment on
    its stdin, whose write end this holds."""

    pid: int
    stdin: BinaryIO

    def assign(self, line: bytes) -> None:
        """Hand over the assignment (it becomes that worker); BrokenPipeError if it is gone."""
        try:
            self.stdin.write(line)
        finally:
            self.let_go()

    def let_go(self) -> None:
        """Close its stdin: unassigned, it exits."""
        try:
            self.stdin.close()
        except OSError:
            pass


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux); False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def log(line: str) -> None:
    """One line to the supervisor's log."""
    print(line, file=sys.stderr, flush=True)


class WarmPool:
    """Warm workers forked by one zygote, each waiting for one assignment; the supervisor reaps
    them (and the zygote) like its other children.

    Args:
        size: how many to keep ready (0: none, and no zygote).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.wanted = False  # set by the first request that could use a warm worker
        self.ready: dict[int, WarmWorker] = {}  # pid -> worker, oldest first
        self.failures = 0
        self.state = ZygoteState.NOT_STARTED
        self.zygote: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.pending = 0  # forks asked for and not answered yet

    def fill(self) -> None:
        """Start the zygote once wanted; keep ``size`` workers ready or asked for. A refill is
        asked for at once: a fork costs milliseconds and the new worker then waits on its stdin,
        so unlike the new interpreter of old (started 2 s later, not beside the start-up it had
        just saved) it takes no CPU from the worker that was handed the last one."""
        if not self.wanted or self.size == 0 or self.failures >= WARM_MAX_FAILURES:
            return
        if self.state is ZygoteState.NOT_STARTED:
            self._start_zygote()
        elif self.state is ZygoteState.READY:
            for _ in range(self.size - len(self.ready) - self.pending):
                self._ask()

    def fileno(self) -> int | None:
        """The zygote's socket while it may answer, for the supervisor's select."""
        alive = self.state in (ZygoteState.IMPORTING, ZygoteState.READY)
        return self.sock.fileno() if alive and self.sock is not None else None

    def receive(self, closed: str = "closed its socket") -> None:
        """Take the zygote's messages that arrived (without blocking); at the end of them, it
        is gone for the reason ``closed``."""
        while self.fileno() is not None:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 256, 1)  # (non-blocking)
            except BlockingIOError:
                return
            except OSError as e:
                data, fds = b"", []
                log(f"dyntrain warm zygote: {e}")
            text = data.decode(errors="replace")
            if not data:
                self._gone(closed)
            elif text == "ready":
                self.state = ZygoteState.READY
            elif text.startswith("forked ") and fds:
                self.pending -= 1
                pid = int(text.split()[1])
                self.ready[pid] = WarmWorker(pid, os.fdopen(fds.pop(0), "wb"))
            else:
                self.pending -= 1
                log(f"dyntrain warm zygote: {text}")
            for fd in fds:
                os.close(fd)

    def assign(self, req: dict) -> WarmWorker | None:
        """Hand ``req`` to a warm worker, ready or forked now; None when there is none (the
        worker starts cold)."""
        self.wanted = True
        if req.get("cwd") is not None and not os.path.isdir(req["cwd"]):
            return None  # the cold start reports it
        line = json.dumps({k: req.get(k) for k in ("argv", "env", "cwd", "log")}).encode() + b"\n"
        while True:
            worker = self._take()
            if worker is None:
                return None
            try:
                open(req["log"], "ab").close()  # fails here, like a cold start's, if it cannot
            except OSError:
                worker.let_go()
                raise
            try:
                worker.assign(line)
            except BrokenPipeError:  # it died before it was reaped: try the next one
                continue
            return worker

    def died(self, pid: int, status: int, killed: bool) -> None:
        """A child that is no worker exited: the zygote, a ready warm worker (it died unused),
        or an intermediate of a fork whose zygote died before reaping it."""
        if self.zygote is not None and pid == self.zygote.pid:
            self.zygote.returncode = status  # subprocess must not wait on it
            # the workers it forked and sent first are usable
            self.receive(f"was killed by signal {status}" if killed else f"exited with {status}")
            self._gone("exited")
            return
        worker = self.ready.pop(pid, None)
        if worker is not None:
            worker.let_go()
            self.failures += 1

    def close(self) -> None:
        """Let the zygote and the ready workers go (each exits at the end of its input)."""
        self.failures = WARM_MAX_FAILURES
        for worker in self.ready.values():
            worker.let_go()
        self.ready.clear()
        if self.state is ZygoteState.IMPORTING:  # no point finishing its imports
            os.kill(self.zygote.pid, signal.SIGKILL)
        self.state = ZygoteState.GONE
        if self.sock is not None:
            self.sock.close()

    def _start_zygote(self) -> None:
        if not become_subreaper():
            log("dyntrain warm zygote: cannot become a child subreaper: workers start cold")
            self.state = ZygoteState.GONE
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.zygote = subprocess.Popen(
                [sys.executable, "-m", "dyntrain.service.executors.warm", "--zygote"],
                stdin=theirs, stdout=sys.stderr.fileno(), start_new_session=True,
                close_fds=True)
        except OSError as e:
            log(f"dyntrain warm zygote: cannot start: {e}: workers start cold")
            ours.close()
            self.state = ZygoteState.GONE
            return
        finally:
            theirs.close()
        ours.setblocking(False)  # (socket.recv_fds drops its flags argument: no MSG_DONTWAIT)
        self.sock = ours
        self.state = ZygoteState.IMPORTING

    def _ask(self) -> None:
        try:
            self.sock.send(b"fork")
            self.pending += 1
        except OSError as e:
            self._gone(f"cannot be asked ({e})")

    def _take(self) -> WarmWorker | None:
        """The oldest ready worker; with none, one forked now (bounded wait)."""
        if not self.ready and self.state is ZygoteState.READY and self.failures < WARM_MAX_FAILURES:
            if not self.pending:
                self._ask()
            deadline = time.monotonic() + ZYGOTE_ANSWER_S
            while not self.ready and self.fileno() is not None and self.pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._gone(f"did not answer within {ZYGOTE_ANSWER_S:.0f} s")
                    break
                if select.select([self.sock], [], [], left)[0]:
                    self.receive()
        if not self.ready:
            return None
        return self.ready.pop(next(iter(self.ready)))

    def _gone(self, why: str) -> None:
        if self.state is ZygoteState.GONE:
            return
        pid = self.zygote.pid if self.zygote is not None else "?"
        log(f"dyntrain warm zygote {pid} {why}: workers start cold from now on")
        self.state = ZygoteState.GONE
        self.sock.close()  # a zygote still running exits at the end of its input
