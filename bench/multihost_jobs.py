"""Elastic jobs on a host bed for ``bench/multihost.py``, started the way a user starts them
(``dyntrain run --host`` on one host, ``dyntrain worker --coordinator`` on others, no environment
variable, as ``dyntrain.testing.jobs.HostJob`` does for the tests), with the times read back from
their run folders.

The launcher and its workers start together (the coordinator's port is picked beforehand on the
launcher's host), so that they import torch at the same time; ``--connect-timeout 180`` lets a
worker wait for a launcher that is still importing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from dyntrain.testing.hosts import Host
from dyntrain.testing.jobs import CLI, Output, RunRows, clean_env
from dyntrain.testing.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "tests" / "scripts" / "ledger_train.py"
CONNECT_TIMEOUT = "180"


def free_port_on(host: Host) -> str:
    """A TCP port nothing listens on, on ``host``'s own network."""
    return host.run([sys.executable, "-c", "import socket; s = socket.socket(); "
                     "s.bind(('', 0)); print(s.getsockname()[1])"], check=True).stdout.strip()


class Job(RunRows):
    """``dyntrain run`` on ``home`` listening on ``address`` (a host's own address, or
    127.0.0.1), and ``dyntrain worker`` processes added on any host.

    Args:
        home: where the launcher (and its ``--nproc`` local workers) runs.
        out: the run folder, as every host sees it (the bed's shared folder).
        command: what each worker runs (SCRIPT ARGS).
        address: the address the coordinator listens on.
        run_args: further ``dyntrain run`` options (``--workers``, ``--nproc``...).
        log_dir: where ``save_logs`` writes each process's output.
    """

    def __init__(self, home: Host, out: Path, command: list, address: str,
                 run_args: list[str], log_dir: Path) -> None:
        self.home, self.out, self.log_dir = home, Path(out), Path(log_dir)
        self.command = [str(c) for c in command]
        port = free_port_on(home)
        self.coordinator = f"{address}:{port}"
        self.launcher = Output(home.popen(
            [*CLI, "run", "--host", address, "--port", port, "--out", str(out), *run_args,
             *self.command], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
        self.workers: list[tuple[Host, Output]] = []

    def add_worker(self, host: Host) -> Output:
        """``dyntrain worker --coordinator ... COMMAND`` on ``host``; its output."""
        worker = Output(host.popen([*CLI, "worker", "--coordinator", self.coordinator,
                                    "--connect-timeout", CONNECT_TIMEOUT, *self.command],
                                   env=clean_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True))
        self.workers.append((host, worker))
        return worker

    def alive(self) -> bool:
        return self.launcher.proc.poll() is None

    def wait_for(self, condition, what: str, timeout: float):
        """``condition()``'s first true value; fails at once should the launcher end first."""
        return wait_until(condition, what, timeout, 0.05, unless=lambda: not self.alive() and (
            f"the launcher ended ({self.launcher.proc.returncode}):\n"
            + self.launcher.text()[-2000:]))

    def first_row(self, predicate) -> dict | None:
        """The first metrics row that ``predicate`` accepts."""
        return next((r for r in self.metrics() if predicate(r)), None)

    def event_clock(self) -> float | None:
        """Seconds to add to an event's ``*_at`` field to get the time of day: the events say
        seconds since the coordinator started, metrics rows carry the time of day."""
        rows = self.metrics()
        for event in self.events():
            row = next((r for r in rows if r.get("gen") == event.get("generation")), None)
            if row is not None:
                return row["time"] - event["first_step_at"]
        return None

    def save_logs(self) -> None:
        """Each process's output into ``log_dir`` (launcher.log, worker-<host>-<n>.log)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "launcher.log").write_text(self.launcher.text() + "\n")
        for n, (host, worker) in enumerate(self.workers):
            (self.log_dir / f"worker-{host.name}-{n}.log").write_text(worker.text() + "\n")


def worker_id(host: Host, worker: Output) -> str:
    """The id a ``dyntrain worker`` process joins under (host-pid; restarts add .r1, .r2)."""
    return f"{host.name}-{worker.proc.pid}"


def signal_process(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` unless it is gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def event_with(job: Job, kind: str, worker: str) -> dict | None:
    """The first ``kind`` event (join, crash...) that names ``worker``."""
    return next((e for e in job.events() if e["event"] == kind and worker in e["workers"]), None)
