"""torchrun-compatible elastic jobs end to end: a plain DDP script (tests/scripts/plain_ddp.py,
no dyntrain import) on the local executor grows, shrinks and survives a killed worker, each
change a restart of the whole gang that resumes from the script's own checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from dyntrain.service.core.model import (
    CapacityType,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    JobStatus,
    Resources,
)
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.controller import Controller
from dyntrain.service.executors.local import LocalExecutor
from dyntrain.service.store import Store

from .test_controller import drive

PLAIN_DDP = str(Path(__file__).resolve().parent.parent / "scripts" / "plain_ddp.py")
SMALL = Resources(0.25, 0, 256)
EPOCHS = 10


def spot_setup(tmp_path: Path, slots: int, grace: float):
    """A SQLite store with one SPOT environment of ``slots`` slots, queue q, and a controller
    over the local executor."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    store.environments.create_compute_environment(ComputeEnvironmentSpec(
        "spot", CapacityType.SPOT, 0.3, SMALL, 0, slots, 8))
    store.environments.create_job_queue(JobQueueSpec("q", 1, ("spot",)))
    executor = LocalExecutor(tmp_path / "executor", cpus=2, memory_mib=16_384)
    return store, Controller(store, executor, ControllerConfig(
        tmp_path / "runs", grace_seconds=grace, schedule_every=0.05))


def _history(checkpoint: Path) -> list[dict]:
    """The epochs the script recorded in its checkpoint (renamed into place: never partial)."""
    if not checkpoint.exists():
        return []
    return torch.load(checkpoint, weights_only=True)["history"]


def test_a_plain_ddp_script_grows_shrinks_and_survives_a_killed_worker(tmp_path):
    store, c = spot_setup(tmp_path, slots=2, grace=10.0)
    folder, pause = tmp_path / "ckpt", tmp_path / "pause"
    job = store.jobs.submit(queue="q", command=[
        sys.executable, PLAIN_DDP, "--epochs", str(EPOCHS), "--checkpoint-dir", str(folder),
        "--epoch-seconds", "1", "--pause-while", str(pause)],
        resources=SMALL, workers=(1, 3), launcher="torchrun")
    assert store.jobs.get_job(job.id).torchrun
    checkpoint = folder / "checkpoint.pt"
    killed: list[str] = []
    seen: list[str] = []  # the job's status reasons, as `dyntrain status` shows them

    def gangs() -> list[tuple[int, int]]:
        """(restart count, world size) of each gang that finished an epoch, in order."""
        out: list[tuple[int, int]] = []
        for h in _history(checkpoint):
            if (h["restart"], h["world_size"]) not in out:
                out.append((h["restart"], h["world_size"]))
        return out

    def kill_one() -> None:
        number = len(store.jobs.list_attempts(job.id))
        victim = [w for w in store.workers.list_workers(job.id) if w.attempt_no == number][-1]
        c.executor.signal(victim.id, "KILL")
        killed.append(victim.id)

    # each change waits for an epoch of the gang before it; the script pauses between epochs
    # from each change until the next gang formed, so that it cannot finish before all of them
    changes = [
        (0, 2, lambda: store.environments.update_compute_environment("spot", desired_slots=3)),
        (1, 3, lambda: store.environments.update_compute_environment("spot", desired_slots=2)),
        (2, 2, kill_one),
    ]

    def watch():
        reason = store.jobs.get_job(job.id).status_reason
        if reason and reason not in seen:
            seen.append(reason)
        if changes and changes[0][:2] in gangs():
            *_, change = changes.pop(0)
            pause.touch()
            change()
        elif pause.exists() and (folder / f"env-r{3 - len(changes)}-rank0.json").exists():
            pause.unlink()  # the next gang formed: let it train

    drive(c, lambda: store.jobs.get_job(job.id).status.is_terminal(), timeout=420, on_step=watch)
    final = store.jobs.get_job(job.id)
    assert final.status is JobStatus.SUCCEEDED, (final.status_reason, seen)
    history = _history(checkpoint)
    # every epoch exactly once in the script's own record, resumed after each restart
    assert [h["epoch"] for h in history] == list(range(1, EPOCHS + 1)), history
    assert gangs() == [(0, 2), (1, 3), (2, 2), (3, 2)], history
    for h in history:
        if h["restart"] > 0:
            assert h["resumed_from"] > 0, h  # it loaded its checkpoint, not a fresh model
    # restarts are not failed attempts: one counted attempt, the restarts in the history
    assert final.attempts == 1 and final.preemptions == 0
    reasons = [a.reason for a in store.jobs.list_attempts(job.id)]
    assert len(reasons) == 4, reasons
    assert reasons[0] == "restart: 2 -> 3 workers (capacity added)", reasons
    assert reasons[1] == "restart: 3 -> 2 workers (capacity taken back)", reasons
    assert reasons[2].startswith(f"restart: worker {killed[0].rsplit('-', 1)[-1]} died "
                                 "(signal 9)"), reasons
    assert reasons[3] == "exit code 0", reasons
    assert any(r.startswith("restart: 2 -> 3 workers") for r in seen), seen
    # each rank got torchrun's variables, its gang's size and restart count
    for restart, world in gangs():
        for rank in range(world):
            env = json.loads((folder / f"env-r{restart}-rank{rank}.json").read_text())
            assert env["RANK"] == env["LOCAL_RANK"] == str(rank), env
            assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == str(world), env
            assert env["TORCHELASTIC_RESTART_COUNT"] == str(restart), env
            assert env["TORCHELASTIC_RUN_ID"] == job.id and env["MASTER_ADDR"] == "127.0.0.1"
            assert int(env["MASTER_PORT"]) > 0
        assert not (folder / f"env-r{restart}-rank{world}.json").exists()
