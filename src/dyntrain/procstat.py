"""What Linux says about a process in ``/proc/PID/stat``, about the machine's CPUs in
``/proc/stat`` and about its memory in ``/proc/meminfo``, parsed in one place.

``/proc/PID/stat`` is one line: ``PID (COMM) STATE PPID PGRP SESSION ...``. COMM, the command
name, may hold spaces and parentheses (a process may name itself ``a) (b``), so the fields are
counted from the *last* ``)``, never by splitting the whole line. A process that is not there
(never was, or ended and was reaped) reads as None; so does one whose line cannot be parsed
(it ended while it was read).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # per second


class ProcState(StrEnum):
    """A process's state (field 3 of ``/proc/PID/stat``)."""

    RUNNING = "R"
    SLEEPING = "S"
    DISK_SLEEP = "D"
    ZOMBIE = "Z"
    STOPPED = "T"
    TRACED = "t"
    DEAD = "X"
    DEAD_BEFORE_3_14 = "x"  # how kernels before 3.14 wrote it
    IDLE = "I"
    PARKED = "P"
    WAKING = "W"
    WAKEKILL = "K"

    @property
    def ended(self) -> bool:
        """It has exited: a zombie waiting for its parent, or dead."""
        return self in (ProcState.ZOMBIE, ProcState.DEAD, ProcState.DEAD_BEFORE_3_14)

    @property
    def stopped(self) -> bool:
        """It is stopped by a signal (SIGSTOP) or a tracer."""
        return self in (ProcState.STOPPED, ProcState.TRACED)


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` that dyntrain uses.

    Args:
        pid: the process id (field 1).
        comm: the command name (field 2, without its parentheses).
        state: its state (field 3).
        ppid: its parent's pid (field 4).
        pgrp: its process group (field 5).
        session: its session id (field 6).
        utime_ticks: user CPU time, in clock ticks (field 14).
        stime_ticks: system CPU time, in clock ticks (field 15).
        start_ticks: when it started, in clock ticks after boot (field 22): with the pid, it
            names one process (a pid is reused, a pid with its start time is not).
    """

    pid: int
    comm: str
    state: ProcState
    ppid: int
    pgrp: int
    session: int
    utime_ticks: int
    stime_ticks: int
    start_ticks: int

    @property
    def cpu_seconds(self) -> float:
        """User plus system CPU seconds it has used (itself, not its children)."""
        return (self.utime_ticks + self.stime_ticks) / CLOCK_TICKS


def parse_stat(text: str | bytes) -> ProcStat | None:
    """The fields of one ``/proc/PID/stat`` line; None if it is not one."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    head, close, tail = text.rpartition(")")
    pid_text, open_, comm = head.partition(" (")
    rest = tail.split()
    if not close or not open_ or len(rest) < 20:
        return None
    try:
        return ProcStat(pid=int(pid_text), comm=comm, state=ProcState(rest[0]),
                        ppid=int(rest[1]), pgrp=int(rest[2]), session=int(rest[3]),
                        utime_ticks=int(rest[11]), stime_ticks=int(rest[12]),
                        start_ticks=int(rest[19]))
    except ValueError:
        return None


def read_stat(pid: int) -> ProcStat | None:
    """``/proc/PID/stat`` of ``pid``, parsed; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return parse_stat(f.read())
    except OSError:  # no such process (or it ended while being read)
        return None


def all_pids() -> list[int]:
    """Every process id this process can see in /proc, now."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def machine_busy_seconds() -> float | None:
    """CPU seconds all CPUs of the machine have been busy since boot (user, nice, system,
    irq and softirq time from ``/proc/stat``); None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        if fields[0] != "cpu":
            return None
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    except (OSError, ValueError, IndexError):
        return None
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


def memory_available_mib() -> int | None:
    """Memory the machine can give new processes now without swapping (``MemAvailable`` of
    ``/proc/meminfo``), in MiB; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
