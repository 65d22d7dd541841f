"""The local executor: worker processes on this machine, within a fixed cpu/gpu/memory budget.

Workers are started by one supervisor process per executor (``supervisor.py``, started on the
first ``start()``, in a session of its own so that it outlives a killed service). Each worker is
the leader of a new session, so ``os.killpg`` reaches every process it started. The supervisor
reaps each worker and writes its exit status (exit code or signal, end time) to
``<state_dir>/workers/<worker_id>.status.json`` before the pid goes away; that file is how a
restarted service learns how a worker it did not start itself ended, and, while the worker runs,
where it is. No Python interpreter starts per worker: a worker costs one fork and exec.

With ``warm_workers`` the supervisor also keeps that many warm workers ready (``warm.py``: Python
with torch imported, forked by one zygote that imported it once); a worker whose command and
environment allow it (``warm.eligible``: this interpreter running a script or module, nothing
read at start-up changed) becomes one of them, or one forked for it at once when none is ready,
instead of starting a new interpreter, and so skips the seconds of importing torch. Each warm
worker serves one worker, then exits like any other. The zygote starts with the first worker
that could have used one (which starts cold, as do those started while it imports).

A handle's ref is ``"<pid>:<start time>"`` (field 22 of ``/proc/<pid>/stat``, clock ticks since
boot): a pid alone may have been reused by an unrelated process by the time it is adopted.

When a worker exits, processes it left behind in its group are killed, so that the resources it
is released from really are free.
"""

from __future__ import annotations

import os
import select
import signal as _signal
import socket
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dyntrain.elastic.numerics import KernelLevel, host_levels, level_refusal
from dyntrain.procstat import read_stat
from dyntrain.service.core.executor import (
    SIGNALS,
    Executor,
    ExecutorError,
    StartError,
    WorkerExit,
    WorkerHandle,
    WorkerSpec,
    check_worker_id,
    describe,
    exit_from_record,
    make_resources,
)
from dyntrain.service.core.model import Resources
from dyntrain.service.executors.journal import journal_entry, read_status
from dyntrain.service.executors.machine import detect_gpus, mem_total_mib
from dyntrain.service.executors.runnable import start_problem
from dyntrain.service.executors.supervisor import GONE, SupervisorLink
from dyntrain.service.executors.warm import eligible

_EPS = 1e-9
PREDECESSOR_WAIT_S = 30.0  # how long a restarted service waits for an old supervisor to read on


@dataclass
class _Worker:
    spec: WorkerSpec
    handle: WorkerHandle
    pid: int
    start_time: int
    supervised: bool  # by this executor's supervisor, which reports its exit
    exit: WorkerExit | None = None  # set when known to be over but not reported yet
    holds: bool = True  # counts against capacity until reported
    pending: bool = False  # sent to the supervisor, not answered yet (pid unknown)
    link: SupervisorLink | None = None  # the supervisor that will answer, while pending
    deferred: str | None = None  # a signal sent while pending, delivered once it runs


class LocalExecutor(Executor):
    """Runs workers as process groups on this machine; see the module docstring."""

    name = "local"

    def __init__(self, state_dir: str | os.PathLike, cpus: float | None = None,
                 gpus: int | Iterable[int] | None = None, memory_mib: int | None = None,
                 inherit_env: bool = True, warm_workers: int = 0,
                 kernel_levels: Iterable[KernelLevel] | None = None) -> None:
        """``gpus``: None detects CUDA devices, an int n means devices 0..n-1, a list names
        them. ``inherit_env``: workers get this process's environment plus their spec's.
        ``warm_workers``: Python processes with torch imported kept ready for workers that can
        use one (``warm.py``; each costs the memory of a process that imported torch).
        ``kernel_levels``: the CPU kernel levels this machine runs (None: what its CPU has,
        ``host_levels()``); a worker pinned to another is refused at start."""
        self._cpus = float(os.cpu_count() or 1) if cpus is None else float(cpus)
        self._memory = mem_total_mib() if memory_mib is None else int(memory_mib)
        if gpus is None:
            gpu_list = detect_gpus()
        elif isinstance(gpus, int):
            gpu_list = list(range(gpus))
        else:
            gpu_list = [int(g) for g in gpus]
        if self._cpus <= 0 or self._memory <= 0 or len(set(gpu_list)) != len(gpu_list) or any(
                g < 0 for g in gpu_list):
            raise ExecutorError(f"local executor needs cpus > 0, memory_mib > 0 and distinct "
                                f"gpu indices >= 0, got cpus={self._cpus}, gpus={gpu_list}, "
                                f"memory_mib={self._memory}")
        self._gpus = gpu_list
        self._levels = tuple(host_levels() if kernel_levels is None else kernel_levels)
        self._inherit_env = inherit_env
        self._dir = Path(state_dir) / "workers"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._workers: dict[str, _Worker] = {}
        self._refused: dict[str, ExecutorError] = {}  # sent by send_starts, refused at once
        self._lock = threading.RLock()
        self._closed = False
        self._link: SupervisorLink | None = None
        self._settled = False
        if warm_workers < 0:
            raise ExecutorError(f"warm_workers must be >= 0, got {warm_workers}")
        self._warm = warm_workers if inherit_env else 0
        self._base_env: dict[str, str] = {}  # the supervisor's, and so its warm workers'

    # -- accounting -------------------------------------------------------------------------

    def capacity(self) -> Resources:
        return make_resources(self._cpus, len(self._gpus), self._memory)

    def kernel_levels(self) -> tuple[KernelLevel, ...]:
        return self._levels

    def _used_gpus(self) -> set[int]:
        return {g for w in self._workers.values() if w.holds for g in w.handle.gpus}

    def _free_gpus(self) -> list[int]:
        used = self._used_gpus()
        return [g for g in self._gpus if g not in used]

    def free(self) -> Resources:
        with self._lock:
            held = [w.spec.resources for w in self._workers.values() if w.holds]
            cpus = round(self._cpus - sum(r.cpus for r in held), 6)
            memory = self._memory - sum(r.memory_mib for r in held)
            return make_resources(max(cpus, 0.0), len(self._free_gpus()), max(memory, 0))

    def status_path(self, worker_id: str) -> Path:
        """Where the supervisor of ``worker_id`` records where it runs and how it ended."""
        return self._dir / f"{worker_id}.status.json"

    # -- starting ---------------------------------------------------------------------------

    def start(self, spec: WorkerSpec) -> WorkerHandle:
        [result] = self.start_many([spec])
        if isinstance(result, ExecutorError):
            raise result
        return result

    def start_many(self, specs: list[WorkerSpec]) -> list[WorkerHandle | ExecutorError]:
        """Start several workers with one exchange with the supervisor (the requests travel
        together, the answers come back together)."""
        with self._lock:
            out = self._send(specs)
            sent = [s.worker_id for s, e in zip(specs, out, strict=True) if e is None]
            links = {id(w.link): w.link for i in sent if (w := self._workers[i]).link}
            for link in links.values():
                while link.open and not all(i in link.answers for i in sent
                                            if self._workers[i].link is link):
                    link.drain(timeout=5.0)
            done = self._collect(sent)
            return [e if e is not None else done[s.worker_id]
                    for s, e in zip(specs, out, strict=True)]

    def send_starts(self, specs: list[WorkerSpec]) -> None:
        """Send the starts to the supervisor without waiting for the children to exec (1-5 ms
        each on a loaded machine); ``started()`` hands over the answers."""
        with self._lock:
            for spec, error in zip(specs, self._send(specs), strict=True):
                if error is not None:
                    self._refused[spec.worker_id] = error

    def started(self) -> dict[str, WorkerHandle | ExecutorError]:
        with self._lock:
            self._take_exits()
            out, self._refused = self._refused, {}
            out.update(self._collect([i for i, w in self._workers.items() if w.pending]))
            return out

    def _send(self, specs: list[WorkerSpec]) -> list[ExecutorError | None]:
        """Send the requests of ``specs`` that fit and can run (held at once, pending until
        answered); for each spec, the error that kept it back, or None."""
        self._check_open()
        out: list[ExecutorError | None] = []
        requests = []
        for spec in specs:
            try:
                gpus, request = self._request(spec)
            except ExecutorError as e:
                out.append(e)
                continue
            out.append(None)
            requests.append(request)
            # held at once, so that the next spec's accounting sees it
            self._workers[spec.worker_id] = _Worker(spec, WorkerHandle(
                spec.worker_id, self.name, "", gpus), 0, 0, supervised=True, pending=True)
        if requests:
            link = self._supervisor()
            link.send(requests)
            for request in requests:
                self._workers[request["id"]].link = link
        return out

    def _collect(self, ids: list[str]) -> dict[str, WorkerHandle | ExecutorError]:
        """The answers that arrived for the pending workers ``ids``: handle or error."""
        out: dict[str, WorkerHandle | ExecutorError] = {}
        for wid in ids:
            w = self._workers[wid]
            link = w.link
            answer = link.answers.pop(wid, None)
            if answer is None:
                if not link.open:
                    del self._workers[wid]
                    out[wid] = ExecutorError(f"cannot start: {GONE}")
                continue
            if answer["op"] == "failed":
                del self._workers[wid]
                out[wid] = StartError(f"cannot start {w.spec.argv[0]!r}: {answer['error']}")
                continue
            w.pid, w.start_time = answer["pid"], answer["start_time"]
            w.handle = WorkerHandle(wid, self.name, f"{w.pid}:{w.start_time}", w.handle.gpus)
            w.pending, w.link, w.supervised = False, None, link.open
            if w.deferred is not None and w.exit is None:
                _killpg(w.pid, getattr(_signal, f"SIG{w.deferred}"))
            out[wid] = w.handle
        return out

    def _request(self, spec: WorkerSpec) -> tuple[tuple[int, ...], dict]:
        """Check that ``spec`` fits and can run; the supervisor's request that starts it."""
        wid = spec.worker_id
        check_worker_id(wid)
        if wid in self._workers:
            raise ExecutorError(f"worker {wid} already exists")
        if spec.cpu_kernels is not None:
            refused = level_refusal(spec.cpu_kernels, self._levels,
                                    f"host {socket.gethostname()}")
            if refused is not None:
                raise StartError(refused)
        need, free = spec.resources, self.free()
        if not (need.cpus <= free.cpus + _EPS and need.gpus <= free.gpus
                and need.memory_mib <= free.memory_mib):
            raise ExecutorError(f"worker {wid} needs {describe(need)}; free: {describe(free)}")
        gpus = tuple(self._free_gpus()[:need.gpus])
        env = dict(os.environ) if self._inherit_env else {}
        env.update(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        _check_runnable(spec, env)
        status = self.status_path(wid)
        status.unlink(missing_ok=True)
        base = self._base_env if self._link is not None and self._link.open else os.environ
        warm = bool(self._warm) and eligible(spec.argv, env, spec.cwd, dict(base),
                                             sys.executable)
        return gpus, {"op": "start", "id": wid, "argv": list(spec.argv), "env": env,
                      "cwd": spec.cwd, "log": spec.log_path, "status": str(status),
                      "warm": warm}

    def _supervisor(self) -> SupervisorLink:
        if self._link is None or not self._link.open:
            self._orphan_supervised()
            self._base_env = dict(os.environ)
            self._link = SupervisorLink(self._dir, warm=self._warm)
        return self._link

    # -- watching ---------------------------------------------------------------------------

    def _take_exits(self, timeout: float = 0.0) -> None:
        """Move the supervisor's exit events onto their workers."""
        link = self._link
        if link is None:
            return
        link.drain(timeout)
        for event in link.exits:
            w = self._workers.get(event["id"])
            if w is not None and w.supervised and w.exit is None:
                w.exit = exit_from_record(w.spec.worker_id, event)
        link.exits.clear()
        if not link.open:
            self._orphan_supervised()

    def _orphan_supervised(self) -> None:
        """The supervisor is gone: watch its workers by pid, like adopted ones."""
        for w in self._workers.values():
            w.supervised = w.pending  # a pending one learns from its answer (or its absence)

    def _running(self, w: _Worker) -> bool:
        if w.exit is not None:
            return False
        if w.supervised:
            return True  # its supervisor reports the exit
        # A zombie still runs for us: its supervisor writes the status file before reaping it.
        st = read_stat(w.pid)
        return st is not None and st.start_ticks == w.start_time

    def _finish(self, w: _Worker) -> WorkerExit:
        """The exit of an unsupervised worker known to be over: kill leftovers, read its file."""
        st = read_stat(w.pid)
        # Only when the pid is not someone else's by now; a live group keeps its id unused.
        if st is None or st.start_ticks == w.start_time:
            _killpg(w.pid, _signal.SIGKILL)
        record = read_status(self.status_path(w.spec.worker_id))
        if record is not None and record.get("start_time") not in (None, w.start_time):
            record = None  # the file of another worker under this id
        found = exit_from_record(w.spec.worker_id, record)
        if found is not None:
            return found
        return WorkerExit(w.spec.worker_id, None, None,
                          "exit status unknown: the worker ended while nothing recorded its "
                          "exit (its supervisor was killed too)")

    def poll(self) -> list[WorkerExit]:
        with self._lock:
            self._take_exits()
            out = []
            for wid, w in list(self._workers.items()):
                if w.pending or (w.exit is None and self._running(w)):
                    continue  # a pending one's exit waits until started() hands it over
                out.append(w.exit or self._finish(w))
                del self._workers[wid]
            return out

    def wait(self, timeout: float) -> None:
        """Until an exit can be polled or, while starts are pending, until all of them are
        answered (so that the next step takes the batch together), at most ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                self._take_exits()  # exits read while waiting for start answers are not in the pipe
                pending = [w for w in self._workers.values() if w.pending]
                if pending:
                    if all(w.spec.worker_id in w.link.answers or not w.link.open
                           for w in pending):
                        return
                elif any(w.exit for w in self._workers.values()):
                    return
                link = self._link
                watch = link is not None and link.open
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not watch:
                time.sleep(left)
                return
            select.select([link.fd], [], [], left)

    def alive(self, worker_id: str) -> bool:
        with self._lock:
            self._take_exits()
            w = self._workers.get(worker_id)
            return w is not None and self._running(w)

    def signal(self, worker_id: str, sig: str) -> None:
        if sig not in SIGNALS:
            raise ExecutorError(f"unknown signal {sig!r}; use one of {', '.join(SIGNALS)}")
        with self._lock:
            w = self._workers.get(worker_id)
            if w is None:
                raise ExecutorError(f"unknown worker {worker_id} (never started, or its exit "
                                    "was reported already)")
            self._take_exits()
            if w.pending:
                w.deferred = sig  # no pid yet: sent once its start is answered
                return
            if not self._running(w):
                return  # over; its pid may belong to someone else by now
            try:
                os.killpg(w.pid, getattr(_signal, f"SIG{sig}"))
            except ProcessLookupError:
                pass
            except PermissionError as e:
                raise ExecutorError(f"cannot signal worker {worker_id}: {e.strerror}") from None

    # -- restart ----------------------------------------------------------------------------

    def adopt(self, handle: WorkerHandle, spec: WorkerSpec) -> bool:
        with self._lock:
            self._check_open()
            wid = handle.worker_id
            if handle.executor != self.name:
                raise ExecutorError(f"worker {wid} belongs to executor {handle.executor!r}, "
                                    f"not {self.name!r}")
            if spec.worker_id != wid:
                raise ExecutorError(f"handle of worker {wid} given with the spec of "
                                    f"{spec.worker_id}")
            check_worker_id(wid)
            known = self._workers.get(wid)
            if known is not None:
                if known.handle.ref != handle.ref:
                    raise ExecutorError(f"worker {wid} already exists")
                return self._running(known)
            try:
                pid_s, _, start_s = handle.ref.partition(":")
                pid, start_time = int(pid_s), int(start_s)
            except ValueError:
                raise ExecutorError(f"worker {wid}: bad local ref {handle.ref!r}") from None
            w = _Worker(spec, handle, pid, start_time, supervised=False)
            if self._running(w):
                self._workers[wid] = w
                return True
            w.holds = False
            w.exit = self._finish(w)
            self._workers[wid] = w  # reported by the next poll()
            return False

    def find(self, worker_id: str) -> WorkerHandle | None:
        """The handle of the worker started under ``worker_id`` by any supervisor of this state
        dir, from its status file; None when none was started (after waiting for a previous
        service's supervisor to have started all it was asked to)."""
        with self._lock:
            check_worker_id(worker_id)
            self._settle_predecessors()
            record = read_status(self.status_path(worker_id))
            if record is None:
                record = journal_entry(self._dir, worker_id)
            if record is None or record.get("pid") is None:
                return None
            return WorkerHandle(worker_id, self.name,
                                f"{record['pid']}:{record.get('start_time')}")

    def _settle_predecessors(self) -> None:
        """Wait until the supervisors of earlier services have read all their requests."""
        if self._settled:
            return
        own = self._link.proc.pid if self._link is not None else None
        deadline = time.monotonic() + PREDECESSOR_WAIT_S
        for live in self._dir.glob("supervisor-*.live"):
            try:
                pid = int(live.name.split("-")[1].split(".")[0])
                started = int(live.read_text() or "-1")
            except (ValueError, OSError):
                continue
            if pid == own:
                continue
            while live.exists():
                st = read_stat(pid)
                if st is None or st.start_ticks != started or st.state.ended:
                    live.unlink(missing_ok=True)  # it died before it read everything
                    break
                if time.monotonic() > deadline:
                    raise ExecutorError(f"the worker supervisor {pid} of an earlier service "
                                        f"still reads requests after {PREDECESSOR_WAIT_S:g} s")
                time.sleep(0.01)
        self._settled = True

    def shutdown(self) -> None:
        """Stop watching; the workers keep running (and a later executor can adopt them)."""
        with self._lock:
            self._closed = True
            if self._link is not None:
                self._link.close()
            self._workers.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorError("local executor is shut down")


def _check_runnable(spec: WorkerSpec, env: dict[str, str]) -> None:
    """Refuse, with the cause, a command that cannot run here (before anything starts)."""
    if not spec.argv or not all(isinstance(a, str) for a in spec.argv):
        raise ExecutorError(f"worker {spec.worker_id}: argv must be a non-empty list of strings")
    problem = start_problem(spec.argv, spec.cwd, env)
    if problem is not None:
        raise StartError(problem)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass
