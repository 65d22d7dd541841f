"""torchrun-compatible elastic jobs: what each worker is told and when its gang restarts.

A job submitted with ``--launcher torchrun --workers MIN:MAX`` runs an unmodified DDP script
the way torchrun's elastic agent would: every worker gets the variables torchrun sets
(``worker_env``), and a change of size (the scheduler grows or shrinks the job, or a worker
dies) stops the whole gang and starts it again at the new size with
``TORCHELASTIC_RESTART_COUNT`` one higher (``restart_for_resize``, ``after_worker_exit``); the
script resumes from its own checkpoint. Each gang is one attempt of the job, so the restart
count is the number of attempts before it (``restart_count``). The engine does the stopping
and starting; the decisions are here, pure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: what torchrun's ``--rdzv-backend`` would be named in ``TORCHELASTIC_RUN_ID``'s absence
ROLE_NAME = "default"
#: every variable ``worker_env`` sets (torchrun's agent sets these for each worker; none is read
#: when the interpreter starts or torch is imported, so a warm process may take them)
ENV_NAMES = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
    "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"})


def restart_count(attempt_number: int) -> int:
    """``TORCHELASTIC_RESTART_COUNT`` of a job's attempt ``attempt_number`` (1-based): each
    attempt is one gang, so it is how many gangs ran before it."""
    if attempt_number < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt_number}")
    return attempt_number - 1


def worker_env(*, rank: int, world_size: int, master_addr: str, master_port: int,
               restart: int, run_id: str, max_restarts: int,
               nccl_async_error_handling: str = "1") -> dict[str, str]:
    """The variables torchrun gives one worker of a single-node gang (every worker of the
    local executor shares its host, so the local rank is the rank).

    Args:
        rank: the worker's rank, 0 to ``world_size - 1`` (its start order in the gang).
        world_size: the gang's size.
        master_addr: where rank 0 listens (``init_process_group``'s ``env://``).
        master_port: the port rank 0 listens on, fresh for each gang.
        restart: ``TORCHELASTIC_RESTART_COUNT`` (``restart_count``).
        run_id: ``TORCHELASTIC_RUN_ID`` (the job's id).
        max_restarts: ``TORCHELASTIC_MAX_RESTARTS``.
        nccl_async_error_handling: ``TORCH_NCCL_ASYNC_ERROR_HANDLING``: the job's own value
            if it sets one, else 1, as torchrun's agent passes it on.

    ``TORCHELASTIC_USE_AGENT_STORE`` is ``False``: no agent hosts a store here, so rank 0's
    ``init_process_group`` hosts it at ``MASTER_ADDR:MASTER_PORT`` (torchrun's value with a
    rendezvous that does not share its store). ``OMP_NUM_THREADS`` is the job's (its numerics
    pin it), as torchrun passes on the one it was started with.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    if not 0 < master_port < 65536:
        raise ValueError(f"master port {master_port} is not a port")
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
        "ROLE_RANK": str(rank), "ROLE_NAME": ROLE_NAME,
        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
        "ROLE_WORLD_SIZE": str(world_size), "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": nccl_async_error_handling,
    }


def restart_for_resize(running: int, grow: int = 0, shrink: int = 0) -> str | None:
    """Why the gang of ``running`` workers restarts when the scheduler grows it by ``grow`` and
    shrinks it by ``shrink`` workers in one pass (None: neither, no restart). A gang is never
    changed in place: any shrink takes a worker away, so even one matched by a grow elsewhere
    restarts it. The new gang's size is whatever the next scheduling pass admits it with."""
    if running < 0 or grow < 0 or shrink < 0:
        raise ValueError("worker counts are never negative")
    if not grow and not shrink:
        return None
    cause = "capacity taken back" if shrink else "capacity added"
    return f"restart: {running} -> {running + grow - shrink} workers ({cause})"


class ExitAction(str, enum.Enum):
    """What a torchrun gang does when one of its workers exits."""

    CONTINUE = "continue"  # the gang is already stopping or finishing: nothing changes
    FINISH = "finish"  # it exited 0: the script is done, the others end on their own
    RESTART = "restart"  # it was killed (a signal, its node lost): restart, not counted
    FAIL = "fail"  # it failed (exit code > 0): stop the gang, a counted attempt


@dataclass(frozen=True)
class ExitDecision:
    """``after_worker_exit``'s answer: the action and the reason the attempt records."""

    action: ExitAction
    reason: str = ""


def after_worker_exit(worker: str, exit_code: int | None, *, lost: bool = False,
                      stopping: bool = False) -> ExitDecision:
    """What a running gang does when ``worker`` exits with ``exit_code`` (negative: the signal
    that killed it; None: unknown). ``lost``: its node went away. ``stopping``: the gang was
    already told to stop, so this exit changes nothing.

    A worker that exits 0 finished the script: the gang is finishing, and is neither resized
    nor restarted while the others end (as torchrun's agent waits for them). A killed worker
    is what torchrun's agent restarts the group for; here that restart does not
    count against the job's retries (as a preemption does not). A worker that fails with an
    exit code > 0 failed the script itself: the gang stops and the attempt counts, so a script
    that always fails ends by its retry strategy instead of restarting forever.
    """
    if stopping:
        return ExitDecision(ExitAction.CONTINUE)
    if exit_code == 0 and not lost:
        return ExitDecision(ExitAction.FINISH, "finished")
    if exit_code is not None and exit_code > 0 and not lost:
        return ExitDecision(ExitAction.FAIL, f"worker {worker} failed (exit code {exit_code})")
    how = ("its node was lost" if lost else "its exit status is unknown" if exit_code is None
           else f"signal {-exit_code}")
    return ExitDecision(ExitAction.RESTART, f"restart: worker {worker} died ({how})")
