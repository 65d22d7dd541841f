"""A job the executor cannot place waits: RUNNABLE, with the executor's reason, not offered again
until the executor has more room than it had when it refused.

The scheduler places jobs in the slots its compute environments declare; the executor decides
whether a worker really fits (the local executor: this machine's cpus, gpus and memory). When it
refuses a placement for want of room (not a command that cannot run, which is a failed attempt),
the job waits as AWS Batch shows a job that no environment can hold now: RUNNABLE, its status
reason the executor's line. A refused placement is neither an attempt nor a preemption. Offering
the job again before anything was freed would be refused the same way, so it is held
(``Snapshot.held``: it waits, and blocks its queue as a job that does not fit would) until the
executor has more of some resource free than when it refused (a worker ended, a node joined);
then it is offered again, and a second refusal replaces the first one's reason instead of adding
to the job's history. A job none of whose workers started is also offered again
``RETRY_SECONDS`` after its refusal whatever is free (an executor may refuse for another
reason than room, its supervisor gone, say, and such a refusal leaves no record); one that
started in part, which leaves an attempt recorded, only once more is free.

Nothing here reads a clock, a store or a process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dyntrain.service.core.executor import make_resources
from dyntrain.service.core.model import Resources

WAITING_FOR_ROOM = "waiting for room on the executor"
RETRY_SECONDS = 30.0
_EPS = 1e-9


@dataclass(frozen=True)
class Refusal:
    """The executor refused to place a job's workers.

    Args:
        reason: the job's status reason while it waits.
        free: what the executor had free when it refused.
        expires: when the job is offered again whatever is free (epoch seconds; None: only
            once more is free).
    """

    reason: str
    free: Resources
    expires: float | None = None


def refusal(error: str, free: Resources, now: float | None = None) -> Refusal:
    """The refusal of a placement the executor answered with ``error`` (one line) while it had
    ``free``; ``now``: when, for a refusal that left no record (it expires ``RETRY_SECONDS``
    later), else None."""
    return Refusal(f"{WAITING_FOR_ROOM}: {error}", free,
                   None if now is None else now + RETRY_SECONDS)


def with_released(free: Resources, resources: Resources, count: int) -> Resources:
    """``free`` once ``count`` workers of ``resources`` are gone: what an executor that refused
    part of a placement will have when the part it started has been stopped (holding the job
    until more than that is free keeps it from starting that part again and again)."""
    return make_resources(free.cpus + count * resources.cpus, free.gpus + count * resources.gpus,
                          free.memory_mib + count * resources.memory_mib)


def grew(before: Resources, after: Resources) -> bool:
    """Whether ``after`` has more of some resource than ``before``."""
    return (after.cpus > before.cpus + _EPS or after.gpus > before.gpus
            or after.memory_mib > before.memory_mib)


def still_held(refusals: Mapping[str, Refusal], free: Resources,
               now: float) -> dict[str, Refusal]:
    """The refusals that still hold at ``now``, the executor having ``free``: those whose job
    would be refused the same way (nothing grew since) and that have not expired; the others'
    jobs are offered again."""
    return {job: r for job, r in refusals.items()
            if not grew(r.free, free) and (r.expires is None or now < r.expires)}
