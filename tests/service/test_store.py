"""The job service's persistence layer, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sqlalchemy as sa

from dyntrain.elastic.numerics import KernelLevel, default_kernels
from dyntrain.service.core.model import (
    MAX_ARRAY_SIZE,
    CapacityType,
    CEStatus,
    ComputeEnvironmentSpec,
    Dependency,
    DependencyType,
    ElasticSettings,
    JobDefinitionSpec,
    JobQueueSpec,
    JobStatus,
    Resources,
    RetryAction,
    RetryRule,
    RetryStrategy,
    State,
    ValidationError,
    WorkerState,
)
from dyntrain.service.core.records import INACTIVE, WorkerRecord
from dyntrain.service.store import Store, metadata
from dyntrain.service.store.scheduling import AttemptEnd, UsageRow, WorkerExitRow
from dyntrain.testing.wait import wait_until

S = JobStatus


def counts(store: Store) -> dict[str, int]:
    """Rows in every table: a request that fails must leave these unchanged."""
    with store.engine.connect() as conn:
        return {t.name: conn.scalar(sa.select(sa.func.count()).select_from(t))
                for t in metadata.sorted_tables}


def setup_basics(store: Store) -> None:
    store.environments.create_compute_environment(ComputeEnvironmentSpec(
        "od", CapacityType.ON_DEMAND, 1.0, Resources(4, 1, 8192), 0, 1, 8))
    store.environments.create_compute_environment(ComputeEnvironmentSpec(
        "spot", CapacityType.SPOT, 0.3, max_slots=16))
    store.environments.create_job_queue(JobQueueSpec("q", 10, ("spot", "od")))
    store.definitions.register_job_definition(JobDefinitionSpec(
        "train", ("python", "train.py", "--lr", "Ref::lr", "--epochs", "Ref::epochs"),
        environment=(("A", "1"), ("B", "2")), parameters=(("lr", "0.1"), ("epochs", "3")),
        resources=Resources(2, 0, 2048),
        retry_strategy=RetryStrategy(3, (RetryRule(RetryAction.EXIT, on_exit_code="2"),)),
        timeout_seconds=600, elastic=ElasticSettings(1, 4)))


def runnable_jobs(store: Store, n: int) -> list[str]:
    ids = [store.jobs.submit(queue="q", command=["true"]).id for _ in range(n)]
    for job_id in ids:
        assert store.jobs.transition(job_id, S.SUBMITTED, S.RUNNABLE)
    return ids


# ------------------------------------------------------------------------------ round trips


def test_compute_environment_round_trip(store):
    spec = ComputeEnvironmentSpec("gpu-spot", CapacityType.SPOT, 2.5, Resources(8, 1, 65536),
                                  1, 2, 10, State.ENABLED)
    made = store.environments.create_compute_environment(spec)
    assert made.spec == spec and made.status is CEStatus.VALID and made.status_reason is None
    assert store.environments.get_compute_environment("gpu-spot") == made
    store.environments.create_compute_environment(ComputeEnvironmentSpec("a-first"))
    assert [ce.name for ce in store.environments.list_compute_environments()] == ["a-first",
                                                                                  "gpu-spot"]

    upd = store.environments.update_compute_environment(
        "gpu-spot", state="DISABLED", desired_slots=5, max_slots=20, price_per_slot_hour=1.75,
        status=CEStatus.INVALID, status_reason="spot market closed")
    got = store.environments.get_compute_environment("gpu-spot")
    assert got == upd
    assert got.spec.state is State.DISABLED and got.spec.desired_slots == 5
    assert got.spec.max_slots == 20 and got.spec.price_per_slot_hour == 1.75
    assert got.spec.min_slots == 1 and got.spec.slot == Resources(8, 1, 65536)
    assert got.status is CEStatus.INVALID and got.status_reason == "spot market closed"
    store.environments.update_compute_environment("gpu-spot", status="VALID", status_reason=None)
    assert store.environments.get_compute_environment("gpu-spot").status_reason is None

    store.environments.delete_compute_environment("gpu-spot")
    with pytest.raises(ValidationError, match="unknown compute environment 'gpu-spot'"):
        store.environments.get_compute_environment("gpu-spot")


def test_job_queue_round_trip(store):
    setup_basics(store)
    store.environments.create_job_queue(JobQueueSpec("low", 1, ("od",)))
    store.environments.create_job_queue(JobQueueSpec("high", 100, ("od", "spot"), State.DISABLED))
    high = store.environments.get_job_queue("high")
    assert high.spec == JobQueueSpec("high", 100, ("od", "spot"), State.DISABLED)
    assert [q.name for q in store.environments.list_job_queues()] == ["high", "q", "low"]
    assert store.environments.list_job_queues()[0] == high

    store.environments.update_job_queue("low", priority=500, state="DISABLED",
                           compute_environments=["spot", "od"])
    low = store.environments.get_job_queue("low")
    assert low.spec == JobQueueSpec("low", 500, ("spot", "od"), State.DISABLED)
    # dyntrain's own setting: fair share may preempt the queue's plain jobs
    store.environments.update_job_queue("low", preempt_plain_jobs=True)
    assert store.environments.get_job_queue("low").spec.preempt_plain_jobs
    store.environments.update_job_queue("low", priority=500)  # kept when not given
    assert store.environments.list_job_queues()[0].spec.preempt_plain_jobs
    store.environments.update_job_queue("low", preempt_plain_jobs=False)
    assert [q.name for q in store.environments.list_job_queues()] == ["low", "high", "q"]

    store.environments.delete_job_queue("high")
    assert [q.name for q in store.environments.list_job_queues()] == ["low", "q"]
    # with the queues gone the environment can go too
    store.environments.delete_job_queue("low")
    store.environments.delete_job_queue("q")
    store.environments.delete_compute_environment("od")


def test_job_definition_revisions(store):
    setup_basics(store)
    spec2 = JobDefinitionSpec("train", ("python", "v2.py"))
    spec3 = JobDefinitionSpec("train", ("python", "v3.py"), timeout_seconds=5)
    assert store.definitions.register_job_definition(spec2) == ("train", 2)
    assert store.definitions.register_job_definition(spec3) == ("train", 3)
    assert store.definitions.register_job_definition(JobDefinitionSpec("other",
                                                                       ("x",))) == ("other", 1)

    first = store.definitions.get_job_definition("train", 1)
    assert first.spec.parameters == (("epochs", "3"), ("lr", "0.1"))
    assert first.spec.retry_strategy.evaluate_on_exit[0].on_exit_code == "2"
    assert first.spec.elastic == ElasticSettings(1, 4) and first.spec.timeout_seconds == 600
    latest = store.definitions.get_job_definition("train")
    assert (latest.revision, latest.spec, latest.ref) == (3, spec3, "train:3")

    store.definitions.deregister_job_definition("train", 3)
    assert store.definitions.get_job_definition("train").revision == 2
    assert store.definitions.get_job_definition("train", 3).status == INACTIVE
    assert [d.ref for d in store.definitions.list_job_definitions()] == ["other:1", "train:1",
                                                                         "train:2"]
    assert [
        d.ref for d in store.definitions.list_job_definitions("train", include_inactive=True)
    ] == ["train:1", "train:2", "train:3"]
    # numbering continues after a deregistered revision
    assert store.definitions.register_job_definition(spec2) == ("train", 4)
    with pytest.raises(ValidationError, match="train:3 is deregistered"):
        store.jobs.submit(queue="q", definition="train:3")
    assert store.jobs.submit(queue="q", definition="train").definition_revision == 4


def test_concurrent_registers_get_distinct_revisions(store):
    spec = JobDefinitionSpec("race", ("true",))
    got, errors = [], []

    def register() -> None:
        try:
            for _ in range(5):
                got.append(store.definitions.register_job_definition(spec)[1])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=register) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(got) == list(range(1, 21))


def test_submit_from_definition_resolves_and_merges(store):
    setup_basics(store)
    before = time.time()
    job = store.jobs.submit(queue="q", definition="train:1", name="my-run",
                       parameters={"lr": 0.01}, environment={"B": "x", "C": "3"})
    assert job.status is S.SUBMITTED and job.created_at >= before - 1
    assert job.command == ("python", "train.py", "--lr", "0.01", "--epochs", "3")
    assert job.parameters == {"lr": "0.01", "epochs": "3"}
    assert job.environment == {"A": "1", "B": "x", "C": "3"}
    assert (job.name, job.queue, job.definition_name, job.definition_revision) == (
        "my-run", "q", "train", 1)
    assert job.resources == Resources(2, 0, 2048) and job.timeout_seconds == 600
    assert job.retry_strategy.attempts == 3 and job.elastic == ElasticSettings(1, 4)
    assert (job.attempts, job.preemptions, job.current_workers) == (0, 0, 0)
    assert job.started_at is job.stopped_at is job.exit_code is None
    assert len(job.id) == 32 and store.jobs.get_job(job.id) == job

    over = store.jobs.submit(queue="q", definition="train", workers=(2, 8), retry_attempts=1,
                        timeout_seconds=30, resources=Resources(1, 1, 512))
    assert (over.min_workers, over.max_workers) == (2, 8)
    assert over.retry_strategy.attempts == 1
    assert over.retry_strategy.evaluate_on_exit == job.retry_strategy.evaluate_on_exit
    assert over.timeout_seconds == 30 and over.resources == Resources(1, 1, 512)
    assert store.jobs.get_job(over.id) == over

    inline = store.jobs.submit(queue="q", command=["echo", "Ref::who"], parameters={"who": "me"})
    assert inline.command == ("echo", "me") and inline.definition_name is None
    assert inline.elastic is None and inline.name == "inline"
    assert store.jobs.get_job(inline.id) == inline
    # a command given with a definition overrides the definition's command
    assert store.jobs.submit(queue="q", definition="train", command=["env"]).command == ("env",)


def test_job_update_fields_round_trip(store):
    setup_basics(store)
    job = store.jobs.submit(queue="q", definition="train")
    assert store.jobs.update_job(job.id, status=S.RUNNING, attempts=1, preemptions=2,
                            started_at=10.5, current_workers=3, min_workers=2, max_workers=6,
                            status_reason="running on spot")
    assert store.jobs.transition(job.id, S.RUNNING, S.FAILED, "exit 1", exit_code=1,
                                 stopped_at=20.0)
    got = store.jobs.get_job(job.id)
    assert (got.status, got.status_reason, got.exit_code) == (S.FAILED, "exit 1", 1)
    assert (got.attempts, got.preemptions, got.current_workers) == (1, 2, 3)
    assert (got.started_at, got.stopped_at) == (10.5, 20.0)
    assert (got.min_workers, got.max_workers) == (2, 6)
    assert got.updated_at >= got.created_at


# --------------------------------------------------------------------- validation errors


BAD_REQUESTS = {
    "unknown queue": (
        lambda s: s.jobs.submit(queue="nope", definition="train"),
        "unknown job queue 'nope'",
    ),
    "unknown definition": (
        lambda s: s.jobs.submit(queue="q", definition="nope"),
        "unknown job definition 'nope'",
    ),
    "unknown revision": (
        lambda s: s.jobs.submit(queue="q", definition="train:9"),
        "unknown job definition 'train:9'",
    ),
    "no definition or command": (lambda s: s.jobs.submit(queue="q"), "definition or a command"),
    "missing Ref": (
        lambda s: s.jobs.submit(queue="q", command=["echo", "Ref::zzz"]),
        "parameter 'zzz' is referenced",
    ),
    "array too small": (
        lambda s: s.jobs.submit(queue="q", definition="train", array_size=1),
        "array size must be 2-10000",
    ),
    "array too large": (
        lambda s: s.jobs.submit(queue="q", definition="train", array_size=MAX_ARRAY_SIZE + 1),
        "array size must be 2-10000",
    ),
    "unknown dependency": (
        lambda s: s.jobs.submit(queue="q", definition="train", depends_on=[Dependency("ghost")]),
        "depends on unknown job.*ghost",
    ),
    "self dependency cycle": (
        lambda s: s.jobs.submit(
            queue="q", definition="train", job_id="me", depends_on=[Dependency("me")]
        ),
        "dependency cycle",
    ),
    "duplicate job id": (
        lambda s: s.jobs.submit(queue="q", command=["x"], job_id="existing"),
        "job id 'existing' already exists",
    ),
    "N_TO_N size mismatch": (
        lambda s: s.jobs.submit(
            queue="q",
            command=["x"],
            array_size=3,
            depends_on=[Dependency("arr", DependencyType.N_TO_N)],
        ),
        "N_TO_N dependency on 'arr'",
    ),
    "SEQUENTIAL without array": (
        lambda s: s.jobs.submit(
            queue="q", command=["x"], depends_on=[Dependency("", DependencyType.SEQUENTIAL)]
        ),
        "SEQUENTIAL dependency needs an array job",
    ),
    "bad workers": (
        lambda s: s.jobs.submit(queue="q", command=["x"], workers=(3, 2)),
        "workers must satisfy",
    ),
    "disabled queue": (lambda s: s.jobs.submit(queue="off", command=["x"]), "'off' is DISABLED"),
    "deregistered definition": (
        lambda s: s.jobs.submit(queue="q", definition="old:1"),
        "old:1 is deregistered",
    ),
    "duplicate environment": (
        lambda s: s.environments.create_compute_environment(ComputeEnvironmentSpec("od")),
        "compute environment 'od' already exists",
    ),
    "duplicate queue": (
        lambda s: s.environments.create_job_queue(JobQueueSpec("q", 1, ("od",))),
        "job queue 'q' already exists",
    ),
    "queue with unknown environment": (
        lambda s: s.environments.create_job_queue(JobQueueSpec("q2", 1, ("od", "mars"))),
        "unknown compute environment.*mars",
    ),
    "queue update to unknown environment": (
        lambda s: s.environments.update_job_queue("q", priority=99, compute_environments=["mars"]),
        "unknown compute environment.*mars",
    ),
    "delete environment in use": (
        lambda s: s.environments.delete_compute_environment("spot"),
        "'spot' is used by job queue.*q",
    ),
    "delete queue with jobs": (lambda s: s.environments.delete_job_queue("q"), "unfinished job"),
    "update unknown environment": (
        lambda s: s.environments.update_compute_environment("x", max_slots=3),
        "unknown compute environment 'x'",
    ),
    "invalid environment update": (
        lambda s: s.environments.update_compute_environment("od", max_slots=0),
        "desired_slots|min_slots",
    ),
    "delete unknown queue": (
        lambda s: s.environments.delete_job_queue("x"),
        "unknown job queue 'x'",
    ),
    "deregister unknown": (
        lambda s: s.definitions.deregister_job_definition("train", 7),
        "unknown job definition 'train:7'",
    ),
    "get unknown job": (lambda s: s.jobs.get_job("nope"), "unknown job 'nope'"),
    "update unknown job": (
        lambda s: s.jobs.update_job("nope", status=S.RUNNING),
        "unknown job 'nope'",
    ),
    "update immutable field": (
        lambda s: s.jobs.update_job("existing", queue="other"),
        "queue cannot be updated",
    ),
    "update bad status": (
        lambda s: s.jobs.update_job("existing", status="DONE"),
        "unknown status 'DONE'",
    ),
    "attempt of unknown job": (lambda s: s.jobs.add_attempt("nope", 1, 0.0), "unknown job 'nope'"),
    "duplicate attempt": (
        lambda s: s.jobs.add_attempt("existing", 1, 0.0),
        "already has attempt 1",
    ),
    "finish missing attempt": (
        lambda s: s.jobs.finish_attempt("existing", 5, 0, "ok", 1.0),
        "has no attempt 5",
    ),
    "usage of unknown job": (
        lambda s: s.workers.record_usage("nope", 1, "od", "SPOT", 1, 1),
        "unknown job 'nope'",
    ),
    "log of unknown job": (
        lambda s: s.logs.append_log("nope", 1, "w0", ["x"]),
        "unknown job 'nope'",
    ),
    "event of unknown job": (lambda s: s.logs.add_event("nope", "x", {}), "unknown job 'nope'"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_raises_and_changes_nothing(store, case):
    setup_basics(store)
    store.environments.create_job_queue(JobQueueSpec("off", 1, ("od",), State.DISABLED))
    store.definitions.register_job_definition(JobDefinitionSpec("old", ("x",)))
    store.definitions.deregister_job_definition("old", 1)
    store.jobs.submit(queue="q", command=["x"], job_id="existing")
    store.jobs.add_attempt("existing", 1, 0.0)
    store.jobs.submit(queue="q", command=["x"], array_size=2, job_id="arr")
    action, message = BAD_REQUESTS[case]
    before = counts(store)
    snapshot = (
        store.environments.list_compute_environments(),
        store.environments.list_job_queues(),
        store.definitions.list_job_definitions(include_inactive=True),
        store.jobs.list_jobs(limit=1000),
    )
    with pytest.raises(ValidationError, match=message) as err:
        action(store)
    assert "\n" not in str(err.value)
    assert counts(store) == before
    assert snapshot == (
        store.environments.list_compute_environments(),
        store.environments.list_job_queues(),
        store.definitions.list_job_definitions(include_inactive=True),
        store.jobs.list_jobs(limit=1000),
    )


def test_dependencies_round_trip(store):
    setup_basics(store)
    a = store.jobs.submit(queue="q", command=["a"])
    b = store.jobs.submit(queue="q", command=["b"], depends_on=[Dependency(a.id)])
    arr1 = store.jobs.submit(queue="q", command=["x"], array_size=4)
    arr2 = store.jobs.submit(queue="q", command=["y"], array_size=4, job_id="arr2", depends_on=[
        Dependency(arr1.id, DependencyType.N_TO_N), Dependency("", DependencyType.SEQUENTIAL),
        Dependency(b.id)])
    # a chain through an array child is fine (no false cycle)
    c = store.jobs.submit(queue="q", command=["c"], depends_on=[Dependency("arr2:3")])
    assert store.jobs.get_job(b.id).depends_on == (Dependency(a.id),)
    assert set(store.jobs.get_job("arr2").depends_on) == {
        Dependency(arr1.id, DependencyType.N_TO_N), Dependency("arr2", DependencyType.SEQUENTIAL),
        Dependency(b.id)}
    assert store.jobs.get_job(c.id).depends_on == (Dependency("arr2:3"),)
    assert store.jobs.list_dependents(a.id) == [Dependency(b.id)]
    assert store.jobs.list_dependents(arr1.id) == [Dependency("arr2", DependencyType.N_TO_N)]
    listed = {j.id: j for j in store.jobs.list_jobs(top_level=True)}
    assert listed["arr2"] == store.jobs.get_job("arr2") == arr2


# -------------------------------------------------------------------- compare-and-set


def test_compare_and_set(store):
    setup_basics(store)
    job = store.jobs.submit(queue="q", command=["x"])
    assert store.jobs.transition(job.id, S.SUBMITTED, S.RUNNABLE, "waiting for capacity")
    assert not store.jobs.transition(job.id, S.SUBMITTED, S.RUNNABLE, "again")
    got = store.jobs.get_job(job.id)
    assert got.status is S.RUNNABLE and got.status_reason == "waiting for capacity"
    assert not store.jobs.update_job(job.id, expected_status=S.RUNNING, current_workers=5)
    assert store.jobs.get_job(job.id).current_workers == 0
    assert store.jobs.update_job(job.id, expected_status="RUNNABLE", current_workers=5)
    assert store.jobs.update_job(job.id, status_reason="unconditional")  # no expected status
    assert store.jobs.get_job(job.id).current_workers == 5


def test_blocked_writer_sees_the_winners_commit(store):
    """A transition racing an open transaction waits for it, then finds the status moved."""
    setup_basics(store)
    (job_id,) = runnable_jobs(store, 1)
    from dyntrain.service.store.schema import jobs
    result, sent, main = [], [], threading.get_ident()

    def other_threads_writes(conn, cursor, statement, *args) -> None:
        if threading.get_ident() != main and statement.startswith(("BEGIN IMMEDIATE", "UPDATE")):
            sent.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", other_threads_writes)
    try:
        with store.engine.connect() as conn:
            tx = conn.begin()
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id, jobs.c.status == "RUNNABLE")
                         .values(status="STARTING"))
            other = threading.Thread(target=lambda: result.append(
                store.jobs.transition(job_id, S.RUNNABLE, S.STARTING, "loser")))
            other.start()
            wait_until(lambda: sent, "the second writer to send its write", 30)
            if store.engine.dialect.name == "postgresql":  # SQLite's writer waits in BEGIN
                wait_until(lambda: lock_waiters(store), "the second writer to wait for a lock",
                           30)
            assert other.is_alive(), "the second writer should wait for the first"
            tx.commit()
        other.join(30)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", other_threads_writes)
    assert result == [False]
    assert store.jobs.get_job(job_id).status is S.STARTING


def lock_waiters(store: Store) -> int:
    """How many sessions of the store's PostgreSQL database wait for a lock."""
    with store.engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()")).scalar()


def test_concurrent_transition_threads(store):
    setup_basics(store)
    ids = runnable_jobs(store, 25)
    stores = [Store(store.url) for _ in range(2)]
    barriers = {job_id: threading.Barrier(2) for job_id in ids}
    wins: list[list[str]] = [[], []]

    def controller(k: int) -> None:
        for job_id in ids:
            barriers[job_id].wait(10)
            if stores[k].jobs.transition(job_id, S.RUNNABLE, S.STARTING, f"controller {k}"):
                wins[k].append(job_id)
    threads = [threading.Thread(target=controller, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    assert not set(wins[0]) & set(wins[1])
    assert sorted(wins[0] + wins[1]) == sorted(ids)
    assert store.jobs.count_jobs_by_status()[S.STARTING] == len(ids)
    for job_id in ids:
        assert store.jobs.get_job(job_id).status_reason == (
            "controller 0" if job_id in wins[0] else "controller 1")


CONTROLLER = textwrap.dedent("""
    import json, sys
    from dyntrain.service.store import Store
    store = Store(sys.argv[1])
    ids = sys.argv[2:]
    store.jobs.get_job(ids[0])  # connect before the race starts
    print("ready", flush=True)
    sys.stdin.readline()
    won = [i for i in ids if store.jobs.transition(i, "RUNNABLE", "STARTING", "proc")]
    print(json.dumps(won), flush=True)
""")


def test_concurrent_transition_processes(store):
    setup_basics(store)
    ids = runnable_jobs(store, 40)
    procs = [subprocess.Popen([sys.executable, "-c", CONTROLLER, store.url, *order],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for order in (ids, ids[::-1])]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    won = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert not set(won[0]) & set(won[1])
    assert sorted(won[0] + won[1]) == sorted(ids)


# ------------------------------------------------------------------------ array jobs


def test_array_submit_10000_children(store):
    setup_basics(store)
    before = counts(store)
    t0 = time.perf_counter()
    parent = store.jobs.submit(queue="q", definition="train", array_size=MAX_ARRAY_SIZE,
                          parameters={"lr": "0.5"})
    took = time.perf_counter() - t0
    print(f"\n[{store.engine.dialect.name}] array submit of {MAX_ARRAY_SIZE} children: "
          f"{took:.2f} s")
    assert counts(store)["jobs"] == before["jobs"] + MAX_ARRAY_SIZE + 1
    assert parent.is_array_parent and parent.array_size == MAX_ARRAY_SIZE
    assert store.jobs.get_job(parent.id) == parent

    children = store.jobs.list_jobs(parent=parent.id, limit=MAX_ARRAY_SIZE)
    assert [c.array_index for c in children] == list(range(MAX_ARRAY_SIZE))
    assert [c.id for c in children] == [f"{parent.id}:{i}" for i in range(MAX_ARRAY_SIZE)]
    c = children[1234]
    assert (c.array_parent_id, c.array_size, c.status) == (parent.id, MAX_ARRAY_SIZE,
                                                          S.SUBMITTED)
    assert c.command == parent.command and "0.5" in c.command
    assert store.jobs.get_job(c.id) == c
    page = store.jobs.list_jobs(parent=parent.id, limit=10, offset=9995)
    assert [j.array_index for j in page] == [9995, 9996, 9997, 9998, 9999]
    assert store.jobs.count_jobs_by_status()[S.SUBMITTED] == MAX_ARRAY_SIZE + 1
    assert [j.id for j in store.jobs.list_jobs(top_level=True)] == [parent.id]
    assert store.jobs.list_jobs(limit=1)[0].id == parent.id  # the parent sorts before its children


def test_list_jobs_filters_and_paging(store):
    setup_basics(store)
    store.environments.create_job_queue(JobQueueSpec("other", 1, ("od",)))
    ticks = iter(range(1000, 2000))
    clocked = Store(store.url, clock=lambda: float(next(ticks)))
    try:
        ids = [clocked.jobs.submit(queue="q" if i % 2 else "other", command=["x"]).id
               for i in range(10)]
    finally:
        clocked.close()
    for job_id in ids[:3]:
        store.jobs.transition(job_id, S.SUBMITTED, S.RUNNABLE)
    assert [j.id for j in store.jobs.list_jobs()] == ids
    assert [j.id for j in store.jobs.list_jobs(limit=3, offset=4)] == ids[4:7]
    assert [j.id for j in store.jobs.list_jobs(queue="q")] == ids[1::2]
    assert [j.id for j in store.jobs.list_jobs(status=S.RUNNABLE)] == ids[:3]
    assert [
        j.id for j in store.jobs.list_jobs(queue="other", status=[S.RUNNABLE, S.SUBMITTED])
    ] == (ids[0::2])
    assert store.jobs.list_jobs(status="FAILED") == []
    by_status = store.jobs.count_jobs_by_status()
    assert by_status[S.RUNNABLE] == 3 and by_status[S.SUBMITTED] == 7
    assert set(by_status) == set(JobStatus) and by_status[S.FAILED] == 0
    assert store.jobs.count_jobs_by_status("q")[S.RUNNABLE] == 1
    with pytest.raises(ValidationError, match="limit"):
        store.jobs.list_jobs(limit=0)


def test_delete_queue_once_its_jobs_finished(store):
    setup_basics(store)
    job = store.jobs.submit(queue="q", command=["x"])
    with pytest.raises(ValidationError, match="1 unfinished"):
        store.environments.delete_job_queue("q")
    store.jobs.update_job(job.id, status=S.SUCCEEDED)
    store.environments.delete_job_queue("q")
    assert store.jobs.get_job(job.id).queue == "q"  # finished jobs keep their queue's name


# ------------------------------------------------------------- attempts, usage, logs, events


def test_attempts_and_usage(store):
    setup_basics(store)
    job = store.jobs.submit(queue="q", definition="train")
    store.jobs.add_attempt(job.id, 1, 100.0)
    done = store.jobs.finish_attempt(job.id, 1, None, "preempted", 160.0)
    assert (done.started_at, done.stopped_at, done.exit_code, done.reason) == (
        100.0, 160.0, None, "preempted")
    with pytest.raises(ValidationError, match="already finished"):
        store.jobs.finish_attempt(job.id, 1, 0, "again", 170.0)
    store.jobs.add_attempt(job.id, 2, 200.0)
    store.jobs.finish_attempt(job.id, 2, 0, "Essential container exited", 260.0)
    assert [
        (a.attempt_no, a.exit_code, a.stopped_at) for a in store.jobs.list_attempts(job.id)
    ] == [(1, None, 160.0), (2, 0, 260.0)]

    u1 = store.workers.record_usage(job.id, 1, "spot", CapacityType.SPOT, 120.0, 0.3, wasted=True,
                            at=160.0)
    store.workers.record_usage(job.id, 2, "od", "ON_DEMAND", 240, 1.0)
    rows = store.workers.job_usage(job.id)
    assert rows[0] == u1
    assert [(r.attempt_no, r.compute_environment, r.capacity_type, r.worker_seconds,
             r.price_per_slot_hour, r.wasted) for r in rows] == [
        (1, "spot", CapacityType.SPOT, 120.0, 0.3, True),
        (2, "od", CapacityType.ON_DEMAND, 240.0, 1.0, False)]
    assert rows[0].id < rows[1].id
    with pytest.raises(ValidationError, match="capacity type"):
        store.workers.record_usage(job.id, 2, "od", "CHEAP", 1, 1)


def test_log_follow(store):
    setup_basics(store)
    job = store.jobs.submit(queue="q", command=["x"])
    assert store.logs.read_log(job.id) == ([], 0)
    assert store.logs.append_log(job.id, 1, "w0", ["a", "b"]) == 2
    assert store.logs.append_log(job.id, 1, "w1", ["c"]) == 3
    assert store.logs.append_log(job.id, 1, "w1", []) == 3
    lines, last = store.logs.read_log(job.id)
    assert [(x.seq, x.worker, x.line) for x in lines] == [(1, "w0", "a"), (2, "w0", "b"),
                                                          (3, "w1", "c")]
    assert last == 3
    assert store.logs.read_log(job.id, after_seq=last) == ([], 3)  # nothing new: keep the cursor
    store.logs.append_log(job.id, 2, "w0", [f"line {i}" for i in range(5)])
    page, cursor = store.logs.read_log(job.id, after_seq=last, limit=2)
    assert [x.seq for x in page] == [4, 5] and cursor == 5
    page, cursor = store.logs.read_log(job.id, after_seq=cursor)
    assert [x.line for x in page] == ["line 2", "line 3", "line 4"] and cursor == 8
    assert {x.attempt_no for x in page} == {2}
    other = store.jobs.submit(queue="q", command=["y"])
    assert store.logs.append_log(other.id, 1, None, ["own sequence"]) == 1


def test_concurrent_log_appends_get_distinct_sequences(store):
    setup_basics(store)
    job = store.jobs.submit(queue="q", command=["x"])

    def worker(name: str) -> None:
        for i in range(10):
            store.logs.append_log(job.id, 1, name, [f"{name}-{i}-a", f"{name}-{i}-b"])
    threads = [threading.Thread(target=worker, args=(f"w{k}",)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines, last = store.logs.read_log(job.id, limit=1000)
    assert [x.seq for x in lines] == list(range(1, 61)) and last == 60
    # a batch stays contiguous
    for x, y in zip(lines[::2], lines[1::2], strict=True):
        assert x.line.endswith("-a") and y.line == x.line[:-1] + "b"


def test_events(store):
    setup_basics(store)
    job = store.jobs.submit(queue="q", command=["x"])
    e1 = store.logs.add_event(None, "scheduler.started", {"version": 1}, at=1.0)
    e2 = store.logs.add_event(job.id, "job.transition", {"from": "SUBMITTED", "to": "RUNNABLE"})
    e3 = store.logs.add_event(job.id, "job.transition", {"from": "RUNNABLE", "to": "STARTING",
                                                    "nested": {"k": [1, 2]}})
    assert e1 < e2 < e3
    assert [e.id for e in store.logs.list_events()] == [e1, e2, e3]
    first = store.logs.list_events()[0]
    assert first.payload == {"version": 1} and first.at == 1.0
    mine = store.logs.list_events(job.id)
    assert [e.id for e in mine] == [e2, e3] and mine[1].payload["nested"] == {"k": [1, 2]}
    assert [e.id for e in store.logs.list_events(job.id, after_id=e2)] == [e3]
    assert [e.id for e in store.logs.list_events(after_id=e1, limit=1)] == [e2]


# ------------------------------------------------------------------------------ schema upgrade


def test_opening_an_older_database_adds_what_it_lacks(store):
    """A state dir from before a table, a nullable column and an index existed still opens."""
    setup_basics(store)
    job = store.jobs.submit(queue="q", command=["true"])
    assert store.jobs.transition(job.id, S.SUBMITTED, S.FAILED, "done", stopped_at=12.5)
    with store.engine.begin() as conn:  # make it look like an older release's database
        conn.execute(sa.text("DROP TABLE capacity_traces"))
        conn.execute(sa.text("DROP INDEX ix_events_job"))
        conn.execute(sa.text("ALTER TABLE jobs DROP COLUMN stopped_at"))
    assert sorted(store.create_all()) == ["added column jobs.stopped_at",
                                          "created index ix_events_job",
                                          "created table capacity_traces"]
    assert store.create_all() == []  # idempotent
    old = store.jobs.get_job(job.id)
    assert old.status_reason == "done" and old.stopped_at is None  # kept; the new column empty
    store.environments.set_capacity_trace("od", "offset_s,slots\n0,1\n", started_at=1.0)
    assert store.environments.capacity_traces() == {"od": ("offset_s,slots\n0,1\n", 1.0, False)}


def test_upgrade_refuses_a_not_null_column_and_changes_nothing(store):
    setup_basics(store)
    job = store.jobs.submit(queue="q", command=["true"])
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE capacity_traces"))
        conn.execute(sa.text("ALTER TABLE jobs DROP COLUMN log_seq"))
    with pytest.raises(RuntimeError, match="jobs: its new column log_seq is NOT NULL"):
        store.create_all()
    assert "capacity_traces" not in sa.inspect(store.engine).get_table_names()
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT id FROM jobs")).scalars().all() == [job.id]


# ------------------------------------------------------------------------------ the controller's


def test_a_batch_commits_once_and_rolls_back_as_a_whole(store):
    setup_basics(store)
    a, b = runnable_jobs(store, 2)
    with store.batch():
        assert store.jobs.transition(a, S.RUNNABLE, S.STARTING)
        with pytest.raises(ValidationError):  # one call fails: only that call is undone
            store.jobs.add_attempt("no-such-job", 1, 1.0)
        assert store.jobs.transition(b, S.RUNNABLE, S.STARTING)
    assert {store.jobs.get_job(i).status for i in (a, b)} == {S.STARTING}
    before = counts(store)
    with pytest.raises(RuntimeError), store.batch():
        assert store.jobs.transition(a, S.STARTING, S.RUNNING)
        store.logs.append_log(a, 1, "w", ["line"])
        raise RuntimeError("the step failed")
    assert store.jobs.get_job(a).status is S.STARTING and counts(store) == before


def test_scan_jobs_pages_through_unfinished_jobs_after_a_watermark(store):
    setup_basics(store)
    first = store.jobs.submit(queue="q", command=["true"])
    parent = store.jobs.submit(queue="q", command=["true"], array_size=3,
                          depends_on=[Dependency(first.id)])
    done = store.jobs.submit(queue="q", command=["true"])
    assert store.jobs.transition(done.id, S.SUBMITTED, S.FAILED)
    page = store.scheduling.scan_jobs(None, limit=3)
    assert [e.id for e in page] == [first.id, parent.id, f"{parent.id}:0"]
    assert page[1].is_array_parent and page[1].depends_on == (Dependency(first.id),)
    rest = store.scheduling.scan_jobs((page[-1].created_at, page[-1].id))
    assert [e.id for e in rest] == [f"{parent.id}:1", f"{parent.id}:2"]  # the FAILED one: no
    assert store.scheduling.scan_jobs((rest[-1].created_at, rest[-1].id)) == []
    late = store.jobs.submit(queue="q", command=["true"])
    assert [e.id for e in store.scheduling.scan_jobs((rest[-1].created_at,
                                                      rest[-1].id))] == [late.id]
    assert store.scheduling.child_status_counts([parent.id])[parent.id] == {S.SUBMITTED: 3}


def test_bulk_transitions_and_claims_are_compare_and_set(store):
    setup_basics(store)
    parent = store.jobs.submit(queue="q", command=["true"], array_size=4)
    kids = [f"{parent.id}:{i}" for i in range(4)]
    assert store.jobs.transition(kids[0], S.SUBMITTED, S.PENDING)
    moved = store.scheduling.transition_children(parent.id, S.SUBMITTED, S.RUNNABLE,
                                                 "no dependencies")
    assert sorted(moved) == kids[1:]
    assert store.scheduling.transition_many(
        kids, S.PENDING, S.RUNNABLE, "dependencies succeeded"
    ) == [kids[0]]
    assert {k: v[0] for k, v in store.scheduling.job_statuses(kids + ["nope"]).items()} == \
        {k: S.RUNNABLE for k in kids}
    assert store.scheduling.job_statuses([parent.id])[parent.id][1] is True  # an array parent
    worker = WorkerRecord(f"{kids[0]}-a1-w0", kids[0], 1, "od", "ON_DEMAND", 1.0, None,
                          "RUNNING", 5.0)
    other = WorkerRecord(f"{kids[1]}-a1-w0", kids[1], 1, "od", "ON_DEMAND", 1.0, None,
                         "RUNNING", 5.0)
    assert store.jobs.transition(kids[1], S.RUNNABLE, S.FAILED)  # moved by someone else first
    assert store.scheduling.claim_starts([(kids[0], 1, [worker]), (kids[1], 1, [other])], 5.0) == \
        [kids[0]]
    assert store.jobs.get_job(kids[0]).status is S.STARTING
    assert store.jobs.list_attempts(kids[1]) == []
    assert [w.id for w in store.workers.list_workers(kids[0])] == [worker.id]
    # the table keeps the state as text ("RUNNING"), read back as the enum
    assert store.workers.list_workers(kids[0])[0].state is WorkerState.RUNNING
    with pytest.raises(ValidationError, match="unknown worker state 'GONE'"):
        store.workers.update_worker(worker.id, state="GONE")
    assert store.scheduling.last_attempt_numbers(kids) == {kids[0]: 1}
    store.scheduling.record_launch({worker.id: {"ref": "1:2"}}, [], {kids[0]: 1})
    assert store.jobs.get_job(kids[0]).status is S.RUNNING
    assert store.workers.list_workers(kids[0])[0].handle == {"ref": "1:2"}
    store.scheduling.settle([WorkerExitRow(worker.id, 0, 9.0, "exited with code 0")],
                 [UsageRow(kids[0], 1, "od", "ON_DEMAND", 4.0, 1.0, False, 9.0)],
                 [AttemptEnd(kids[0], 1, 0, "exit code 0", 9.0, "SUCCEEDED", 1, 0, 9.0)])
    job = store.jobs.get_job(kids[0])
    assert (job.status, job.attempts, job.exit_code, job.stopped_at) == (S.SUCCEEDED, 1, 0, 9.0)
    assert store.jobs.list_attempts(kids[0])[0].stopped_at == 9.0
    assert store.workers.list_workers(kids[0], active=False)[0].state is WorkerState.EXITED
    assert [u.worker_seconds for u in store.workers.job_usage(kids[0])] == [4.0]
    assert [e.payload["status"] for e in store.logs.list_events(kids[0])] == ["SUCCEEDED"]


def test_a_job_whose_kernel_level_no_host_runs_is_refused_at_submit(store):
    """Told the levels its hosts run (here: a CPU without AVX2), submit refuses a job pinned to
    a level above them, in one line naming the level, what the hosts run and what to choose,
    and stores nothing; a job at a level they run, or one that chose its own kernel variables
    and is not elastic, is taken."""
    setup_basics(store)
    old = (KernelLevel.DEFAULT,)
    with pytest.raises(ValidationError) as err:
        store.jobs.submit(queue="q", command=["true"], kernel_levels=old,
                     environment={"DYNTRAIN_CPU_KERNELS": "avx2"})
    assert str(err.value) == (
        "job refused: its cpu kernels avx2 run on none of this service's hosts (they run "
        "default): submit it with DYNTRAIN_CPU_KERNELS=default, a level every host runs")
    with pytest.raises(ValidationError, match="cpu kernels avx512 run on none"):
        store.jobs.submit(queue="q", definition="train", kernel_levels=old,  # elastic: pinned
                     environment={"DYNTRAIN_CPU_KERNELS": "avx512",
                                  "ATEN_CPU_CAPABILITY": "default"})
    if default_kernels() is not KernelLevel.DEFAULT:  # x86-64: the default level is avx2
        with pytest.raises(ValidationError, match="cpu kernels avx2 run on none"):
            store.jobs.submit(queue="q", command=["true"], kernel_levels=old)
    assert store.jobs.list_jobs() == []
    taken = [store.jobs.submit(queue="q", command=["true"], kernel_levels=old,
                          environment={"DYNTRAIN_CPU_KERNELS": "default"}),
             store.jobs.submit(queue="q", command=["true"], kernel_levels=old,  # its own choice
                          environment={"ATEN_CPU_CAPABILITY": "default"}),
             store.jobs.submit(queue="q", command=["true"],  # no levels given: not checked
                          environment={"DYNTRAIN_CPU_KERNELS": "avx512"})]
    assert len(store.jobs.list_jobs()) == len(taken)


def test_the_store_is_composed_of_its_parts(store):
    """Each aggregate's calls are on its part (``store.jobs.submit``), one part per aggregate,
    all over the one database; the store inherits none of them."""
    from dyntrain.service.store.base import Database, Part

    assert Store.__mro__ == (Store, Database, object)
    parts = {name: part for name, part in vars(store).items() if isinstance(part, Part)}
    assert sorted(parts) == ["definitions", "environments", "jobs", "leases", "logs",
                             "policies", "scheduling", "summaries", "tags", "workers"]
    assert all(part.db is store for part in parts.values())
