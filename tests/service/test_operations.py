"""The service's operations, called in process as every front end calls them: the records they
return, and how they refuse (a bad request, an unknown resource, a state that refuses)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from dyntrain.service.assembly import LocalExecutorSetup, build_service
from dyntrain.service.core.model import (
    ComputeEnvironmentSpec,
    JobDefinitionSpec,
    JobQueueSpec,
    JobStatus,
    Resources,
    ValidationError,
)
from dyntrain.service.core.records import ComputeEnvironment, Job, JobDefinition, JobQueue
from dyntrain.service.engine.service import ServiceConfig
from dyntrain.service.operations import Operations
from dyntrain.service.operations.errors import (
    EnvironmentInUse,
    JobFinished,
    JobNotCancellable,
    QueueExists,
    Unknown,
)
from dyntrain.testing.wait import wait_until

SLOT = Resources(0.25, 0, 256)
TRACE = "offset_s,slots\n0,1\n"


@pytest.fixture(scope="module")
def ops(tmp_path_factory) -> Iterator[Operations]:
    service = build_service(ServiceConfig(state_dir=tmp_path_factory.mktemp("ops"), port=0,
                                          grace_seconds=5), LocalExecutorSetup(warm_workers=0))
    service.start()
    try:
        yield Operations(service)
    finally:
        service.stop()


def test_commands_and_queries_return_records(ops):
    ce = ops.environments.create(ComputeEnvironmentSpec("ce-a", slot=SLOT, desired_slots=1,
                                                        max_slots=2))
    assert isinstance(ce, ComputeEnvironment) and ce.spec.desired_slots == 1
    assert ops.environments.update("ce-a", desired_slots=2).spec.desired_slots == 2
    assert ops.environments.set_trace("ce-a", TRACE).name == "ce-a"
    capacity = ops.environments.capacity()
    assert capacity.traces["ce-a"][0] == TRACE and capacity.in_use["ce-a"] == 0
    queue = ops.queues.create(JobQueueSpec("q-a", 1, ("ce-a",)), aws={"orders": [1]})
    assert isinstance(queue, JobQueue)
    changed = ops.queues.update("q-a", priority=4, aws={"kept": True})
    assert changed.spec.priority == 4 and changed.aws == {"orders": [1], "kept": True}
    d = ops.definitions.register(JobDefinitionSpec("d-a", ("true",)))
    assert isinstance(d, JobDefinition) and d.ref == "d-a:1"
    assert ops.definitions.deregister("d-a").status == "INACTIVE"
    ops.tags.add("job-queue", "q-a", {"team": "ml"})
    assert ops.tags.of("job-queue", "q-a") == {"team": "ml"}
    job = ops.jobs.submit(queue="q-a", command=[sys.executable, "-c", "pass"], resources=SLOT)
    assert isinstance(job, Job) and job.status is JobStatus.SUBMITTED
    done = wait_until(lambda: ops.jobs.get(job.id), "the job to end", 60,
                      until=lambda j: j.status.is_terminal())
    assert done.status is JobStatus.SUCCEEDED, done.status_reason
    assert ops.logs.read(job.id).job.status is JobStatus.SUCCEEDED
    assert [a.attempt_no for a in ops.jobs.attempts(job.id)] == [1]


def test_an_unknown_resource_is_told_apart_from_a_bad_request(ops):
    with pytest.raises(Unknown, match="^unknown compute environment 'nope'"):
        ops.environments.delete("nope")
    with pytest.raises(Unknown, match="^unknown job 'nope'"):
        ops.jobs.cancel("nope")
    ops.environments.create(ComputeEnvironmentSpec("ce-b", slot=SLOT))
    ops.queues.create(JobQueueSpec("q-b", 1, ("ce-b",)))
    # an unknown environment named in the change is a bad request about the queue, not Unknown
    with pytest.raises(ValidationError, match="nope") as refused:
        ops.queues.update("q-b", compute_environments=["nope"])
    assert not isinstance(refused.value, Unknown)
    with pytest.raises(QueueExists) as exists:
        ops.queues.create(JobQueueSpec("q-b", 1, ("ce-b",)))
    assert exists.value.name == "q-b" and str(exists.value) == "job queue 'q-b' already exists"


def test_a_running_job_and_its_environment_refuse_what_their_state_forbids(ops):
    ops.environments.create(ComputeEnvironmentSpec("ce-run", slot=SLOT, desired_slots=1))
    ops.queues.create(JobQueueSpec("q-run", 1, ("ce-run",)))
    job = ops.jobs.submit(queue="q-run", command=["sleep", "60"], resources=SLOT)
    wait_until(lambda: ops.jobs.get(job.id), "the job to run", 60,
               until=lambda j: j.status is JobStatus.RUNNING)
    with pytest.raises(JobNotCancellable) as running:
        ops.jobs.cancel(job.id)
    assert running.value.status is JobStatus.RUNNING
    assert str(running.value) == f"job {job.id} is RUNNING; use terminate"
    with pytest.raises(EnvironmentInUse) as busy:
        ops.environments.delete("ce-run")
    assert (busy.value.name, busy.value.workers) == ("ce-run", 1)
    ops.jobs.terminate(job.id, "stopped here")
    done = wait_until(lambda: ops.jobs.get(job.id), "the job to end", 60,
                      until=lambda j: j.status.is_terminal())
    assert (done.status, done.status_reason) == (JobStatus.FAILED, "stopped here")
    with pytest.raises(JobFinished, match=f"^job {job.id} already finished: FAILED$"):
        ops.jobs.terminate(job.id)
    with pytest.raises(JobFinished):
        ops.jobs.cancel(job.id)
    wait_until(lambda: ops.environments.capacity().in_use["ce-run"], "the slot to be free", 30,
               until=lambda used: used == 0)
    ops.queues.delete("q-run")
    ops.environments.delete("ce-run")
    assert "ce-run" not in {ce.name for ce in ops.environments.list()}
