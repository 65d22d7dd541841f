"""Local worker processes: start them, signal them, notice when they exit.

No process of a worker outlives it or the launcher: each worker leads a process group of its
own (with its loader processes and whatever else it starts), a worker is killed with its whole
group, and what is left of a group when its worker has exited is killed then; each worker, and
the fork server, is tied to the launcher (``dyntrain.lifeline``), so that they die with it
however it ends.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dyntrain.elastic.protocol import ENV_COORDINATOR, ENV_OUT, ENV_WORKER_ID
from dyntrain.launch.forkserver import ForkedProcess, ForkServer, wanted
from dyntrain.lifeline import die_with_parent

SIGNALS = {"leave": signal.SIGTERM, "kill": signal.SIGKILL, "hang": signal.SIGSTOP}


@dataclass
class LocalWorker:
    worker_id: str
    proc: subprocess.Popen | ForkedProcess
    log_path: Path
    signalled: str | None = None  # "leave" or "kill" when the launcher sent a signal
    ended: bool = False  # its exit was seen (and what was left of its group killed)

    def poll(self) -> int | None:
        """Its exit code once it has exited; the first time, what it left behind in its
        process group is killed (a pid is not reused while a group of that id has members). A
        forked worker's group is killed by the fork server, the moment it reaps the worker."""
        code = self.proc.poll()
        if code is not None and not self.ended:
            self.ended = True
            if isinstance(self.proc, subprocess.Popen):
                kill_group(self.proc.pid)
        return code


def kill_group(pgid: int) -> None:
    """SIGKILL to every process of a worker's group (the worker leads it: ``pgid`` is its pid)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # none is left
        pass


def start_fork_server(logs_dir: Path, extra_env: dict[str, str]) -> ForkServer:
    """The fork server for workers with this environment beside ours, logging into
    ``logs_dir/forkserver.log``. Started before the launcher starts any thread, it is forked from
    the launcher (see ``dyntrain.launch.forkserver``)."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    return ForkServer(logs_dir / "forkserver.log", {**os.environ, **extra_env})


class LocalWorkers:
    """Starts ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) as job workers.

    With ``fork_server`` (default: ``forkserver.wanted()``) they are forked from a process that
    has already imported torch (``dyntrain.launch.forkserver``); if it fails, plain processes.
    A started ``ForkServer`` (``start_fork_server``) may be passed instead; it is then ours.
    """

    def __init__(self, command: list[str], coordinator: str, out_dir: str | Path,
                 extra_env: dict[str, str] | None = None,
                 fork_server: ForkServer | bool | None = None,
                 logs_dir: Path | None = None) -> None:
        self.command, self.coordinator, self.out_dir = command, coordinator, str(out_dir)
        self.logs_dir = logs_dir or Path(out_dir) / "logs"  # out_dir may be a URL: logs stay here
        self.extra_env = extra_env or {}
        self.workers: dict[str, LocalWorker] = {}
        self._next = 0
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if isinstance(fork_server, ForkServer):
            self.server: ForkServer | None = fork_server
        else:
            use = wanted() if fork_server is None else fork_server
            self.server = start_fork_server(self.logs_dir, self.extra_env) if use else None
        self.forking = True  # workers are forked by the server while it answers

    @property
    def forks(self) -> bool:
        """Whether the next worker is forked by the fork server (a fresh process otherwise)."""
        return self.server is not None and self.forking

    def start(self) -> str:
        worker_id = f"w{self._next}"
        self._next += 1
        env = {**os.environ, **self.extra_env, ENV_COORDINATOR: self.coordinator,
               ENV_WORKER_ID: worker_id, ENV_OUT: self.out_dir, "PYTHONUNBUFFERED": "1",
               "LOCAL_RANK": str(self._next - 1)}
        log_path = self.log_path(worker_id)
        self.workers[worker_id] = LocalWorker(worker_id, self._spawn(env, log_path), log_path)
        return worker_id

    def _spawn(self, env: dict[str, str], log_path: Path) -> subprocess.Popen | ForkedProcess:
        if self.server is not None and self.forking and self.server.can_run(env):
            try:
                return self.server.start(self.command, env, log_path)
            except OSError as exc:
                with open(log_path, "a") as log:
                    log.write(f"dyntrain: {exc}; starting workers as new processes\n")
                # kept until the end: the workers it forked die with it, and it reports them
                self.forking = False
        with open(log_path, "ab") as log:
            # Tied to this thread (the launcher's main thread, which starts every worker).
            return subprocess.Popen([sys.executable, *self.command], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True,
                                    preexec_fn=functools.partial(die_with_parent, os.getpid()))

    def signal(self, worker_id: str, action: str) -> bool:
        """SIGTERM (leave) or SIGSTOP (hang) to a worker, SIGKILL (kill) to its whole process
        group (its loader processes too); False if not ours/alive."""
        w = self.workers.get(worker_id)
        if w is None or w.poll() is not None:
            return False
        w.signalled = action
        if action == "kill":
            kill_group(w.proc.pid)
        else:
            w.proc.send_signal(SIGNALS[action])
        return True

    def reap(self) -> list[tuple[str, int]]:
        """Workers that exited since the last call, with their exit codes."""
        exited = []
        for worker_id, w in list(self.workers.items()):
            code = w.poll()
            if code is not None:
                exited.append((worker_id, code))
                del self.workers[worker_id]
        return exited

    def alive(self) -> list[str]:
        return [w for w, lw in self.workers.items() if lw.poll() is None]

    @property
    def started(self) -> int:
        """How many workers were started, the exited ones included."""
        return self._next

    def stop_all(self, timeout: float = 20.0) -> None:
        """Give workers time to exit on their own, then terminate and kill what is left. A
        worker stopped with SIGSTOP (hang) cannot exit by itself: it is killed at once."""
        for w in self.workers.values():
            if w.signalled == "hang" and w.poll() is None:
                kill_group(w.proc.pid)
            try:
                w.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_group(w.proc.pid)
                w.proc.wait()
            w.poll()  # what it left behind is killed

    def close(self) -> None:
        """Stop the fork server (after the workers: it reports their exits, and a worker of
        it still running would die with it)."""
        if self.server is not None:
            self.server.close()
            self.server = None

    def log_path(self, worker_id: str) -> Path:
        """Where a local worker's stdout and stderr go (its traceback, when it failed)."""
        return self.logs_dir / f"worker-{worker_id}.log"

    def last_line(self, worker_id: str) -> str:
        """The last non-empty line a worker wrote (its error, when it failed)."""
        path = self.log_path(worker_id)
        try:
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""
