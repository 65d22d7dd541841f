"""What the store keeps for the AWS front end, on SQLite and PostgreSQL alike: idempotent submits,
tags and AWS fields on every resource, list filters, multi-node jobs, logs by attempt."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from dyntrain.service.core.model import (
    ComputeEnvironmentSpec,
    JobDefinitionSpec,
    JobQueueSpec,
    RetryAction,
    RetryRule,
    RetryStrategy,
    ValidationError,
)
from dyntrain.service.store import Store


def setup(store: Store) -> None:
    store.environments.create_compute_environment(ComputeEnvironmentSpec("ce", max_slots=4),
                                     tags={"team": "ml"}, aws={"type": "MANAGED"})
    store.environments.create_job_queue(JobQueueSpec("q", 1, ("ce",)), tags={"q": "1"},
                           aws={"orders": [3]})
    store.definitions.register_job_definition(JobDefinitionSpec("d", ()), tags={"d": "1"},
                                  aws={"containerProperties": {"image": "busybox"}})


def test_a_client_token_makes_a_submit_idempotent(store):
    setup(store)
    first = store.jobs.submit(queue="q", definition="d", command=["true"], client_token="tok-1",
                         tags={"a": "1"}, aws={"image": "x"}, num_nodes=2)
    again = store.jobs.submit(queue="q", command=["something", "else"], client_token="tok-1")
    assert again == first and store.jobs.get_job(first.id) == first
    assert (first.tags, first.aws, first.num_nodes, first.workers_range) == (
        {"a": "1"}, {"image": "x"}, 2, (2, 2))
    with ThreadPoolExecutor(4) as pool:  # racing retries of one call still make one job
        made = set(pool.map(lambda _: store.jobs.submit(queue="q", command=["true"],
                                                   client_token="tok-2").id, range(8)))
    assert len(made) == 1
    parent = store.jobs.submit(queue="q", command=["true"], array_size=2, client_token="tok-3")
    assert store.jobs.submit(queue="q", command=["true"], array_size=2,
                             client_token="tok-3") == parent
    assert len(store.jobs.list_jobs(limit=100)) == 1 + 1 + 3  # children carry no token


def test_a_definition_without_a_command_takes_the_jobs(store):
    setup(store)
    with pytest.raises(ValidationError, match="job definition d:1 has no command"):
        store.jobs.submit(queue="q", definition="d")
    job = store.jobs.submit(
        queue="q",
        definition="d",
        command=["echo"],
        retry_strategy=RetryStrategy(3, (RetryRule(RetryAction.EXIT, on_exit_code="2"),)),
        retry_attempts=2,
    )
    assert job.retry_strategy == RetryStrategy(2, (RetryRule(RetryAction.EXIT, "2"),))
    d = store.definitions.get_job_definition("d")
    assert (d.tags, d.aws, d.spec.command) == ({"d": "1"}, {
        "containerProperties": {"image": "busybox"}}, ())


def test_tags_and_aws_fields_on_every_resource(store):
    setup(store)
    job = store.jobs.submit(queue="q", command=["true"])
    for kind, key in (("compute-environment", "ce"), ("job-queue", "q"),
                      ("job-definition", "d:1"), ("job", job.id)):
        store.tags.tag_resource(kind, key, {"x": "1", "y": "2"})
        assert store.tags.untag_resource(kind, key, ["y", "absent"])["x"] == "1"
        assert "y" not in store.tags.resource_tags(kind, key)
    assert store.environments.get_compute_environment("ce").tags == {"team": "ml", "x": "1"}
    assert store.environments.get_job_queue("q").tags == {"q": "1", "x": "1"}
    assert store.jobs.get_job(job.id).tags == {"x": "1"}
    ce = store.environments.update_compute_environment("ce", desired_slots=2,
                                                       aws={"type": "UNMANAGED"})
    assert (ce.aws,
            store.environments.get_compute_environment("ce").aws) == ({"type": "UNMANAGED"},) * 2
    assert store.environments.update_job_queue("q", priority=3).aws == {"orders": [3]}  # kept
    with pytest.raises(ValidationError, match="unknown job queue 'nope'"):
        store.tags.tag_resource("job-queue", "nope", {"a": "b"})
    with pytest.raises(ValidationError, match="unknown resource kind"):
        store.tags.resource_tags("compute-cluster", "p")
    with pytest.raises(ValidationError, match="unknown scheduling policy 'p'"):
        store.tags.resource_tags("scheduling-policy", "p")


def test_list_jobs_by_name_definition_and_creation_time(store):
    setup(store)
    ticks = iter(range(1000, 2000))
    clocked = Store(store.url, clock=lambda: float(next(ticks)))
    try:
        ids = [clocked.jobs.submit(queue="q", name=n, definition=d, command=["x"]).id
               for n, d in (("train-1", "d"), ("train-2", None), ("eval", "d"))]
    finally:
        clocked.close()
    assert [j.id for j in store.jobs.list_jobs(name="TRAIN-*")] == ids[:2]  # any case
    assert [j.id for j in store.jobs.list_jobs(name="train-*", newest_first=True)] == ids[1::-1]
    assert [j.id for j in store.jobs.list_jobs(name="train-%")] == []  # no SQL wildcards
    assert [j.id for j in store.jobs.list_jobs(definition="d:1")] == [ids[0], ids[2]]
    assert [j.id for j in store.jobs.list_jobs(name="eval", definition="d*")] == [ids[2]]
    assert [j.id for j in store.jobs.list_jobs(created_after=1000, created_before=1002)] == [ids[1]]


def test_logs_by_attempt(store):
    setup(store)
    a = store.jobs.submit(queue="q", name="a", definition="d", command=["x"])
    b = store.jobs.submit(queue="q", name="b", command=["x"])
    store.jobs.add_attempt(a.id, 1, 5.0)
    store.logs.append_log(a.id, 1, "w0", ["one", "two"], at=10.0)
    store.jobs.add_attempt(a.id, 2, 20.0)
    store.logs.append_log(a.id, 2, "w0", ["three", "four two"], at=21.0)
    store.jobs.add_attempt(b.id, 1, 6.0)
    store.logs.append_log(b.id, 1, None, ["bee"], at=15.0)
    streams = store.logs.log_streams()
    assert [(s.job_id, s.attempt_no, s.first_at, s.stored_bytes) for s in streams] == [
        (a.id, 1, 10.0, 6), (a.id, 2, 21.0, 13), (b.id, 1, 15.0, 3)]
    assert [s.job_name for s in store.logs.log_streams(definition_name="d")] == ["a", "a"]
    assert [s.job_id for s in store.logs.log_streams(job_id_prefix=b.id[:6])] == [b.id]
    assert [x.line for x in store.logs.attempt_log(a.id, 2)] == ["three", "four two"]
    assert [x.line for x in store.logs.attempt_log(a.id, 2, limit=1, newest=True)] == ["four two"]
    assert [x.line for x in store.logs.attempt_log(a.id, 2, before_seq=4)] == ["three"]
    assert [x.line for x in store.logs.attempt_log(a.id, 1, after_seq=1)] == ["two"]
    assert store.logs.attempt_log(a.id, 1, start_at=10.5) == []
    found = store.logs.search_logs(terms=["two"])
    assert [(j, x.line) for j, x in found] == [(a.id, "two"), (a.id, "four two")]
    assert [x.line for _, x in store.logs.search_logs([(b.id, 1), (a.id, 2)], offset=1)] == [
        "three", "four two"]
    assert [x.line for _, x in store.logs.search_logs(start_at=12, end_at=21)] == ["bee"]
    assert store.logs.search_logs([]) == []


def test_an_older_database_gets_the_aws_columns(store):
    setup(store)
    job = store.jobs.submit(queue="q", command=["true"])
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP INDEX ix_jobs_client_token"))
        for column in ("tags", "aws", "num_nodes", "client_token"):
            conn.execute(sa.text(f"ALTER TABLE jobs DROP COLUMN {column}"))
    assert sorted(store.create_all()) == [
        "added column jobs.aws", "added column jobs.client_token", "added column jobs.num_nodes",
        "added column jobs.tags", "created index ix_jobs_client_token"]
    old = store.jobs.get_job(job.id)
    assert (old.tags, old.aws, old.num_nodes) == ({}, {}, None)
