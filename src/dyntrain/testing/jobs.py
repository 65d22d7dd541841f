"""An elastic job across the hosts of a bed, driven the way a user drives it.

``HostJob`` starts ``dyntrain run --host ADDRESS`` on one host (its run folder in the bed's
shared folder, as a shared file system would be), reads the join command it prints, and starts
``dyntrain worker --coordinator ...`` on other hosts. Processes inside hosts get the caller's
environment without any ``DYNTRAIN_*``, ``GLOO_*`` or ``NCCL_*`` variable: nothing the product
needs may come from there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from dyntrain.elastic.runs.log import read_events, read_metrics
from dyntrain.testing.hosts import Host
from dyntrain.testing.wait import wait_until

CLI = [sys.executable, "-m", "dyntrain.cli.main"]


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without what would tell the product how to connect."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DYNTRAIN_", "GLOO_", "NCCL_", "TP_SOCKET"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def pinned_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (default: this process's environment) with a job's default numerics
    (``Numerics().env()``): a plain ``python`` run started with it computes the bits a job of
    ``dyntrain run`` computes, so it is the static reference an elastic run is compared with."""
    from dyntrain.elastic.numerics import Numerics

    return {**(os.environ if base is None else base), **Numerics().env(), **extra}


class Output:
    """A process's output, collected line by line in a thread (time of arrival kept)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def find(self, pattern: str) -> re.Match | None:
        """The first match of ``pattern`` in a line so far."""
        for _, line in self.lines:
            m = re.search(pattern, line)
            if m:
                return m
        return None

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._thread.join(5.0)
        return code


class RunRows:
    """What a job's run folder (``self.out``) says so far: its events, metrics and world."""

    out: Path

    def events(self) -> list[dict]:
        """The rows of the run's events.jsonl so far, as JSON objects (read and checked as
        ``dyntrain.elastic.runs.log`` reads them: a line still being written waits)."""
        return [row.to_json() for row in read_events(self.out)]

    def metrics(self) -> list[dict]:
        """The rows of the run's metrics.jsonl so far, as JSON objects (as ``events``)."""
        return [row.to_json() for row in read_metrics(self.out)]

    def world(self) -> int:
        """The world size of the newest step (0 before the first)."""
        rows = self.metrics()
        return rows[-1]["world_size"] if rows else 0


class HostJob(RunRows):
    """``dyntrain run`` on ``host`` with ``command`` (SCRIPT ARGS or -m MODULE ARGS).

    Args:
        host: where the launcher (and its ``--nproc`` local workers) runs.
        out: the run folder, as every host sees it (the bed's shared folder).
        command: what each worker runs.
        run_args: ``dyntrain run`` options (``--workers``, ``--nproc``, ``--failure-timeout``).
    """

    def __init__(self, host: Host, out: Path, command: list[str],
                 run_args: list[str] | tuple[str, ...] = ()) -> None:
        self.host, self.out, self.command = host, Path(out), [str(c) for c in command]
        self.launcher = Output(host.popen(
            [*CLI, "run", "--host", host.address, "--out", str(out), *map(str, run_args),
             *self.command], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
        self.workers: list[Output] = []

    @property
    def coordinator(self) -> str:
        """The address the launcher tells workers to join (waits for it)."""
        m = wait_until(lambda: self.launcher.find(r"--coordinator (\S+)"),
                       "the launcher's join command", timeout=120)
        return m.group(1)

    def add_worker(self, host: Host, *options: str, args: list[str] | None = None,
                   env: dict[str, str] | None = None) -> Output:
        """``dyntrain worker --coordinator ... OPTIONS COMMAND`` on ``host`` (``args``: other
        arguments for the command than the launcher's; ``env``: variables of that host's
        shell)."""
        command = self.command if args is None else [self.command[0], *map(str, args)]
        worker = Output(host.popen([*CLI, "worker", "--coordinator", self.coordinator, *options,
                                    *command], env=clean_env(**(env or {})),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        self.workers.append(worker)
        return worker

    def wait(self, timeout: float = 240.0) -> int:
        """The launcher's exit code once it has ended."""
        return self.launcher.wait(timeout)

