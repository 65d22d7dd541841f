"""One worker's process on a Ray node: what the Ray executor's detached actor runs.

Light to import (Ray imports this module on every node). The actor starts the worker's command
as the leader of a new session, from a thread that lives exactly as long as the command
(so ``PR_SET_PDEATHSIG`` kills the command if the actor's process dies: a node that goes away
takes its workers with it, as a reclaimed host would). Output goes to a log file on the node,
which the service reads back in pieces (``read_log``). When the command exits, the actor kills
what it left in its process group and keeps the exit (code or signal, end time) until the
service, having stored it, discards the actor. So an exit that no service watched is still there
for the next one to read.

A node cut off from the cluster by the network keeps running: Ray declares it dead (its health
checks) and the service starts the work elsewhere, but the raylet, the actor and the command
live on (measured: a node declared dead 12 s after its link went down ran its command for 50 s,
30 s of them after the link came back). So the actor fences its command itself: while the
command runs, the actor connects to the cluster's GCS every second, and once no connection has
succeeded for ``fence_seconds`` it SIGKILLs the command's process group and records the exit as
lost (``{"lost": why}``). The service reports a worker whose node died only ``fence_seconds``
(and a margin) later, so the work never runs twice at the same time.
"""

from __future__ import annotations

import functools
import os
import signal as _signal
import socket
import subprocess
import threading
import time

from dyntrain.elastic.numerics import KernelLevel, host_levels, level_refusal
from dyntrain.lifeline import die_with_parent
from dyntrain.service.executors.main_node import free_port, local_interface, main_node_env
from dyntrain.service.executors.runnable import start_problem

FENCE_PROBE_S = 1.0  # how often (and how long at most) the actor connects to the GCS
MAIN_ASK_S = 1.0  # how long each look for a gang's main worker waits


def _has_ended(pid: int) -> bool:
    """True once the (not yet reaped) child ``pid`` has exited."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


class WorkerProcess:
    """Runs, signals and outlives one worker command on the node it was placed on."""

    def __init__(self, log_dir: str, fence_seconds: float = 0.0,
                 start_timeout: float = 120.0) -> None:
        """``fence_seconds``: kill the command once the GCS has been unreachable this long
        (0: never). ``start_timeout``: how long a gang's worker waits for its main worker to
        be placed."""
        self._log_dir = log_dir
        self._fence_seconds = fence_seconds
        self._start_timeout = start_timeout
        self._main_lock = threading.Lock()
        self._main: dict | None = None  # this node's address and port, as the main worker
        self._fenced: str | None = None  # why the command was killed for being cut off
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._pid: int | None = None
        self._log: str | None = None
        self._exit: dict | None = None
        self._started_at = 0.0
        self._cancelled: str | None = None  # signalled before its command started

    def start(self, worker_id: str, argv: list[str], env: dict[str, str],
              cwd: str | None, main: str | None = None, namespace: str | None = None,
              cpu_kernels: str | None = None) -> dict:
        """Start the command; ``{"pid", "node", ...}``, ``{"error": one line}`` (the command
        cannot run: this node's CPU cannot run the job's ``cpu_kernels`` level, say) or
        ``{"lost": one line}`` (its gang's main worker was never placed).

        ``main``: the actor name (in ``namespace``) of the gang's main worker, whose node's
        address and port go into the main-node variables (``main_node.py``) first."""
        import ray  # only ever called inside a Ray actor

        if cpu_kernels is not None:
            refused = level_refusal(KernelLevel(cpu_kernels), host_levels(),
                                    f"node {socket.gethostname()}")
            if refused is not None:
                return {"error": refused}

        full = dict(os.environ)
        full.update(env)
        # the devices Ray assigned to this actor (none: no device is visible)
        full["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in ray.get_gpu_ids())
        where = f"on node {socket.gethostname()}"
        if main is not None:
            found = self._ask_main(main, namespace)
            if isinstance(found, dict):
                address, port = found["address"], found["port"]
                full.update(main_node_env(env, address, port, local_interface(address, port)))
            elif self._cancelled is None:  # (cancelled: said below)
                return {"lost": f"{found} ({where})"}
        with self._lock:  # a signal that comes first cancels the start
            if self._cancelled is not None:
                return {"error": f"SIG{self._cancelled} before it started {where}"}
            problem = start_problem(argv, cwd, full)
            if problem is not None:
                return {"error": f"{problem} {where}"}
            os.makedirs(self._log_dir, exist_ok=True)
            self._log = os.path.join(self._log_dir, f"{worker_id}.log")
            started: list = []
            ready = threading.Event()
            threading.Thread(target=self._run, args=(argv, full, cwd, started, ready),
                             daemon=True, name=f"worker-{worker_id}").start()
            ready.wait()
            if isinstance(started[0], BaseException):
                return {"error": f"cannot start {argv[0]!r} {where}: {started[0]}"}
            self._pid = started[0]
        context = ray.get_runtime_context()
        if self._fence_seconds > 0:
            threading.Thread(target=self._fence, args=(context.gcs_address,), daemon=True,
                             name=f"fence-{worker_id}").start()
        return {"pid": self._pid, "host": socket.gethostname(), "node": context.get_node_id()}

    def main_node(self) -> dict:
        """As a gang's main worker: this node's address and a port free on it, the same
        for every worker of the gang that asks."""
        import ray  # only ever called inside a Ray actor

        with self._main_lock:
            if self._main is None:
                self._main = {"address": ray.util.get_node_ip_address(), "port": free_port()}
            return self._main

    def _ask_main(self, main: str, namespace: str | None) -> dict | str:
        """The main worker's ``main_node()``, or why it could not be had: it is asked once
        both actors are placed, for at most ``start_timeout`` seconds (or until a signal
        cancels this start)."""
        import ray  # only ever called inside a Ray actor

        if main == ray.get_runtime_context().get_actor_name():
            return self.main_node()
        deadline = time.monotonic() + self._start_timeout
        reply = None
        while self._cancelled is None and time.monotonic() < deadline:
            try:
                if reply is None:
                    reply = ray.get_actor(main, namespace=namespace).main_node.remote()
                return ray.get(reply, timeout=MAIN_ASK_S)
            except ValueError:  # not registered yet: the service creates it beside this one
                time.sleep(MAIN_ASK_S)
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayActorError as exc:
                return f"its gang's main worker {main} ended before it was placed: {exc}"
        return f"its gang's main worker {main} was not placed within {self._start_timeout:g} s"

    def _fence(self, gcs_address: str) -> None:
        """Kill the command once no connection to the GCS succeeded for ``fence_seconds``
        (see the module docstring). Time is counted from the first failed connection, so a
        thread that was not scheduled for a while does not kill a command that is not cut off."""
        host, _, port = gcs_address.rpartition(":")
        cut_since: float | None = None
        while not self._ended.wait(FENCE_PROBE_S):
            try:
                with socket.create_connection((host, int(port)), timeout=FENCE_PROBE_S):
                    cut_since = None
                    continue
            except OSError as exc:
                now = time.monotonic()
                cut_since = now if cut_since is None else cut_since
                if now - cut_since < self._fence_seconds:
                    continue
                why = (f"cut off from the Ray cluster: no connection to its GCS at "
                       f"{gcs_address} for {now - cut_since:.0f} s ({exc.strerror or exc})")
            with self._lock:  # a command that ended on its own keeps its exit
                if self._exit is None and not _has_ended(self._pid):
                    self._fenced = why
                    os.killpg(self._pid, _signal.SIGKILL)
            return

    def _run(self, argv, env, cwd, started: list, ready: threading.Event) -> None:
        """Start the command, then wait for it in this same thread (see the module docstring)."""
        try:
            with open(self._log, "wb", buffering=0) as log:
                proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True,
                                        preexec_fn=functools.partial(die_with_parent,
                                                                     os.getpid()))
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            started.append(exc)
            ready.set()
            return
        self._started_at = time.time()
        started.append(proc.pid)
        ready.set()
        # Not reaped yet: its pid, and so its process group's id, stay ours until the exit is
        # recorded and its leftovers are killed.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        with self._lock:
            try:
                os.killpg(proc.pid, _signal.SIGKILL)
            except OSError:
                pass
            code = proc.wait()
            record = {"ended_at": time.time()}
            if code < 0:
                record["signal"] = -code
            else:
                record["exit_code"] = code
            if self._fenced is not None:
                record["lost"] = self._fenced
            self._exit = record
        self._ended.set()

    def status(self) -> dict:
        """``{"running": True}``, the exit record, or ``{"started": False}`` (never started)."""
        if self._pid is None:
            return {"started": False}
        return self._exit or {"running": True, "pid": self._pid}

    def wait_exit(self, timeout: float) -> dict | None:
        """The exit record once the command has ended (None after ``timeout`` seconds)."""
        return self._exit if self._ended.wait(timeout) else None

    def signal(self, sig: str) -> None:
        """``"TERM"`` or ``"KILL"`` to the command's process group; nothing once it ended."""
        with self._lock:
            if self._pid is None:
                self._cancelled = sig
            elif self._exit is None:
                try:
                    os.killpg(self._pid, getattr(_signal, f"SIG{sig}"))
                except ProcessLookupError:
                    pass

    def read_log(self, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of the command's output from ``offset`` on."""
        if self._log is None:
            return b""
        try:
            with open(self._log, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except OSError:
            return b""

    def discard(self) -> None:
        """The service stored the exit: remove the log and end this actor."""
        self.signal("KILL")
        if self._log is not None:
            try:
                os.unlink(self._log)
                os.rmdir(self._log_dir)  # the service's last worker on this node: no folder left
            except OSError:
                pass
        import ray  # only ever called inside a Ray actor

        ray.actor.exit_actor()
