"""Pure: whether the local workers of ``dyntrain run`` fit this machine.

Every local worker is a Python interpreter that has imported torch, about ``WORKER_MIB`` of
memory before its model and data, whether it trains or waits. So the launcher refuses, before
it starts anything:

- ``--nproc`` above ``--workers`` MAX: at most MAX workers train, a worker beyond them could
  only wait;
- more local workers (``--nproc`` and the workers ``--events`` joins) than the memory available
  now holds at ``WORKER_MIB`` each: the machine would run out of memory, so the line says how
  many fit.

More worker threads (workers x ``--threads``) than cores is allowed: the workers share the
cores, each step is slower, and the numerics (the bits) are the same. ``cores_note`` says so.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from dyntrain.launch.events import Event
from dyntrain.procstat import memory_available_mib

# The least memory of one worker: a Python interpreter with torch imported (resident, measured
# on Linux x86-64 with a CPU build of torch 2.x: 250-300 MiB), before the script's model and data.
WORKER_MIB = 300


@dataclass(frozen=True)
class Machine:
    """What the local workers share.

    Args:
        cores: the CPU cores this process may run on.
        available_mib: memory available to new processes now (None: unknown, not checked).
    """

    cores: int
    available_mib: int | None

    @classmethod
    def here(cls) -> Machine:
        return cls(len(os.sched_getaffinity(0)), memory_available_mib())


def local_workers(nproc: int, events: Sequence[Event]) -> int:
    """The most local workers a run can have at once: ``--nproc`` and every join of ``events``
    (counted as if no worker had left before)."""
    return nproc + sum(int(e.target) for e in events if e.action == "join")


def nproc_refusal(nproc: int, max_workers: int) -> str | None:
    """Why ``--nproc`` cannot start that many workers, or None."""
    if nproc <= max_workers:
        return None
    return (f"--nproc {nproc} is more than --workers MAX {max_workers}: at most {max_workers} "
            f"workers train at once; start at most {max_workers}, or raise MAX")


def memory_refusal(workers: int, machine: Machine, joined: bool = False) -> str | None:
    """Why ``workers`` local workers do not fit the machine's available memory, or None."""
    if machine.available_mib is None or workers * WORKER_MIB <= machine.available_mib:
        return None
    which = "--nproc and the joins of --events" if joined else "--nproc"
    fit = machine.available_mib // WORKER_MIB
    return (f"{workers} local workers ({which}) need at least {workers * WORKER_MIB} MiB "
            f"(about {WORKER_MIB} MiB each: Python with torch imported, before the model and "
            f"data); this machine has {machine.available_mib} MiB available: at most {fit} fit")


def cores_note(workers: int, threads: int, cores: int) -> str | None:
    """Said when ``workers`` local workers of ``threads`` threads each share fewer cores."""
    if workers * threads <= cores:
        return None
    return (f"{workers} local worker(s) x {threads} thread(s) share {cores} core(s): slower, "
            f"the same bits")
