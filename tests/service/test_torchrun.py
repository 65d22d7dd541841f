"""torchrun-compatible elastic jobs end to end: a plain DDP script (tests/scripts/plain_ddp.py,
no dyntrain import) on the local executor grows, shrinks and survives a killed worker, each
change a restart of the whole gang that resumes from the script's own checkpoint. Gangs after
the first start from the executor's warm processes (torch imported, forked by its zygote: no
interpreter is started for them) with torchrun's variables, and train the model a cold gang
trains, bit for bit."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from dyntrain.service.core.executor import WorkerSpec
from dyntrain.service.core.model import (
    CapacityType,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    JobStatus,
    Resources,
)
from dyntrain.service.core.torchrun import worker_env
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.controller import Controller
from dyntrain.service.executors.local import LocalExecutor
from dyntrain.service.store import Store
from dyntrain.testing.wait import wait_until

from .test_controller import drive

PLAIN_DDP = str(Path(__file__).resolve().parent.parent / "scripts" / "plain_ddp.py")
SMALL = Resources(0.25, 0, 256)
EPOCHS = 10


class Service:
    """One SQLite store with a SPOT environment and queue q, and a controller over a local
    executor with one warm worker (``dyntrain server``'s default), for the module's tests."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.store = store = Store(f"sqlite:///{folder / 'db.sqlite'}")
        store.create_all()
        store.environments.create_compute_environment(ComputeEnvironmentSpec(
            "spot", CapacityType.SPOT, 0.3, SMALL, 0, 2, 8))
        store.environments.create_job_queue(JobQueueSpec("q", 1, ("spot",)))
        self.c = Controller(store, LocalExecutor(folder / "executor", cpus=2, memory_mib=16_384,
                                                 warm_workers=1), ControllerConfig(
            folder / "runs", grace_seconds=10.0, schedule_every=0.05))

    def start_zygote(self) -> None:
        """Start the executor's zygote: a worker that could use a warm process (a script that
        imports nothing, started cold) asks for one."""
        os.environ["PYTEST_CURRENT_TEST"] = STARTED_UNDER  # (same_environment)
        noop = self.folder / "noop.py"
        noop.write_text("")
        executor = self.c.executor
        executor.start(WorkerSpec("noop", 1, "noop", [sys.executable, str(noop)], {}, SMALL,
                                  None, str(self.folder / "noop.log")))
        exits = wait_until(executor.poll, "the no-op worker's exit")  # (before the controller)
        assert [(e.worker_id, e.exit_code) for e in exits] == [("noop", 0)], exits

    def zygote_ready(self) -> bool:
        """Whether the zygote finished its imports: gangs started from then on are warm."""
        log = self.folder / "executor" / "workers" / "supervisor.log"
        return log.exists() and ZYGOTE_READY.search(log.read_text()) is not None

    def close(self) -> None:
        for job in self.store.jobs.list_jobs():
            for w in self.store.workers.list_workers(job.id, active=True):
                self.c.executor.signal(w.id, "KILL")
        self.c.executor.shutdown()
        self.store.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    found = Service(tmp_path_factory.mktemp("torchrun"))
    try:
        found.start_zygote()
        yield found
    finally:
        found.close()


def same_environment(monkeypatch) -> None:
    """Keep the variable pytest changes at each phase of each test as it was when the module's
    executor started: its workers inherit this process's environment, and only a worker whose
    environment is the warm processes' (but for its own variables) may take one."""
    monkeypatch.setenv("PYTEST_CURRENT_TEST", STARTED_UNDER)


def _history(checkpoint: Path) -> list[dict]:
    """The epochs the script recorded in its checkpoint (renamed into place: never partial)."""
    if not checkpoint.exists():
        return []
    return torch.load(checkpoint, weights_only=True)["history"]


def test_a_plain_ddp_script_grows_shrinks_and_survives_a_killed_worker(service, tmp_path,
                                                                       monkeypatch):
    same_environment(monkeypatch)
    store, c = service.store, service.c
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
        if changes and changes[0][:2] in gangs() and service.zygote_ready():
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
    # each rank got torchrun's variables, its gang's size and restart count; every gang after
    # the first (whose start started the zygote) ran in warm processes
    for restart, world in gangs():
        envs = told(folder, restart, world)
        for rank, env in enumerate(envs):
            assert_torchruns_variables(env, rank=rank, world=world, restart=restart, job=job.id)
            assert env["MASTER_PORT"] == envs[0]["MASTER_PORT"]
            if restart > 0:
                assert_warm(env)
        assert not (folder / f"env-r{restart}-rank{world}.json").exists()


#: the command line of a process the zygote forked: no interpreter was started for the worker
ZYGOTE_ARGS = ["-m", "dyntrain.service.executors.warm", "--zygote"]
STARTED_UNDER = "tests/service/test_torchrun.py (the module's executor)"
ZYGOTE_READY = re.compile(r"dyntrain warm zygote \d+ ready")


def told(folder: Path, restart: int, world: int) -> list[dict]:
    """What each rank of gang ``restart`` wrote of its variables and process."""
    return [json.loads((folder / f"env-r{restart}-rank{rank}.json").read_text())
            for rank in range(world)]


def assert_torchruns_variables(env: dict, *, rank: int, world: int, restart: int, job: str,
                               threads: str = "1") -> None:
    """Every variable torchrun's agent sets, as it sets it for a single-node gang (and the
    thread count the job pins, which the script's torch uses)."""
    expected = worker_env(rank=rank, world_size=world, master_addr="127.0.0.1",
                          master_port=int(env["MASTER_PORT"]), restart=restart, run_id=job,
                          max_restarts=0)
    assert {k: env[k] for k in expected} == expected, env
    assert env["OMP_NUM_THREADS"] == threads and env["threads"] == int(threads), env
    # the rest of the job's numerics are no variable torch reads: the script's own choice
    assert env["deterministic"] is False, env


def assert_warm(env: dict) -> None:
    """The rank ran in a process the zygote forked, torch imported before the script ran."""
    assert env["torch_preloaded"] and env["cmdline"] == ZYGOTE_ARGS, env


def test_a_warm_gang_trains_the_model_a_cold_gang_trains(service, tmp_path, monkeypatch):
    """The same job, pinned to 2 threads (and naming deterministic algorithms, which only the
    exact mode applies), twice at once: from warm processes, and from cold ones
    (a variable the interpreter reads at start-up that a warm process did not start with keeps
    a worker off them, as before warm gangs; a variable of the submitter's shell, read by no one
    before the script, does not). The same variables and the same final model, bit for bit."""
    same_environment(monkeypatch)
    store, c = service.store, service.c
    wait_until(service.zygote_ready, "the zygote's imports")
    jobs = {kind: store.jobs.submit(queue="q", command=[
        sys.executable, PLAIN_DDP, "--epochs", "3", "--checkpoint-dir", str(tmp_path / kind)],
        environment={"DYNTRAIN_THREADS": "2", "DYNTRAIN_DETERMINISTIC": "1",
                     **({"PYTHONWARNINGS": "default"} if kind == "cold"
                        else {"SUBMITTERS_OWN": "1"})},
        resources=SMALL, workers=(2, 2), launcher="torchrun") for kind in ("cold", "warm")}
    store.environments.update_compute_environment("spot", desired_slots=4)
    try:
        drive(c, lambda: all(store.jobs.get_job(j.id).status.is_terminal()
                             for j in jobs.values()), timeout=240)
    finally:
        store.environments.update_compute_environment("spot", desired_slots=2)
    final = {}
    for kind, job in jobs.items():
        folder = tmp_path / kind
        assert store.jobs.get_job(job.id).status is JobStatus.SUCCEEDED
        assert [h["restart"] for h in _history(folder / "checkpoint.pt")] == [0] * 3
        for rank, env in enumerate(told(folder, 0, 2)):
            assert_torchruns_variables(env, rank=rank, world=2, restart=0, job=job.id,
                                       threads="2")
            if kind == "warm":
                assert_warm(env)
            else:
                assert not env["torch_preloaded"] and env["cmdline"][0] == PLAIN_DDP, env
        final[kind] = torch.load(folder / "checkpoint.pt", weights_only=True)["model"]
    assert final["cold"].keys() == final["warm"].keys()
    assert all(torch.equal(final["cold"][k], final["warm"][k]) for k in final["cold"])
