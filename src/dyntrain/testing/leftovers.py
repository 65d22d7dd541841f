"""The processes of one run, found by a mark in their environment, for tests that check that no
process of a run is left.

A test starts the launcher with ``LEFTOVER_MARK=<unique>`` in its environment. Every process of
the run inherits it: the workers started as new processes get the launcher's environment, and
a process forked without exec (the fork server, its workers, loader processes) shows its
parent's in ``/proc/PID/environ`` whatever it later sets in ``os.environ``.
"""

from __future__ import annotations

import os
import signal
import uuid

from dyntrain.procstat import ProcStat, all_pids, read_stat

MARK = "LEFTOVER_MARK"


def new_mark() -> str:
    return uuid.uuid4().hex


def marked_env(mark: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the run's mark."""
    return {**(os.environ if base is None else base), MARK: mark}


def marked(mark: str) -> list[ProcStat]:
    """The live processes carrying ``mark`` (zombies, which hold nothing but a pid, are not)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for pid in all_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # ended meanwhile, or not ours
            continue
        if needle in env:
            st = read_stat(pid)
            if st is not None and not st.state.ended:
                found.append(st)
    return found


def children(procs: list[ProcStat], parent: int) -> list[ProcStat]:
    return [p for p in procs if p.ppid == parent]


def kill_marked(mark: str) -> None:
    """SIGKILL whatever carries ``mark`` (a test's clean-up, whatever it found)."""
    for st in marked(mark):
        try:
            os.kill(st.pid, signal.SIGKILL)
        except OSError:
            pass
