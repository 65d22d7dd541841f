"""The local executor's worker supervisor: one process that starts workers and records their exits.

``python supervisor.py DIR`` reads requests from stdin and answers on stdout, one JSON object a
line. The local executor starts one per service process, in a session of its own, so that it
outlives a killed service:

* ``{"op": "start", "id", "argv", "env", "cwd", "log", "status"}`` starts ``argv`` as the leader
  of a new session (so a signal to its process group reaches everything it starts), stdout and
  stderr appended to ``log``; the answer is ``{"op": "started", "id", "pid", "start_time"}`` or
  ``{"op": "failed", "id", "error", "errno"}`` (not found, not executable, argument list too
  long, no such working directory: whatever the exec reported).
* Once a worker exits: processes it left in its group are killed, ``status`` is written
  atomically (temporary file, rename) with ``{"pid", "start_time", "exit_code", "signal",
  "ended_at"}``, ``{"op": "exit", ...}`` goes to stdout, and only then is the worker reaped. So
  while its pid still exists (as a zombie) nothing is lost, and once it is gone the status file
  is there: a restarted service that adopted the worker by pid reads its exit from that file.
* Each start is a line ``{"id", "pid", "start_time"}`` appended to ``DIR/supervisor-<pid>.started``
  (removed when the supervisor exits, once every exit is in a status file), so a worker whose
  handle the service never stored can still be found by its id.
* ``python supervisor.py DIR N`` also keeps N warm workers ready (``warm_pool.py``: Python with
  torch imported, waiting for one assignment on stdin, each forked by one zygote that imported
  it once and re-parented to this process, a child subreaper). A start request with ``"warm":
  true`` (the executor decided the command may run in one) is handed to a ready one, or to one
  forked for it there and then, which becomes that worker - same status file, exit event and
  process group as any other; the answer says ``"warm": true``. Without a zygote (not ready yet,
  dead, not answering) the worker starts cold. The zygote starts at the first such request (a
  service that runs no Python workers pays nothing for it) and is let go at the end of stdin.

``DIR/supervisor-<pid>.live`` exists while the supervisor may still read requests. At the end of
stdin (the service closed it or died) the supervisor has started everything it was asked to,
removes that file, and keeps reaping until its last worker has exited, then exits. A restarted
service waits for a predecessor's file to go before it decides that a worker it has no record of
was never started.

``SupervisorLink`` is the executor's end: it starts the process and exchanges the lines.

Standard library only, run by path: starting it must not import the ``dyntrain`` package (and
with it torch); ``dyntrain.procstat`` and ``warm_pool`` (standard library only too) are loaded
from their files. A
worker costs a ``posix_spawn`` (a vfork and an exec), not a Python interpreter.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

if __package__:
    from dyntrain import procstat
    from dyntrain.service.executors import warm_pool
else:  # run by path: the package is not importable; its standard-library-only modules, by file
    def _load(name: str, *path: str):
        spec = importlib.util.spec_from_file_location(name, os.path.join(
            os.path.dirname(os.path.abspath(__file__)), *path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # before it runs: its dataclasses look their module up
        spec.loader.exec_module(module)
        return module

    procstat = _load("dyntrain_procstat", os.pardir, os.pardir, "procstat.py")
    warm_pool = _load("dyntrain_warm_pool", "warm_pool.py")


def proc_start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None if there is no such pid."""
    st = procstat.read_stat(pid)
    return None if st is None else st.start_ticks


def write_json(path: str, record: dict) -> None:
    """Replace ``path`` atomically: readers see the old content or the whole new one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _ignore(signum, frame) -> None:
    """Swallow the signal."""


def _spawn(argv: list[str], env: dict, cwd: str | None, log: str):
    """Start ``argv`` as the leader of a new session, output appended to ``log``; returns its
    pid (and the Popen object when one was needed). Exec errors (not found, not executable,
    argument list too long) raise OSError with their errno, before anything runs.

    ``posix_spawn`` (a vfork) is several times cheaper than a fork of this process, but cannot
    change the working directory; ``subprocess`` does that. Signals this process handles return
    to their default in the child; SIGPIPE and SIGXFSZ, which Python ignores, are reset too."""
    if cwd is not None:
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    start_new_session=True, close_fds=True)
        return proc.pid, proc
    path = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
    if path is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory on PATH", argv[0])
    pid = os.posix_spawn(path, argv, env, setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                              (os.POSIX_SPAWN_OPEN, 1, log,
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
                              (os.POSIX_SPAWN_DUP2, 1, 2)])
    return pid, None


class Supervisor:
    """Starts workers on request and turns each exit into a status file and an event."""

    def __init__(self, directory: str, out, warm: int = 0) -> None:
        self.dir = directory
        self.out = out
        self.pool = warm_pool.WarmPool(warm)
        self.workers: dict[int, dict] = {}  # pid -> {"id", "status", "start_time", "proc"}
        base = os.path.join(directory, f"supervisor-{os.getpid()}")
        self.live_file = base + ".live"
        self.journal_path = base + ".started"
        self.journal = None
        self.reading = True

    def send(self, record: dict) -> None:
        if self.out is None:
            return
        try:
            self.out.write(json.dumps(record) + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):  # the service is gone; the status files remain
            self.out = None

    def start(self, req: dict) -> None:
        wid = req["id"]
        try:
            os.makedirs(os.path.dirname(req["log"]) or ".", exist_ok=True)
            warm = self.pool.assign(req) if req.get("warm") else None
            pid, proc = (warm.pid, None) if warm is not None else _spawn(
                req["argv"], req["env"], req.get("cwd"), req["log"])
        except (OSError, ValueError) as e:
            errno = getattr(e, "errno", None)
            what = getattr(e, "strerror", None) or str(e)
            name = getattr(e, "filename", None)
            self.send({"op": "failed", "id": wid, "errno": errno,
                       "error": f"{what}: {name}" if name else what})
            return
        start_time = proc_start_time(pid)  # our unreaped child: readable even if it exited
        self.workers[pid] = {"id": wid, "status": req["status"], "start_time": start_time,
                             "proc": proc}
        # where it runs, for a service that never stored the handle: one appended line
        if self.journal is None:
            self.journal = open(self.journal_path, "a", buffering=1)
        self.journal.write(json.dumps({"id": wid, "pid": pid, "start_time": start_time}) + "\n")
        self.send({"op": "started", "id": wid, "pid": pid, "start_time": start_time,
                   "warm": warm is not None})

    def reap(self) -> None:
        """Record every worker that has exited, then reap it."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            worker = self.workers.pop(pid, None)
            if worker is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)  # leftovers; the zombie still holds the group
                except OSError:
                    pass
                killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
                record = {"pid": pid, "start_time": worker["start_time"],
                          "exit_code": None if killed else info.si_status,
                          "signal": info.si_status if killed else None, "ended_at": time.time()}
                write_json(worker["status"], record)
                self.send({"op": "exit", "id": worker["id"], **record})
            os.waitpid(pid, 0)
            if worker is not None and worker["proc"] is not None:
                worker["proc"].returncode = info.si_status  # subprocess must not wait on it
            elif worker is None:
                self.pool.died(pid, info.si_status,
                               killed=info.si_code in (os.CLD_KILLED, os.CLD_DUMPED))

    def stop_reading(self) -> None:
        self.reading = False
        self.pool.close()
        try:
            os.unlink(self.live_file)
        except FileNotFoundError:
            pass

    def finish(self) -> None:
        """Every worker ended and is in its status file: the journal is no longer needed."""
        if self.journal is not None:
            self.journal.close()
        try:
            os.unlink(self.journal_path)
        except FileNotFoundError:
            pass

    def run(self, inp) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        # Handlers, not SIG_IGN: an exec resets handled signals to their default in the workers,
        # while ignored ones would stay ignored there. SIGCHLD's writes the wakeup fd; the
        # others keep the supervisor recording exits to the end.
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _ignore)
        with open(self.live_file, "w") as f:
            f.write(str(proc_start_time(os.getpid())))
        buffer = b""
        fd = inp.fileno()
        while self.reading or self.workers:
            self.reap()
            if self.reading:
                self.pool.fill()
            if not self.reading and not self.workers:
                break
            zygote = self.pool.fileno()  # (None without one)
            watch = [wake_r] + ([fd] if self.reading else []) + [zygote] * (zygote is not None)
            ready, _, _ = select.select(watch, [], [], 1.0)
            if wake_r in ready:
                os.read(wake_r, 4096)
            if zygote in ready:
                self.pool.receive()
            if fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    for line in buffer.split(b"\n"):
                        if line.strip():
                            self.start(json.loads(line))
                    self.stop_reading()
                    continue
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self.start(json.loads(line))


# ------------------------------------------------------------------- the executor's end


class SupervisorGone(Exception):
    """The supervisor process exited (or was killed) while a request waited for its answer."""


GONE = "the worker supervisor is gone (see supervisor.log in the executor's state dir)"


class SupervisorLink:
    """This executor's end of its supervisor process: requests out, answers and exits in."""

    def __init__(self, directory, warm: int = 0) -> None:
        log = open(os.path.join(directory, "supervisor.log"), "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(directory),
                 str(warm)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True, close_fds=True)
        finally:
            log.close()
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self._buffer = b""
        self.exits: list[dict] = []  # exit events not yet taken
        self.answers: dict[str, dict] = {}  # worker id -> its start's answer, not yet taken
        self.open = True  # False once it is gone (EOF)

    def send(self, records: list[dict]) -> None:
        """Send requests all at once; their answers arrive in ``answers`` (by id)."""
        try:
            self.proc.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in records))
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            self.open = False

    def request(self, records: list[dict]) -> dict[str, dict]:
        """Send requests all at once and wait for their answers (by id); exit events read
        meanwhile are kept."""
        self.send(records)
        ids = [r["id"] for r in records]
        while self.open and not all(i in self.answers for i in ids):
            self._read(timeout=5.0)
        if not all(i in self.answers for i in ids):
            raise SupervisorGone(GONE)
        return {i: self.answers.pop(i) for i in ids}

    def drain(self, timeout: float = 0.0) -> None:
        """Take the exit events that arrived, waiting up to ``timeout`` for the first."""
        if self.open:
            self._read(timeout)

    def _read(self, timeout: float) -> list[dict]:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        try:
            chunk = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return []
        if not chunk:
            self.open = False
            return []
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        events = [json.loads(line) for line in lines if line.strip()]
        self.exits += [e for e in events if e["op"] == "exit"]
        self.answers.update((e["id"], e) for e in events if e["op"] in ("started", "failed"))
        return events

    def close(self) -> None:
        """End of requests: the supervisor records the workers it has, then exits."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.open = False


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or (len(argv) == 2 and not argv[1].isdigit()):
        print("usage: supervisor.py DIR [WARM_WORKERS]", file=sys.stderr)
        return 2
    supervisor = Supervisor(argv[0], sys.stdout, warm=int(argv[1]) if argv[1:] else 0)
    supervisor.run(sys.stdin)
    supervisor.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
