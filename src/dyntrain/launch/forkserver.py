"""Start local workers in milliseconds: fork them from a process that has imported torch once.

A fresh worker spends 2.5 s (an idle 2-core machine) to 10 s (a loaded one) importing torch and
``torch._dynamo`` (which every ``optimizer.step()`` imports) before it can say hello, and a job
with N workers pays it N times at once. ``dyntrain run`` therefore starts one fork server per
run: the server imports what a worker imports, then forks a child per request, which becomes the
worker: its own session, its log as stdout and stderr, the requested environment, working
directory and command line, run the way ``python SCRIPT`` or ``python -m MODULE`` runs it. The
launcher sees each child through ``ForkedProcess``, which acts like the ``subprocess.Popen`` of a
normal start (poll, wait, signals, the exit code).

The launcher has imported torch already (its coordinator's store is torch's), so where it can it
forks the server from itself (``_fork_server``) instead of starting ``python -m
dyntrain.launch.forkserver``, which would import torch a second time (2-3 s of CPU on each
``dyntrain run``). It can while no other Python thread runs (it starts the server before its
store and anything else that starts threads) on a CPU build of torch; the forked server drops
what it inherited: every file descriptor but its pipes and log, exit handlers, signal handlers,
the standard streams and the environment, and its workers exit as ``python`` would, without
its teardown (``dyntrain.mainexit``).

The server never computes with torch and runs no Python threads, so the children inherit no
locked state; it does not initialise CUDA (importing torch does not), and it is used only where
no GPU can be used (a CPU build of torch, or a CUDA build on a machine without a GPU, as
``pip install torch`` gives on most Linux machines) unless ``DYNTRAIN_FORKSERVER=1`` asks for it
(it was not tried on GPUs).
The server dies with the launcher, and each worker with the server (``dyntrain.lifeline``),
however they end: none outlives the run; when a worker exits, the server kills what it left in
its process group.
``DYNTRAIN_FORKSERVER=0`` turns it off; workers are then started as plain processes, as they
are whenever the server is not available and for a worker whose environment differs from the
server's in more than per-worker variables (an interpreter reads PYTHONHASHSEED, PYTHONPATH and
the like when it starts).
"""

from __future__ import annotations

import atexit
import functools
import gc
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

from dyntrain.lifeline import die_with_parent
from dyntrain.mainexit import run_as_main

ENV_SWITCH = "DYNTRAIN_FORKSERVER"
# What a worker imports before its first step; the server imports it once for all of them.
WARM = ("torch", "torch._dynamo", "torch.distributed", "numpy", "dyntrain.elastic.trainer")
# Set per worker; none is read when an interpreter starts, so a forked child may take them.
PER_WORKER = ("DYNTRAIN_", "PYTHONUNBUFFERED", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")
READY_TIMEOUT = 120.0
REPLY_TIMEOUT = 30.0


def wanted() -> bool:
    """Whether ``dyntrain run`` should start its workers through a fork server."""
    switch = os.environ.get(ENV_SWITCH, "")
    if switch in ("0", "1"):
        return switch == "1"
    import torch

    cpu_build = torch.version.cuda is None and getattr(torch.version, "hip", None) is None
    # asked in the launcher, never in the server: the server's children must not inherit CUDA
    return cpu_build or not torch.cuda.is_available()


class _Polled:
    """``subprocess.Popen``'s ``wait`` for a process whose ``poll`` is its own."""

    pid: int
    returncode: int | None
    what = "process"

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"{self.what} pid {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode


class ForkedProcess(_Polled):
    """A worker forked by the server, seen like a ``subprocess.Popen``."""

    what = "worker"

    def __init__(self, server: ForkServer, pid: int, request: int) -> None:
        self.server, self.pid, self.request = server, pid, request
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.request, self.pid)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launcher's side: starts the server, asks it for workers, learns their exit codes."""

    def __init__(self, log_path: Path, env: dict[str, str] | None = None,
                 fork: bool | None = None) -> None:
        """Start the server.

        Args:
            log_path: where the server's own messages go.
            env: the environment it runs with (default: this process's); only workers with the
                same environment, apart from per-worker variables, are forked from it.
            fork: fork it from this process (True; only where ``can_fork_here()``) or start
                ``python -m dyntrain.launch.forkserver`` (False); None: fork where it can.
        """
        self.env = dict(os.environ) if env is None else dict(env)
        self.forked = can_fork_here() if fork is None else fork
        if self.forked:
            self.proc: subprocess.Popen | ServerProcess = _fork_server(log_path, self.env)
        else:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-u", "-m", "dyntrain.launch.forkserver"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                    start_new_session=True, env=self.env,
                    preexec_fn=functools.partial(die_with_parent, os.getpid()))
        self._replies: dict[int, int] = {}  # request number -> pid
        # request number -> exit code: not by pid, which a later worker may be given again (the
        # kernel reuses pids: 32768 of them on many hosts)
        self._exits: dict[int, int] = {}
        self._ready = threading.Event()
        self._cond = threading.Condition()
        self._next = 0
        threading.Thread(target=self._read, daemon=True, name="dyntrain-forkserver").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._cond:
                if "ready" in msg:
                    self._ready.set()
                elif "pid" in msg:
                    self._replies[msg["request"]] = msg["pid"]
                elif "exit" in msg:
                    self._exits[msg["request"]] = msg["code"]
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def can_run(self, env: dict[str, str]) -> bool:
        """Whether a worker with this environment may be forked: apart from per-worker
        variables it must be the server's own (PYTHONHASHSEED, PYTHONPATH and the like are read
        when an interpreter starts)."""
        keys = {k for k in set(env) | set(self.env) if not k.startswith(PER_WORKER)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def start(self, argv: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
        """Fork a worker running ``python ARGV...``; raises OSError if the server cannot."""
        if not self._ready.wait(READY_TIMEOUT) or self.proc.poll() is not None:
            raise OSError("the fork server did not start")
        with self._cond:
            number, self._next = self._next, self._next + 1
        request = {"request": number, "argv": argv, "env": env, "log": str(log_path),
                   "cwd": os.getcwd()}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        with self._cond:
            if not self._cond.wait_for(lambda: number in self._replies
                                       or self.proc.poll() is not None, REPLY_TIMEOUT):
                raise OSError("the fork server did not answer")
            if number not in self._replies:
                raise OSError("the fork server exited")
            return ForkedProcess(self, self._replies.pop(number), number)

    def exit_code(self, request: int, pid: int) -> int | None:
        """The exit code of the worker forked for ``request`` (as ``pid``); None while alive."""
        with self._cond:
            code = self._exits.pop(request, None)
        if code is None and self.proc.poll() is not None and not _exists(pid):
            return 1  # the server died before it could report this exit: its code is lost
        return code

    def close(self) -> None:
        """Stop the server; a worker of it still running dies with it (``dyntrain.lifeline``)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ServerProcess(_Polled):
    """The fork server forked from this process, seen like the ``subprocess.Popen`` of one started
    as ``python -m dyntrain.launch.forkserver`` (its pipes, poll, wait, kill)."""

    what = "fork server"

    def __init__(self, pid: int, stdin: io.BufferedWriter, stdout: io.BufferedReader) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def can_fork_here() -> bool:
    """Whether the server may be forked from this process: a CPU build of torch is imported
    (so no CUDA state to inherit) and no other Python thread runs (no lock such a thread holds
    is copied into the child; the native pool numpy's OpenBLAS starts shuts itself down at a
    fork). The launcher checks this before its store starts the store's native threads."""
    torch = sys.modules.get("torch")
    if os.environ.get(ENV_SWITCH) == "1" or torch is None or torch.version.cuda is not None \
            or getattr(torch.version, "hip", None) is not None:
        return False
    return threading.active_count() == 1


def _fork_server(log_path: Path, env: dict[str, str]) -> ServerProcess:
    """Fork the server from this process; the child never returns from here."""
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # what is buffered here is written once, by this process
    gc.collect()  # garbage of this process is freed here, not (closing reused fds) in the child
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        die_with_parent(launcher)
        _forked_server(requests_r, replies_w, str(log_path), env)
    os.close(requests_r)
    os.close(replies_w)
    return ServerProcess(pid, open(requests_w, "wb"), open(replies_r, "rb"))


_INHERITED: list = []  # the launcher's streams: kept, so that freeing them closes no fd


def _forked_server(requests: int, replies: int, log_path: str, env: dict[str, str]) -> NoReturn:
    """In the forked child: become the server, as ``python -u -m dyntrain.launch.forkserver``
    started with ``env`` would be, then serve; a worker forked from it runs and exits here."""
    try:
        os.setsid()
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(requests, 0)
        os.dup2(replies, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 20)  # the launcher's store socket, files, pipes: none is ours
        gc.freeze()
        atexit._clear()
        signal.set_wakeup_fd(-1)
        for sig in signal.valid_signals():
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threads = env.get("OMP_NUM_THREADS", "")
        if threads != os.environ.get("OMP_NUM_THREADS", "") and threads.isdigit() \
                and int(threads) > 0:  # read when torch loaded: set as that read would have
            sys.modules["torch"].set_num_threads(int(threads))
        os.environ.clear()
        os.environ.update(env)
        _INHERITED.extend((sys.stdin, sys.stdout, sys.stderr))
        sys.stdin = open(0, closefd=False)
        sys.stdout, sys.stderr = (io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False),
                                                   errors=errors, write_through=True)
                                  for fd, errors in ((1, "strict"), (2, "backslashreplace")))
        request = _serve()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    if request is None:
        os._exit(0)
    run_as_main(lambda: _become_worker(request))


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- the server ---------------------------------------------------------------------------------


def _serve() -> dict | None:
    """Answer requests until stdin closes (None); in a forked child, return its request."""
    import importlib

    for name in WARM:
        importlib.import_module(name)
    _reply({"ready": True})
    pending, children = b"", {}  # pid -> request number
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                return None
            pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            request["server"] = os.getpid()
            pid = os.fork()
            if pid == 0:
                die_with_parent(request["server"])
                return request
            children[pid] = request["request"]
            _reply({"request": request["request"], "pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                _kill_group(pid)  # what the worker left behind (its loader processes)
                _reply({"exit": pid, "request": children.pop(pid),
                        "code": os.waitstatus_to_exitcode(status)})


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # none is left
        pass


def _reply(msg: dict) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def _become_worker(request: dict) -> None:
    """In the forked child: take the worker's session, files, environment and command line, and
    run it as ``python`` would; the interpreter then exits with its code."""
    import runpy

    from dyntrain.elastic.numerics import apply, numerics_from_env

    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # the server's unread requests are not the worker's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    pinned = numerics_from_env()  # the job's numerics, before the script runs
    if pinned is not None:
        apply(pinned)
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    _request = _serve()
    if _request is None:
        os._exit(0)  # nothing to clean up; tearing down a torch interpreter takes seconds
    _become_worker(_request)
