"""Pure: whether the local workers of ``dyntrain run`` fit this machine.

Every local worker is a Python interpreter that has imported torch, about ``WORKER_MIB`` of
memory before its model and data, whether it trains or waits. A worker forked by the fork server
(``dyntrain.launch.forkserver``) shares the server's pages until it writes them and adds about
``FORKED_WORKER_MIB`` beyond them; the server itself costs one ``WORKER_MIB``. So the launcher:

- refuses ``--nproc`` above ``--workers`` MAX: at most MAX workers train, a worker beyond them
  could only wait;
- refuses, before it starts anything, more first local workers (``--nproc`` and ``--standby``)
  than the memory available now holds (``memory_refusal``): the line says how many fit;
- counts the local workers alive at once over ``--events`` (``peak_local_workers``: a join adds
  its workers, a leave, kill or hang takes its targets away), not every worker ever started, and
  says in one line when that peak may not fit (``peak_note``);
- when a join fires, starts the workers of it that the memory available then holds
  (``join_fit``) and says in one line (an ``unstarted`` row of ``events.jsonl``) how many it
  did not start, instead of refusing the whole wave.

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
# What a worker forked by the fork server adds beyond the server's shared pages: about twice
# the 27 MiB (PSS, its share of the shared pages included) each of 64 forked workers of the
# digits MLP held (``bench/scale.py``), for the script's own imports and objects.
FORKED_WORKER_MIB = 64


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


def worker_mib(forked: bool) -> int:
    """The memory one more local worker takes: forked by the fork server, or a fresh one."""
    return FORKED_WORKER_MIB if forked else WORKER_MIB


def first_workers_mib(workers: int, forked: bool) -> int:
    """The memory the first ``workers`` local workers take (with the fork server, if forked)."""
    if workers == 0:
        return 0
    return (WORKER_MIB if forked else 0) + workers * worker_mib(forked)


def peak_local_workers(first: int, events: Sequence[Event]) -> int:
    """The most local workers alive at once: ``first``, then ``events`` in order (they fire one
    at a time, each once the one before took effect): a join adds its workers, a leave, kill or
    hang takes its targets away (a count: that many; a rank or a worker id: one; ``all``: every
    one), as if they were local workers."""
    alive = peak = first
    for e in events:
        if e.action == "join":
            alive += int(e.target)
        elif e.target == "all":
            alive = 0
        else:
            alive = max(0, alive - (int(e.target) if e.target.isdigit() else 1))
        peak = max(peak, alive)
    return peak


def nproc_refusal(nproc: int, max_workers: int) -> str | None:
    """Why ``--nproc`` cannot start that many workers, or None."""
    if nproc <= max_workers:
        return None
    return (f"--nproc {nproc} is more than --workers MAX {max_workers}: at most {max_workers} "
            f"workers train at once; start at most {max_workers}, or raise MAX")


def _fit(available_mib: int, forked: bool) -> int:
    """How many first local workers ``available_mib`` holds."""
    left = available_mib - (WORKER_MIB if forked else 0)
    return max(0, left // worker_mib(forked))


def memory_refusal(workers: int, machine: Machine, forked: bool) -> str | None:
    """Why the first ``workers`` local workers (``--nproc`` and ``--standby``) do not fit the
    machine's available memory, or None."""
    need = first_workers_mib(workers, forked)
    if machine.available_mib is None or need <= machine.available_mib:
        return None
    each = (f"about {FORKED_WORKER_MIB} MiB each beyond the fork server's {WORKER_MIB} MiB"
            if forked else f"about {WORKER_MIB} MiB each: Python with torch imported")
    return (f"{workers} local workers (--nproc and --standby) need at least {need} MiB ({each}, "
            f"before the model and data); this machine has {machine.available_mib} MiB "
            f"available: at most {_fit(machine.available_mib, forked)} fit")


def peak_note(first: int, peak: int, machine: Machine, forked: bool) -> str | None:
    """Said when ``--events`` may bring more local workers at once than memory holds now."""
    if machine.available_mib is None or peak <= first or \
            first_workers_mib(peak, forked) <= machine.available_mib:
        return None
    return (f"--events may bring up to {peak} local workers at once; about "
            f"{_fit(machine.available_mib, forked)} fit the memory available now: a join "
            "starts those that fit when it fires")


def join_fit(asked: int, available_mib: int | None, forked: bool) -> int:
    """How many of the ``asked`` workers of a join to start, with ``available_mib`` available
    now (the workers already started counted in it)."""
    if available_mib is None:
        return asked
    return max(0, min(asked, available_mib // worker_mib(forked)))


def join_short_line(asked: int, started: int, available_mib: int | None, forked: bool) -> str:
    """The one line of a join that started fewer workers than it asked for."""
    return (f"memory for {started} of {asked} workers: {available_mib} MiB available, about "
            f"{worker_mib(forked)} MiB each{' (forked)' if forked else ''}; "
            f"{asked - started} not started")


def cores_note(workers: int, threads: int, cores: int) -> str | None:
    """Said when ``workers`` local workers of ``threads`` threads each share fewer cores."""
    if workers * threads <= cores:
        return None
    return (f"{workers} local worker(s) x {threads} thread(s) share {cores} core(s): slower, "
            f"the same bits")
