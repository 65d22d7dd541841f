"""Fair share, live: two teams' elastic jobs on a 4-slot environment under the ``fairshare``
policy. The first team's job holds every slot; the second team's job arrives and gets its share
as the first shrinks (a graceful notice to one worker at a time); both end with the model of
their static run, bit for bit."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from conftest import shared_static_run
from dyntrain.service.core.allocation import policy_by_name
from dyntrain.service.core.fairshare import FairsharePolicy
from dyntrain.service.core.model import (
    CapacityType,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    JobStatus,
    Resources,
    WorkerState,
)
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.controller import Controller
from dyntrain.service.executors.local import LocalExecutor
from dyntrain.service.store import Store
from test_elastic_e2e import max_param_diff

from .test_controller import drive, terminal

LEDGER = str(Path(__file__).resolve().parent.parent / "scripts" / "ledger_train.py")
SMALL = Resources(0.25, 0, 256)


def running(store: Store, job_id: str) -> int:
    return sum(1 for w in store.workers.list_workers(job_id, active=True)
               if w.state == WorkerState.RUNNING)


def wind_down(controller: Controller, ids) -> None:
    """Nothing outlives a failed test: the jobs still running terminated, the executor shut."""
    left = [j for j in ids if not controller.store.jobs.get_job(j).status.is_terminal()]
    for job_id in left:
        controller.terminate(job_id)
    if left:
        drive(controller, terminal(controller.store, *left), 60)
    controller.executor.shutdown()


EPOCHS = ("--epochs", "10")  # a short ledger run: 60 steps


def test_a_second_team_gets_its_share_as_the_first_teams_job_shrinks(tmp_path,
                                                                      tmp_path_factory):
    static = shared_static_run(tmp_path_factory, "ledger-10-epochs", LEDGER, *EPOCHS)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    store.environments.create_compute_environment(ComputeEnvironmentSpec(
        "local", CapacityType.ON_DEMAND, 1.0, SMALL, 0, 4, 4))
    store.policies.create("teams", FairsharePolicy())
    store.environments.create_job_queue(JobQueueSpec("q", 1, ("local",), scheduling_policy="teams"))
    executor = LocalExecutor(tmp_path / "executor", cpus=2, memory_mib=16_384)
    controller = Controller(store, executor, ControllerConfig(
        tmp_path / "runs", grace_seconds=30, schedule_every=0.05,
        policy=policy_by_name("fairshare")))
    holds = {team: tmp_path / f"{team}.hold" for team in ("red", "blue")}
    for hold in holds.values():
        hold.touch()

    def submit(team: str) -> str:  # the ledger run, slowed while its hold file exists
        return store.jobs.submit(queue="q", command=[sys.executable, LEDGER, *EPOCHS,
                                                     "--slow-while", str(holds[team])],
                                 resources=SMALL, workers=(1, 4), share=team).id

    ids: list[str] = []
    try:
        red = submit("red")
        ids.append(red)
        drive(controller, lambda: running(store, red) == 4, 120)
        blue = submit("blue")
        ids.append(blue)
        arrived = time.monotonic()
        drive(controller, lambda: running(store, red) == 2 and running(store, blue) == 2, 120)
        took = time.monotonic() - arrived
        print(f"the second team had its share {took:.1f} s after it arrived")
        assert took < 60, took
        reasons = [w.leave_reason or "" for w in store.workers.list_workers(red, active=False)]
        assert sum("shrink: fair share" in r for r in reasons) == 2, reasons
        for hold in holds.values():
            hold.unlink()
        drive(controller, lambda: all(store.jobs.get_job(j).status.is_terminal()
                                      for j in (red, blue)), 240)
    finally:
        wind_down(controller, ids)
    for job_id in (red, blue):
        job = store.jobs.get_job(job_id)
        assert job.status is JobStatus.SUCCEEDED, (job.status_reason, job.attempts)
        assert job.attempts == 1  # a shrink is no failed attempt
        assert max_param_diff(static, controller.run_dir(job_id)) == 0.0


def test_a_plain_job_is_preempted_for_a_waiting_share_where_the_queue_allows_it(tmp_path):
    """Plain jobs on a 2-slot environment, in a queue that allows preempting them: the second
    team's job arrives while the first team's two jobs hold both slots; the newer of them goes
    back to RUNNABLE (a preemption, not an attempt), the second team's job starts, and all
    three succeed."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    store.environments.create_compute_environment(ComputeEnvironmentSpec(
        "local", CapacityType.ON_DEMAND, 1.0, SMALL, 0, 2, 2))
    store.policies.create("teams", FairsharePolicy())
    store.environments.create_job_queue(JobQueueSpec("q", 1, ("local",), scheduling_policy="teams",
                                                     preempt_plain_jobs=True))
    executor = LocalExecutor(tmp_path / "executor", cpus=2, memory_mib=16_384)
    controller = Controller(store, executor, ControllerConfig(
        tmp_path / "runs", grace_seconds=30, schedule_every=0.05,
        policy=policy_by_name("fairshare")))
    hold = tmp_path / "hold"
    hold.touch()
    wait = f"import os, time\nwhile os.path.exists({str(hold)!r}): time.sleep(0.05)"

    def submit(team: str) -> str:  # a plain job that runs while the hold file exists
        return store.jobs.submit(queue="q", command=[sys.executable, "-c", wait],
                                 resources=SMALL, share=team).id

    ids: list[str] = []
    try:
        ids += [submit("red"), submit("red")]
        drive(controller, lambda: all(running(store, j) == 1 for j in ids), 60)
        ids.append(submit("blue"))
        drive(controller, lambda: running(store, ids[2]) == 1, 60)
        old, new = store.jobs.get_job(ids[0]), store.jobs.get_job(ids[1])
        assert old.status is JobStatus.RUNNING and old.preemptions == 0
        assert new.status is JobStatus.RUNNABLE, new.status_reason
        assert (new.preemptions, new.attempts) == (1, 0)  # not counted against its retries
        hold.unlink()
        drive(controller, lambda: all(store.jobs.get_job(j).status.is_terminal()
                                      for j in ids), 60)
    finally:
        wind_down(controller, ids)
    for job_id in ids:
        job = store.jobs.get_job(job_id)
        assert job.status is JobStatus.SUCCEEDED, job.status_reason
        assert job.attempts == 1, (job_id, job.attempts)
