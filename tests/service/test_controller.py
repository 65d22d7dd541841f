"""The controller with real worker processes: plain, array, dependent and elastic jobs, capacity
changes, suspension and resumption, timeouts, grace periods and a service restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import read_jsonl
from dyntrain.elastic.numerics import KernelLevel
from dyntrain.elastic.step.sampler import epoch_permutation
from dyntrain.service.core.executor import WorkerSpec
from dyntrain.service.core.model import (
    CapacityType,
    ComputeEnvironmentSpec,
    Dependency,
    DependencyType,
    JobQueueSpec,
    JobStatus,
    Resources,
    WorkerState,
)
from dyntrain.service.core.records import WorkerRecord
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.controller import Controller
from dyntrain.service.executors.local import LocalExecutor
from dyntrain.service.store import Store

LEDGER = str(Path(__file__).resolve().parent.parent / "scripts" / "ledger_train.py")
SMALL = Resources(0.25, 0, 256)
PY = sys.executable


def make_controller(store: Store, tmp_path: Path, grace: float = 30.0) -> Controller:
    executor = LocalExecutor(tmp_path / "executor", cpus=2, memory_mib=16_384)
    return Controller(store, executor, ControllerConfig(tmp_path / "runs", grace_seconds=grace,
                                                        schedule_every=0.05))


def setup_env(store: Store, name="local", slots=4, ctype=CapacityType.ON_DEMAND, price=1.0,
              queue="q", priority=1) -> None:
    store.environments.create_compute_environment(ComputeEnvironmentSpec(
        name, ctype, price, SMALL, 0, slots, max(slots, 8)))
    store.environments.create_job_queue(JobQueueSpec(queue, priority, (name,)))


def spot_setup(tmp_path: Path, slots: int, grace: float = 30.0):
    """A SQLite store with one SPOT environment of ``slots`` slots, queue q, and a controller."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    setup_env(store, "spot", slots=slots, ctype=CapacityType.SPOT, price=0.3)
    return store, make_controller(store, tmp_path, grace=grace)


def submit_ledger(store: Store, workers: tuple[int, int], epochs: int = 30,
                  slow_while: Path | None = None):
    """An elastic job running the exactly-once ledger workload (slowed while ``slow_while``
    exists, so that it cannot finish before a test saw what it waits for)."""
    slow = ["--slow-while", str(slow_while)] if slow_while is not None else []
    return store.jobs.submit(
        queue="q",
        command=[PY, LEDGER, "--epochs", str(epochs), "--step-delay", "0.004", *slow],
        resources=SMALL,
        workers=workers,
    )


def drive(controller: Controller, until, timeout: float = 120.0, on_step=None):
    """Step the controller until ``until()`` is true, waiting between steps as the service's
    loop does (``executor.wait``: a worker's exit ends the wait early), so not with
    ``wait_until``, whose pauses grow; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        controller.step()
        if on_step is not None:
            on_step()
        if until():
            return
        controller.executor.wait(controller.config.tick_seconds)  # as the service's loop
    jobs = [(j.id[:8], j.status.value, j.status_reason)
            for j in controller.store.jobs.list_jobs(limit=10)]
    raise TimeoutError(f"the controller did not get there in {timeout:g} s: {jobs}, "
                       f"last plan {controller.plan}")


def terminal(store: Store, *ids: str):
    return lambda: all(store.jobs.get_job(i).status.is_terminal() for i in ids)


def expected_counts(epochs: int, samples=96, global_batch=16, seed=3) -> torch.Tensor:
    counts = torch.zeros(samples)
    for epoch in range(epochs):
        counts[epoch_permutation(seed, epoch, samples)[: (samples // global_batch) *
                                                       global_batch]] += 1
    return counts


def test_plain_jobs_succeed_fail_and_retry(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    ok = store.jobs.submit(queue="q", command=[PY, "-c", "print('hello from a job')"],
                           resources=SMALL)
    bad = store.jobs.submit(
        queue="q", command=[PY, "-c", "import sys; sys.exit(3)"], resources=SMALL, retry_attempts=2
    )
    drive(c, terminal(store, ok.id, bad.id))
    ok, bad = store.jobs.get_job(ok.id), store.jobs.get_job(bad.id)
    assert ok.status is JobStatus.SUCCEEDED and ok.attempts == 1
    assert bad.status is JobStatus.FAILED and bad.attempts == 2 and bad.exit_code == 3
    assert "attempt 2 of 2" in bad.status_reason
    assert [a.exit_code for a in store.jobs.list_attempts(bad.id)] == [3, 3]
    assert any("hello from a job" in line.line for line in store.logs.read_log(ok.id)[0])
    assert all(w.state == WorkerState.EXITED for w in store.workers.list_workers(active=False))


def test_a_plain_job_computes_with_its_numerics_not_the_hosts(tmp_path):
    """A job that is not elastic gets its numerics as torch's libraries read them (threads and
    kernel level: the defaults, or what DYNTRAIN_THREADS & co. say), under the job's own
    variables: a plain job computes what an elastic job of the same numerics does. (The
    environment a worker gets does not depend on the store: SQLite only.)"""
    from dyntrain.elastic.numerics import Numerics

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    setup_env(store)
    c = make_controller(store, tmp_path)
    code = ("import os, torch; print('numerics', torch.get_num_threads(), "
            "os.environ['OMP_NUM_THREADS'], os.environ['ATEN_CPU_CAPABILITY'], "
            "os.environ.get('MKL_CBWR', '-'))")
    jobs = {"default": {}, "pinned": {"DYNTRAIN_THREADS": "2", "DYNTRAIN_CPU_KERNELS": "default"},
            "own": {"OMP_NUM_THREADS": "3"}}
    ids = {name: store.jobs.submit(queue="q", command=[PY, "-c", code], resources=SMALL,
                              environment=env).id for name, env in jobs.items()}
    drive(c, terminal(store, *ids.values()))
    seen = {}
    for name, job_id in ids.items():
        assert store.jobs.get_job(job_id).status is JobStatus.SUCCEEDED, store.logs.read_log(job_id)
        seen[name] = next(line.line.split()[1:] for line in store.logs.read_log(job_id)[0]
                          if line.line.startswith("numerics"))
    level = Numerics().cpu_kernels.env()
    assert seen["default"] == ["1", "1", level["ATEN_CPU_CAPABILITY"],
                               level.get("MKL_CBWR", "-")]
    low = Numerics(cpu_kernels="default").cpu_kernels.env()
    assert seen["pinned"] == ["2", "2", "default", low.get("MKL_CBWR", "-")]
    assert seen["own"][1:] == ["3", *seen["default"][2:]], seen  # the job's own variable wins


def test_array_children_run_in_sequence_and_see_their_index(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    code = ("import os, time; print('start', os.environ['AWS_BATCH_JOB_ARRAY_INDEX'], "
            "time.time())")
    parent = store.jobs.submit(queue="q", command=[PY, "-c", code], resources=SMALL, array_size=3,
                          depends_on=[Dependency("", DependencyType.SEQUENTIAL)],
                          job_id="seqarray")
    drive(c, terminal(store, parent.id))
    assert store.jobs.get_job(parent.id).status is JobStatus.SUCCEEDED
    starts = []
    for i in range(3):
        child = store.jobs.get_job(f"{parent.id}:{i}")
        assert child.status is JobStatus.SUCCEEDED
        line = store.logs.read_log(child.id)[0][0].line.split()
        assert line[1] == str(i)
        starts.append((child.started_at, child.stopped_at))
    assert starts[0][1] <= starts[1][0] and starts[1][1] <= starts[2][0]


def test_failed_dependency_fails_the_dependent(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    first = store.jobs.submit(queue="q", command=[PY, "-c", "raise SystemExit(1)"], resources=SMALL)
    second = store.jobs.submit(queue="q", command=[PY, "-c", "print(1)"], resources=SMALL,
                          depends_on=[Dependency(first.id)])
    drive(c, terminal(store, first.id, second.id))
    assert store.jobs.get_job(second.id).status is JobStatus.FAILED
    assert store.jobs.get_job(second.id).status_reason == f"dependency {first.id} failed"
    assert store.jobs.list_attempts(second.id) == []


def test_elastic_job_grows_and_shrinks_with_capacity_and_stays_exactly_once(tmp_path):
    store, c = spot_setup(tmp_path, slots=1)
    slow = tmp_path / "slow"
    slow.touch()
    job = submit_ledger(store, workers=(1, 3), slow_while=slow)
    sizes: list[int] = []  # world sizes the job trained at, in order
    metrics = c.run_dir(job.id) / "metrics.jsonl"

    def watch():
        if not metrics.exists():
            return
        rows = read_jsonl(metrics)  # a line still being written waits
        n = rows[-1]["world_size"] if rows else 0
        if n and (not sizes or sizes[-1] != n):
            sizes.append(n)
        desired = store.environments.get_compute_environment("spot").spec.desired_slots
        if sizes == [1] and desired == 1:
            store.environments.update_compute_environment("spot",
                                                          desired_slots=3)  # capacity appears
        if 3 in sizes and desired == 3:
            store.environments.update_compute_environment("spot",
                                                          desired_slots=2)  # and some is taken back
        if sizes[-1:] == [2] and not shrunk:
            now = store.jobs.get_job(job.id)  # what `dyntrain status` and `--wait` show
            shrunk.append((now.status_reason, now.progress, now.preemptions))
        if sizes[-1:] == [2]:
            slow.unlink(missing_ok=True)  # seen all three: let it finish

    shrunk: list = []
    drive(c, terminal(store, job.id), on_step=watch, timeout=180)
    final = store.jobs.get_job(job.id)
    assert final.status is JobStatus.SUCCEEDED, final.status_reason
    assert sizes[:3] == [1, 3, 2], sizes
    assert final.attempts == 1  # shrinking is not a failed attempt
    reason, progress, preemptions = shrunk[0]
    assert reason.startswith("training with 2 worker(s) since generation") and \
        "generation 0" not in reason, reason
    assert progress["world_size"] == 2 and progress["step"] > 0 and "loss" in progress
    assert {"samples_per_s", "total_steps", "epoch", "generation"} <= set(progress)
    assert preemptions == final.preemptions == 1  # one worker's slot taken back
    kinds = [e.kind for e in store.logs.list_events(job.id)]
    assert "membership.join" in kinds and "membership.leave" in kinds, [
        (e.kind, e.payload) for e in store.logs.list_events(job.id)]
    counts = torch.load(c.run_dir(job.id) / "final.pt", weights_only=True)["counts"]
    assert torch.equal(counts, expected_counts(30))
    usage = store.workers.job_usage(job.id)
    assert {u.capacity_type for u in usage} == {CapacityType.SPOT}


def test_elastic_job_below_min_is_suspended_and_resumes_from_its_checkpoint(tmp_path):
    store, c = spot_setup(tmp_path, slots=2)
    slow = tmp_path / "slow"
    slow.touch()
    job = submit_ledger(store, workers=(2, 2), slow_while=slow)
    seen: list[str] = []

    def watch():
        j = store.jobs.get_job(job.id)
        if j.status is JobStatus.RUNNING and j.current_workers == 2 and not seen:
            metrics = c.run_dir(job.id) / "metrics.jsonl"
            if metrics.exists() and len(metrics.read_text().splitlines()) > 20:
                store.environments.update_compute_environment("spot", desired_slots=1)  # below min
                seen.append("reclaimed")
        if j.status is JobStatus.RUNNABLE and seen == ["reclaimed"]:
            seen.append(j.status_reason)
            store.environments.update_compute_environment("spot",
                                                          desired_slots=2)  # capacity is back
            slow.unlink()

    drive(c, terminal(store, job.id), on_step=watch, timeout=180)
    final = store.jobs.get_job(job.id)
    assert final.status is JobStatus.SUCCEEDED, final.status_reason
    assert seen[0] == "reclaimed" and seen[1].startswith("preempted: suspended"), seen
    assert final.preemptions == 1 and final.attempts == 1
    assert len(store.jobs.list_attempts(job.id)) == 2
    resumes = [e for e in store.logs.list_events(job.id) if e.kind == "membership.resume"]
    assert resumes and resumes[0].payload["start_step"] > 0
    counts = torch.load(c.run_dir(job.id) / "final.pt", weights_only=True)["counts"]
    assert torch.equal(counts, expected_counts(30))


def test_timeout_fails_the_job(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    job = store.jobs.submit(queue="q", command=[PY, "-c", "import time; time.sleep(60)"],
                       resources=SMALL, timeout_seconds=1.0)
    drive(c, terminal(store, job.id), timeout=60)
    final = store.jobs.get_job(job.id)
    assert final.status is JobStatus.FAILED and "timeout after 1s" in final.status_reason


def test_worker_ignoring_the_notice_is_killed_after_the_grace_period(tmp_path):
    store, c = spot_setup(tmp_path, slots=1, grace=1.0)
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('ignored', "
                "flush=True)); print('up', flush=True); time.sleep(60)")
    job = store.jobs.submit(queue="q", command=[PY, "-c", stubborn], resources=SMALL,
                            retry_attempts=1)

    def reclaim():
        lines = [x.line for x in store.logs.read_log(job.id)[0]]
        spot = store.environments.get_compute_environment("spot")
        if "up" in lines and spot.spec.desired_slots == 1:
            store.environments.update_compute_environment("spot", desired_slots=0)

    drive(c, lambda: store.jobs.get_job(job.id).status is JobStatus.RUNNABLE and
          not store.workers.list_workers(job.id), on_step=reclaim, timeout=60)
    final = store.jobs.get_job(job.id)
    assert final.preemptions == 1 and final.attempts == 0  # not counted against retries
    assert final.status_reason.startswith("preempted")
    attempt = store.jobs.list_attempts(job.id)[0]
    assert attempt.exit_code in (-9, 137, None)
    drive(c, lambda: any(x.line == "ignored" for x in store.logs.read_log(job.id)[0]), timeout=60)


def restarted(tmp_path: Path, c: Controller, store: Store) -> tuple[Store, Controller]:
    """The service dies (its coordinator threads with it; workers live on) and starts again."""
    c.executor.shutdown()
    for attempt in c.attempts.values():
        if attempt.host is not None:
            attempt.host.tcp = None
    store.close()
    store2 = Store(store.url)
    return store2, make_controller(store2, tmp_path)


WAIT_FOR_GO = ("import os, sys, time; name = sys.argv[1]; m = open(name + '.marks', 'a'); "
               "m.write('start\\n'); m.flush(); "
               "[time.sleep(0.02) for _ in iter(lambda: os.path.exists(name + '.go'), True)]; "
               "m.write('end\\n'); sys.exit(int(sys.argv[2]))")


def test_restart_adopts_plain_workers_and_reads_the_exits_it_missed(tmp_path):
    store, c = spot_setup(tmp_path, slots=4)
    base = {name: str(tmp_path / name) for name in ("runs", "killed", "bad")}
    jobs = {name: store.jobs.submit(queue="q", name=name, resources=SMALL, retry_attempts=2 if
                               name == "killed" else 1,
                               command=[PY, "-c", WAIT_FOR_GO, base[name], str(rc)])
            for name, rc in (("runs", 0), ("killed", 0), ("bad", 3))}

    def marks(name: str) -> str:
        path = Path(base[name] + ".marks")
        return path.read_text() if path.exists() else ""

    def handles_recorded() -> bool:  # a worker may run before the step that records its handle
        return all(w.handle is not None for j in jobs.values()
                   for w in store.workers.list_workers(j.id))

    drive(c, lambda: all(marks(n) == "start\n" for n in jobs) and handles_recorded())
    killed_pid = int(store.workers.list_workers(jobs["killed"].id)[0].handle["ref"].split(":")[0])
    store2, c2 = restarted(tmp_path, c, store)
    # while no service runs: one worker dies of a signal, one exits 3
    os.kill(killed_pid, signal.SIGUSR1)
    Path(base["bad"] + ".go").touch()
    drive(c, lambda: marks("bad").endswith("end\n"))
    notes = c2.recover()
    assert f"{jobs['runs'].id}: re-adopted 1 running worker(s)" in notes
    Path(base["runs"] + ".go").touch()
    Path(base["killed"] + ".go").touch()
    drive(c2, terminal(store2, *(j.id for j in jobs.values())))
    runs, killed, bad = (store2.jobs.get_job(jobs[n].id) for n in ("runs", "killed", "bad"))
    assert (runs.status, runs.attempts, marks("runs")) == (JobStatus.SUCCEEDED, 1,
                                                          "start\nend\n")
    assert (killed.status, killed.attempts, killed.preemptions) == (JobStatus.SUCCEEDED, 2, 0)
    assert "killed by SIGUSR1" in store2.jobs.list_attempts(killed.id)[0].reason
    assert marks("killed") == "start\nstart\nend\n"  # the retry its rules asked for, no more
    assert (bad.status, bad.attempts, bad.exit_code) == (JobStatus.FAILED, 1, 3)
    assert marks("bad") == "start\nend\n"


def test_restart_ends_a_job_whose_worker_finished_while_the_service_was_down(tmp_path):
    store, c = spot_setup(tmp_path, slots=1)
    flag = tmp_path / "flag"
    job = store.jobs.submit(queue="q", resources=SMALL, command=[
        PY, "-c", f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
        "print('done', flush=True)"])
    drive(c, lambda: store.jobs.get_job(job.id).status is JobStatus.RUNNING)
    [w] = store.workers.list_workers(job.id)
    store2, c2 = restarted(tmp_path, c, store)
    flag.touch()
    status = c.executor.status_path(w.id)
    # the old supervisor records the exit
    drive(c, lambda: status.exists() and '"exit_code": 0' in status.read_text())
    assert c2.recover() == [f"{job.id}: 1 worker(s) exited while the service was down"]
    drive(c2, terminal(store2, job.id))
    final = store2.jobs.get_job(job.id)
    assert (final.status, final.attempts, final.preemptions) == (JobStatus.SUCCEEDED, 1, 0)
    assert final.stopped_at == pytest.approx(json.loads(status.read_text())["ended_at"])
    assert [x.line for x in store2.logs.read_log(job.id)[0]] == ["done"]


def test_restart_finds_a_worker_whose_handle_was_not_stored_or_requeues_one_never_started(
        tmp_path):
    store, c = spot_setup(tmp_path, slots=2)
    jobs = [store.jobs.submit(queue="q", resources=SMALL, command=[PY, "-c", "print('ran')"])
            for _ in range(2)]
    for job in jobs:  # a service that died inside _start_workers, before storing the handle
        assert store.jobs.transition(job.id, JobStatus.SUBMITTED,
                                JobStatus.STARTING, "starting workers", started_at=1.0)
        store.jobs.add_attempt(job.id, 1, 1.0)
        store.workers.add_worker(
            WorkerRecord(f"{job.id}-a1-w0", job.id, 1, "spot", "SPOT", 0.3, None, "RUNNING", 1.0)
        )
    started = jobs[0]  # ... after its worker started
    log = c.log_path(started.id, f"{started.id}-a1-w0")
    log.parent.mkdir(parents=True)
    c.executor.start(WorkerSpec(started.id, 1, f"{started.id}-a1-w0", [PY, "-c", "print('ran')"],
                                {}, SMALL, None, str(log)))
    store2, c2 = restarted(tmp_path, c, store)
    notes = c2.recover()
    assert f"{jobs[1].id}: its worker never started: queued again" in notes
    drive(c2, terminal(store2, *(j.id for j in jobs)))
    for job in jobs:
        final = store2.jobs.get_job(job.id)
        assert final.status is JobStatus.SUCCEEDED and final.attempts == 1
        assert [x.line for x in store2.logs.read_log(job.id)[0]] == ["ran"]  # once each
    assert store2.jobs.get_job(jobs[1].id).preemptions == 1
    assert store2.jobs.get_job(started.id).preemptions == 0


def test_restart_requeues_elastic_jobs_that_do_not_reattach(tmp_path):
    store, c = spot_setup(tmp_path, slots=1)
    # With re-attaching off the workers stop with their coordinator and the job resumes from its
    # checkpoint; re-attaching (the default) is tests/service/test_elastic_restart.py.
    c.config.reattach_seconds = 0
    elastic = store.jobs.submit(queue="q", command=[PY, LEDGER, "--epochs", "20", "--step-delay",
                                               "0.004"], resources=SMALL, workers=(1, 1))
    metrics = c.run_dir(elastic.id) / "metrics.jsonl"
    drive(c, lambda: metrics.exists() and len(metrics.read_text().splitlines()) > 30)
    store2, c2 = restarted(tmp_path, c, store)
    c2.config.reattach_seconds = 0
    notes = c2.recover()
    assert any(elastic.id in n and "resumes from its newest checkpoint" in n for n in notes)
    assert store2.jobs.get_job(elastic.id).status is JobStatus.RUNNABLE
    drive(c2, terminal(store2, elastic.id), timeout=180)
    assert store2.jobs.get_job(elastic.id).status is JobStatus.SUCCEEDED
    counts = torch.load(c2.run_dir(elastic.id) / "final.pt", weights_only=True)["counts"]
    assert torch.equal(counts, expected_counts(20))


def test_commands_that_cannot_start_fail_counted_with_the_cause(store, tmp_path):
    setup_env(store)
    c = make_controller(store, tmp_path)
    missing = store.jobs.submit(queue="q", command=["/nonexistent/cmd"], resources=SMALL,
                           retry_attempts=3)
    too_long = store.jobs.submit(queue="q", command=["/bin/echo"] + ["x" * 65_536] * 40,
                            resources=SMALL)
    drive(c, terminal(store, missing.id, too_long.id))
    missing, too_long = store.jobs.get_job(missing.id), store.jobs.get_job(too_long.id)
    assert (missing.status, missing.attempts, missing.preemptions) == (JobStatus.FAILED, 3, 0)
    assert missing.status_reason == ("CannotStartContainerError: no executable "
                                     "'/nonexistent/cmd': no such file (attempt 3 of 3)")
    assert too_long.status is JobStatus.FAILED and too_long.attempts == 1
    assert too_long.status_reason.startswith("CannotStartContainerError: cannot start "
                                             "'/bin/echo': Argument list too long")
    assert not store.workers.list_workers(active=True)


@pytest.mark.parametrize("kind", ["cancel", "terminate"])
def test_cancel_and_terminate(store, tmp_path, kind):
    setup_env(store)
    c = make_controller(store, tmp_path)
    job = store.jobs.submit(queue="q", command=[PY, "-c", "import time; print('up', flush=True); "
                                           "time.sleep(60)"], resources=SMALL)
    if kind == "cancel":
        assert c.cancel(job.id)
        assert store.jobs.get_job(job.id).status is JobStatus.FAILED
        assert store.jobs.get_job(job.id).status_reason == "cancelled by user"
        return
    drive(c, lambda: store.jobs.get_job(job.id).status is JobStatus.RUNNING)
    assert not c.cancel(job.id)  # running: cancel does nothing
    c.terminate(job.id)
    assert store.jobs.get_job(job.id).status_reason == \
        "terminating (terminated by user): its workers were told to stop"
    drive(c, terminal(store, job.id), timeout=60)
    done = store.jobs.get_job(job.id)
    assert done.status_reason == "terminated by user"
    assert done.attempts == 1  # the attempt that ran counts, with how it ended
    (attempt,) = store.jobs.list_attempts(job.id)
    assert attempt.reason == "terminated by user" and attempt.stopped_at is not None


def test_a_crashed_elastic_worker_costs_wasted_work_and_the_job_goes_on(tmp_path):
    store, c = spot_setup(tmp_path, slots=2)
    slow = tmp_path / "slow"
    slow.touch()
    job = submit_ledger(store, workers=(1, 2), slow_while=slow)
    metrics = c.run_dir(job.id) / "metrics.jsonl"
    killed: list[str] = []

    def crash_one():
        if killed or not metrics.exists():
            return
        rows = read_jsonl(metrics)
        if rows and rows[-1]["world_size"] == 2 and len(rows) > 20:
            victim = store.workers.list_workers(job.id)[-1]
            c.executor.signal(victim.id, "KILL")
            killed.append(victim.id)
            slow.unlink()

    drive(c, terminal(store, job.id), on_step=crash_one, timeout=180)
    final = store.jobs.get_job(job.id)
    assert killed and final.status is JobStatus.SUCCEEDED, final.status_reason
    assert final.attempts == 1  # a crash of one worker is not a failed attempt
    crashes = [e for e in store.logs.list_events(job.id) if e.kind == "membership.crash"]
    assert len(crashes) == 1 and crashes[0].payload["workers"] == killed
    wasted = [u for u in store.workers.job_usage(job.id) if u.wasted]
    assert wasted and all(0 < u.worker_seconds < 5 for u in wasted)
    counts = torch.load(c.run_dir(job.id) / "final.pt", weights_only=True)["counts"]
    assert torch.equal(counts, expected_counts(30))


def test_a_multinode_job_starts_its_nodes_together_and_ends_with_its_main_node(tmp_path):
    store, c = spot_setup(tmp_path, slots=3, grace=5.0)
    # the main node exits once the others have printed (a loaded machine starts them slowly,
    # and the main node's exit ends them whether or not they got that far)
    node = ("import os, pathlib, sys, time\n"
            "i = int(os.environ['AWS_BATCH_JOB_NODE_INDEX'])\n"
            "print('node', i, 'of', os.environ['AWS_BATCH_JOB_NUM_NODES'], 'main',"
            " os.environ['AWS_BATCH_JOB_MAIN_NODE_INDEX'], flush=True)\n"
            "here = pathlib.Path(sys.argv[1])\n"
            "(here / f'up-{i}').touch()\n"
            "end = time.time() + 120\n"
            "while not i and len(list(here.glob('up-*'))) < 3 and time.time() < end:\n"
            "    time.sleep(0.05)\n"
            "time.sleep(60) if i else sys.exit(5)\n")
    job = store.jobs.submit(queue="q", command=[PY, "-c", node, str(tmp_path)], resources=SMALL,
                       num_nodes=3)
    drive(c, terminal(store, job.id), timeout=60)
    job = store.jobs.get_job(job.id)
    assert (job.status, job.exit_code, job.attempts) == (JobStatus.FAILED, 5, 1)  # node 0's
    workers = store.workers.list_workers(job.id, active=False)
    assert len(workers) == 3 and all(w.state == WorkerState.EXITED for w in workers)
    assert sorted(w.leave_reason or "" for w in workers) == [
        "exited with code 5", "the main node exited", "the main node exited"]
    assert sorted(x.line for x in store.logs.read_log(job.id)[0]) == [
        f"node {i} of 3 main 0" for i in range(3)]


def test_a_job_the_executor_cannot_place_waits_runnable_with_the_reason_then_starts(store,
                                                                                    tmp_path):
    """An environment declared larger than its executor: the job that does not fit waits
    RUNNABLE with the executor's reason, however many passes go by, its refused placements
    neither attempts nor preemptions and its history empty; once room frees it starts."""
    setup_env(store, slots=4)  # four slots of 0.25 cpus, on an executor with room for one
    executor = LocalExecutor(tmp_path / "executor", cpus=0.25, memory_mib=16_384)
    c = Controller(store, executor, ControllerConfig(tmp_path / "runs", schedule_every=0.05))
    gate = tmp_path / "gate"
    gate.touch()
    hold = f"import os, time\nwhile os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
    first = store.jobs.submit(queue="q", command=[PY, "-c", hold], resources=SMALL)
    drive(c, lambda: store.jobs.get_job(first.id).status is JobStatus.RUNNING)
    second = store.jobs.submit(queue="q", command=[PY, "-c", "print('placed at last')"],
                          resources=SMALL)
    passes: list[float] = []
    c.pass_observers.append(passes.append)
    drive(c, lambda: len(passes) >= 60)  # many passes while the executor is full
    job = store.jobs.get_job(second.id)
    assert job.status is JobStatus.RUNNABLE, (job.status, job.status_reason)
    assert (job.attempts, job.preemptions) == (0, 0)
    assert store.jobs.list_attempts(second.id) == []
    assert store.workers.list_workers(second.id, active=False) == []
    assert job.status_reason.startswith("waiting for room on the executor: ")
    assert "needs cpus=0.25" in job.status_reason and "free: cpus=0 " in job.status_reason
    assert c.waiting[second.id].reason == job.status_reason
    gate.unlink()
    drive(c, terminal(store, first.id, second.id))
    job = store.jobs.get_job(second.id)
    assert (job.status, job.attempts, job.preemptions) == (JobStatus.SUCCEEDED, 1, 0)
    assert len(store.jobs.list_attempts(second.id)) == 1
    assert any("placed at last" in line.line for line in store.logs.read_log(second.id)[0])


def test_a_job_the_executor_can_place_only_in_part_waits_with_one_attempt_recorded(store,
                                                                                   tmp_path):
    """A multi-node job of two nodes on an executor with room for one: its first node starts,
    the second is refused; the first is stopped and the job waits RUNNABLE with the reason,
    neither an attempt nor a preemption, and is not started in part again and again (its own
    node's exit frees no more than it was refused with).

    The controller's clock advances 0.1 s per step (a pass each): its refusal is also offered
    again ``RETRY_SECONDS`` after it whatever is free (a refusal for another reason than room),
    which 60 passes on a loaded machine could reach by the wall clock."""
    setup_env(store, slots=4)
    executor = LocalExecutor(tmp_path / "executor", cpus=0.25, memory_mib=16_384)
    now = [time.time()]

    def tick() -> None:
        now[0] += 0.1  # > schedule_every, which 0.05 may miss by rounding

    c = Controller(store, executor, ControllerConfig(tmp_path / "runs", schedule_every=0.05,
                                                     grace_seconds=5.0), clock=lambda: now[0])
    job = store.jobs.submit(queue="q", command=[PY, "-c", "import time; time.sleep(60)"],
                       resources=SMALL, num_nodes=2)
    drive(c, lambda: (store.jobs.get_job(job.id).status is JobStatus.RUNNABLE
                      and not store.workers.list_workers(job.id)), on_step=tick)
    passes: list[float] = []
    c.pass_observers.append(passes.append)
    drive(c, lambda: len(passes) >= 60, on_step=tick)
    assert job.id in c.launcher.refusals  # held: nothing freed, its refusal not expired
    job = store.jobs.get_job(job.id)
    assert (job.status, job.attempts, job.preemptions) == (JobStatus.RUNNABLE, 0, 0)
    assert job.status_reason.startswith("waiting for room on the executor: worker ")
    [attempt] = store.jobs.list_attempts(job.id)
    assert attempt.reason == job.status_reason
    assert not store.workers.list_workers(job.id) and not executor.poll()


def test_a_job_pinned_to_kernels_its_hosts_cannot_run_fails_at_start_with_the_reason(store,
                                                                                    tmp_path):
    """Hosts that run only the baseline kernels (a CPU without AVX2) and jobs pinned to avx2
    that got past submit (the service moved to older hosts): each attempt fails at its start,
    counted, with the reason, and the jobs end FAILED instead of starting workers that refuse
    to run again and again."""
    setup_env(store)
    executor = LocalExecutor(tmp_path / "executor", cpus=2, memory_mib=16_384,
                             kernel_levels=[KernelLevel.DEFAULT])
    c = Controller(store, executor, ControllerConfig(tmp_path / "runs", schedule_every=0.05))
    avx2 = {"DYNTRAIN_CPU_KERNELS": "avx2"}
    plain = store.jobs.submit(queue="q", command=[PY, "-c", "pass"], resources=SMALL,
                         retry_attempts=2, environment=avx2)
    elastic = store.jobs.submit(queue="q", command=[PY, "-c", "pass"], resources=SMALL,
                           workers=(1, 2), environment=avx2)
    drive(c, terminal(store, plain.id, elastic.id))
    why = (f"CannotStartContainerError: host {socket.gethostname()} runs cpu kernels up to "
           "default, not the job's avx2: start the job with --cpu-kernels default "
           "(DYNTRAIN_CPU_KERNELS=default), a level every host runs")
    for job, attempts in ((store.jobs.get_job(plain.id), 2), (store.jobs.get_job(elastic.id), 1)):
        assert (job.status, job.attempts, job.preemptions) == (JobStatus.FAILED, attempts, 0)
        assert job.status_reason == f"{why} (attempt {attempts} of {attempts})"
        assert all(w.handle is None for w in store.workers.list_workers(job.id, active=False))
