"""The controller with real worker processes: plain, array, dependent and elastic jobs, capacity
changes, suspension and resumption, timeouts, grace periods and a service restart."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from dyntrain.elastic.sampler import epoch_permutation
from dyntrain.service.controller import Controller, ControllerConfig
from dyntrain.service.executors.local import LocalExecutor
from dyntrain.service.model import (
    CapacityType,
    ComputeEnvironmentSpec,
    Dependency,
    DependencyType,
    JobQueueSpec,
    JobStatus,
    Resources,
)
from dyntrain.service.store import WORKER_EXITED, Store

LEDGER = str(Path(__file__).resolve().parent.parent / "scripts" / "ledger_train.py")
SMALL = Resources(0.25, 0, 256)
PY = sys.executable


def make_controller(store: Store, tmp_path: Path, grace: float = 30.0) -> Controller:
    executor = LocalExecutor(tmp_path / "executor", cpus=2, memory_mib=16_384)
    return Controller(store, executor, ControllerConfig(tmp_path / "runs", grace_seconds=grace,
                                                        schedule_every=0.05))


def setup_env(store: Store, name="local", slots=4, ctype=CapacityType.ON_DEMAND, price=1.0,
              queue="q", priority=1) -> None:
    store.create_compute_environment(ComputeEnvironmentSpec(
        name, ctype, price, SMALL, 0, slots, max(slots, 8)))
    store.create_job_queue(JobQueueSpec(queue, priority, (name,)))


def spot_setup(tmp_path: Path, slots: int, grace: float = 30.0):
    """A SQLite store with one SPOT environment of ``slots`` slots, queue q, and a controller."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    setup_env(store, "spot", slots=slots, ctype=CapacityType.SPOT, price=0.3)
    return store, make_controller(store, tmp_path, grace=grace)


def submit_ledger(store: Store, workers: tuple[int, int], epochs: int = 30):
    """An elastic job running the exactly-once ledger workload."""
    return store.submit(queue="q", command=[PY, LEDGER, "--epochs", str(epochs), "--step-delay",
                                            "0.004"], resources=SMALL, workers=workers)


def drive(controller: Controller, until, timeout: float = 120.0, on_step=None):
    """Step the controller until ``until()`` is true (a deadline, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        controller.step()
        if on_step is not None:
            on_step()
        if until():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the controller")


def terminal(store: Store, *ids: str):
    return lambda: all(store.get_job(i).status.is_terminal() for i in ids)


def expected_counts(epochs: int, samples=96, global_batch=16, seed=3) -> torch.Tensor:
    counts = torch.zeros(samples)
    for epoch in range(epochs):
        counts[epoch_permutation(seed, epoch, samples)[: (samples // global_batch) *
                                                       global_batch]] += 1
    return counts


def test_plain_jobs_succeed_fail_and_retry(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    ok = store.submit(queue="q", command=[PY, "-c", "print('hello from a job')"], resources=SMALL)
    bad = store.submit(queue="q", command=[PY, "-c", "import sys; sys.exit(3)"], resources=SMALL,
                       retry_attempts=2)
    drive(c, terminal(store, ok.id, bad.id))
    ok, bad = store.get_job(ok.id), store.get_job(bad.id)
    assert ok.status is JobStatus.SUCCEEDED and ok.attempts == 1
    assert bad.status is JobStatus.FAILED and bad.attempts == 2 and bad.exit_code == 3
    assert "attempt 2 of 2" in bad.status_reason
    assert [a.exit_code for a in store.list_attempts(bad.id)] == [3, 3]
    assert any("hello from a job" in line.line for line in store.read_log(ok.id)[0])
    assert all(w.state == WORKER_EXITED for w in store.list_workers(active=False))


def test_array_children_run_in_sequence_and_see_their_index(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    code = ("import os, time; print('start', os.environ['AWS_BATCH_JOB_ARRAY_INDEX'], "
            "time.time())")
    parent = store.submit(queue="q", command=[PY, "-c", code], resources=SMALL, array_size=3,
                          depends_on=[Dependency("", DependencyType.SEQUENTIAL)],
                          job_id="seqarray")
    drive(c, terminal(store, parent.id))
    assert store.get_job(parent.id).status is JobStatus.SUCCEEDED
    starts = []
    for i in range(3):
        child = store.get_job(f"{parent.id}:{i}")
        assert child.status is JobStatus.SUCCEEDED
        line = store.read_log(child.id)[0][0].line.split()
        assert line[1] == str(i)
        starts.append((child.started_at, child.stopped_at))
    assert starts[0][1] <= starts[1][0] and starts[1][1] <= starts[2][0]


def test_failed_dependency_fails_the_dependent(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    first = store.submit(queue="q", command=[PY, "-c", "raise SystemExit(1)"], resources=SMALL)
    second = store.submit(queue="q", command=[PY, "-c", "print(1)"], resources=SMALL,
                          depends_on=[Dependency(first.id)])
    drive(c, terminal(store, first.id, second.id))
    assert store.get_job(second.id).status is JobStatus.FAILED
    assert store.get_job(second.id).status_reason == f"dependency {first.id} failed"
    assert store.list_attempts(second.id) == []


def test_elastic_job_grows_and_shrinks_with_capacity_and_stays_exactly_once(tmp_path):
    store, c = spot_setup(tmp_path, slots=1)
    job = submit_ledger(store, workers=(1, 3))
    sizes: list[int] = []  # world sizes the job trained at, in order
    metrics = c.run_dir(job.id) / "metrics.jsonl"

    def watch():
        if not metrics.exists():
            return
        lines = metrics.read_text().splitlines()
        n = json.loads(lines[-1])["world_size"] if lines else 0
        if n and (not sizes or sizes[-1] != n):
            sizes.append(n)
        desired = store.get_compute_environment("spot").spec.desired_slots
        if sizes == [1] and desired == 1:
            store.update_compute_environment("spot", desired_slots=3)  # capacity appears
        if 3 in sizes and desired == 3:
            store.update_compute_environment("spot", desired_slots=2)  # and some is taken back

    drive(c, terminal(store, job.id), on_step=watch, timeout=180)
    final = store.get_job(job.id)
    assert final.status is JobStatus.SUCCEEDED, final.status_reason
    assert sizes[:3] == [1, 3, 2], sizes
    assert final.attempts == 1  # shrinking is not a failed attempt
    kinds = [e.kind for e in store.list_events(job.id)]
    assert "membership.join" in kinds and "membership.leave" in kinds, [
        (e.kind, e.payload) for e in store.list_events(job.id)]
    counts = torch.load(c.run_dir(job.id) / "final.pt", weights_only=True)["counts"]
    assert torch.equal(counts, expected_counts(30))
    usage = store.job_usage(job.id)
    assert {u.capacity_type for u in usage} == {CapacityType.SPOT}


def test_elastic_job_below_min_is_suspended_and_resumes_from_its_checkpoint(tmp_path):
    store, c = spot_setup(tmp_path, slots=2)
    job = submit_ledger(store, workers=(2, 2))
    seen: list[str] = []

    def watch():
        j = store.get_job(job.id)
        if j.status is JobStatus.RUNNING and j.current_workers == 2 and not seen:
            metrics = c.run_dir(job.id) / "metrics.jsonl"
            if metrics.exists() and len(metrics.read_text().splitlines()) > 20:
                store.update_compute_environment("spot", desired_slots=1)  # below min
                seen.append("reclaimed")
        if j.status is JobStatus.RUNNABLE and seen == ["reclaimed"]:
            seen.append(j.status_reason)
            store.update_compute_environment("spot", desired_slots=2)  # capacity is back

    drive(c, terminal(store, job.id), on_step=watch, timeout=180)
    final = store.get_job(job.id)
    assert final.status is JobStatus.SUCCEEDED, final.status_reason
    assert seen[0] == "reclaimed" and seen[1].startswith("preempted: suspended"), seen
    assert final.preemptions == 1 and final.attempts == 1
    assert len(store.list_attempts(job.id)) == 2
    resumes = [e for e in store.list_events(job.id) if e.kind == "membership.resume"]
    assert resumes and resumes[0].payload["start_step"] > 0
    counts = torch.load(c.run_dir(job.id) / "final.pt", weights_only=True)["counts"]
    assert torch.equal(counts, expected_counts(30))


def test_timeout_fails_the_job(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    job = store.submit(queue="q", command=[PY, "-c", "import time; time.sleep(60)"],
                       resources=SMALL, timeout_seconds=1.0)
    drive(c, terminal(store, job.id), timeout=60)
    final = store.get_job(job.id)
    assert final.status is JobStatus.FAILED and "timeout after 1s" in final.status_reason


def test_worker_ignoring_the_notice_is_killed_after_the_grace_period(tmp_path):
    store, c = spot_setup(tmp_path, slots=1, grace=1.0)
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('ignored', "
                "flush=True)); print('up', flush=True); time.sleep(60)")
    job = store.submit(queue="q", command=[PY, "-c", stubborn], resources=SMALL, retry_attempts=1)

    def reclaim():
        lines = [x.line for x in store.read_log(job.id)[0]]
        if "up" in lines and store.get_compute_environment("spot").spec.desired_slots == 1:
            store.update_compute_environment("spot", desired_slots=0)

    drive(c, lambda: store.get_job(job.id).status is JobStatus.RUNNABLE and
          not store.list_workers(job.id), on_step=reclaim, timeout=60)
    final = store.get_job(job.id)
    assert final.preemptions == 1 and final.attempts == 0  # not counted against retries
    assert final.status_reason.startswith("preempted")
    attempt = store.list_attempts(job.id)[0]
    assert attempt.exit_code in (-9, 137, None)
    drive(c, lambda: any(x.line == "ignored" for x in store.read_log(job.id)[0]), timeout=10)


def test_restart_adopts_plain_workers_and_requeues_elastic_jobs(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    store = Store(url)
    store.create_all()
    setup_env(store)
    c = make_controller(store, tmp_path)
    plain = store.submit(queue="q", command=[PY, "-c", "import time; print('run'); "
                                             "time.sleep(10); print('done')"], resources=SMALL)
    elastic = store.submit(queue="q", command=[PY, LEDGER, "--epochs", "20", "--step-delay",
                                               "0.004"], resources=SMALL, workers=(1, 1))
    metrics = c.run_dir(elastic.id) / "metrics.jsonl"
    drive(c, lambda: store.get_job(plain.id).status is JobStatus.RUNNING and metrics.exists()
          and len(metrics.read_text().splitlines()) > 30)
    # the service dies: its coordinator threads with it; worker processes live on
    c.executor.shutdown()
    for attempt in c.attempts.values():
        if attempt.host is not None:
            attempt.host.tcp = None
    store.close()

    store2 = Store(url)
    c2 = make_controller(store2, tmp_path)
    notes = c2.recover()
    assert any(plain.id in n and "re-adopted" in n for n in notes), notes
    assert any(elastic.id in n and "resumes from its newest checkpoint" in n for n in notes)
    assert store2.get_job(elastic.id).status is JobStatus.RUNNABLE
    drive(c2, terminal(store2, plain.id, elastic.id), timeout=180)
    assert store2.get_job(plain.id).status is JobStatus.SUCCEEDED
    assert len(store2.list_attempts(plain.id)) == 1  # ran once, never twice
    log = [x.line for x in store2.read_log(plain.id)[0]]
    assert log.count("run") <= 1
    assert store2.get_job(elastic.id).status is JobStatus.SUCCEEDED
    counts = torch.load(c2.run_dir(elastic.id) / "final.pt", weights_only=True)["counts"]
    assert torch.equal(counts, expected_counts(20))


@pytest.mark.parametrize("kind", ["cancel", "terminate"])
def test_cancel_and_terminate(store, tmp_path, kind):
    setup_env(store)
    c = make_controller(store, tmp_path)
    job = store.submit(queue="q", command=[PY, "-c", "import time; print('up', flush=True); "
                                           "time.sleep(60)"], resources=SMALL)
    if kind == "cancel":
        assert c.cancel(job.id)
        assert store.get_job(job.id).status is JobStatus.FAILED
        assert store.get_job(job.id).status_reason == "cancelled by user"
        return
    drive(c, lambda: store.get_job(job.id).status is JobStatus.RUNNING)
    assert not c.cancel(job.id)  # running: cancel does nothing
    c.terminate(job.id)
    drive(c, terminal(store, job.id), timeout=60)
    assert store.get_job(job.id).status_reason == "terminated by user"


def test_a_crashed_elastic_worker_costs_wasted_work_and_the_job_goes_on(tmp_path):
    store, c = spot_setup(tmp_path, slots=2)
    job = submit_ledger(store, workers=(1, 2))
    metrics = c.run_dir(job.id) / "metrics.jsonl"
    killed: list[str] = []

    def crash_one():
        if killed or not metrics.exists():
            return
        rows = [json.loads(x) for x in metrics.read_text().splitlines()]
        if rows and rows[-1]["world_size"] == 2 and len(rows) > 20:
            victim = store.list_workers(job.id)[-1]
            c.executor.signal(victim.id, "KILL")
            killed.append(victim.id)

    drive(c, terminal(store, job.id), on_step=crash_one, timeout=180)
    final = store.get_job(job.id)
    assert killed and final.status is JobStatus.SUCCEEDED, final.status_reason
    assert final.attempts == 1  # a crash of one worker is not a failed attempt
    crashes = [e for e in store.list_events(job.id) if e.kind == "membership.crash"]
    assert len(crashes) == 1 and crashes[0].payload["workers"] == killed
    wasted = [u for u in store.job_usage(job.id) if u.wasted]
    assert wasted and all(0 < u.worker_seconds < 5 for u in wasted)
    counts = torch.load(c.run_dir(job.id) / "final.pt", weights_only=True)["counts"]
    assert torch.equal(counts, expected_counts(30))
