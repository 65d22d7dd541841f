"""The service's records: what the store returns and the operations hand to the front ends
(frozen dataclasses, never rows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dyntrain.service.core.fairshare import FairsharePolicy
from dyntrain.service.core.model import (
    CapacityType,
    CEStatus,
    ComputeEnvironmentSpec,
    Dependency,
    ElasticSettings,
    JobDefinitionSpec,
    JobQueueSpec,
    JobStatus,
    Launcher,
    Resources,
    RetryStrategy,
    WorkerState,
    parse_launcher,
)

ACTIVE, INACTIVE = "ACTIVE", "INACTIVE"  # job definition revisions


class _NamedBySpec:
    """Records whose name is their spec's."""

    spec: ComputeEnvironmentSpec | JobQueueSpec | JobDefinitionSpec

    @property
    def name(self) -> str:
        return self.spec.name


def _dict() -> Any:
    return field(default_factory=dict)


@dataclass(frozen=True)
class ComputeEnvironment(_NamedBySpec):
    spec: ComputeEnvironmentSpec
    status: CEStatus
    status_reason: str | None
    created_at: float
    updated_at: float
    tags: dict[str, str] = _dict()
    aws: dict[str, Any] = _dict()  # AWS fields kept to describe it back (dyntrain.service.aws)


@dataclass(frozen=True)
class JobQueue(_NamedBySpec):
    spec: JobQueueSpec
    created_at: float
    updated_at: float
    tags: dict[str, str] = _dict()
    aws: dict[str, Any] = _dict()


@dataclass(frozen=True)
class SchedulingPolicy:
    """A named fair-share scheduling policy (AWS Batch's), which job queues refer to."""

    name: str
    fairshare: FairsharePolicy
    created_at: float
    updated_at: float
    tags: dict[str, str] = _dict()


@dataclass(frozen=True)
class JobDefinition(_NamedBySpec):
    spec: JobDefinitionSpec
    revision: int
    status: str  # ACTIVE or INACTIVE (deregistered)
    created_at: float
    tags: dict[str, str] = _dict()
    aws: dict[str, Any] = _dict()

    @property
    def ref(self) -> str:
        return f"{self.spec.name}:{self.revision}"


class _Workers:
    """Records that know how many workers their job runs with."""

    __slots__ = ()
    min_workers: int | None
    max_workers: int | None
    num_nodes: int | None

    @property
    def workers_range(self) -> tuple[int, int]:
        """Its elastic range, its nodes all at once (a multi-node job), or one."""
        if self.min_workers is not None and self.max_workers is not None:
            return self.min_workers, self.max_workers
        return (self.num_nodes, self.num_nodes) if self.num_nodes else (1, 1)


@dataclass(frozen=True)
class Job(_Workers):
    id: str
    name: str
    queue: str
    status: JobStatus
    status_reason: str | None
    definition_name: str | None  # None for an inline command
    definition_revision: int | None
    command: tuple[str, ...]  # resolved: no Ref:: left
    environment: dict[str, str]
    parameters: dict[str, str]  # the merged values the command was resolved with
    resources: Resources  # per worker
    retry_strategy: RetryStrategy
    timeout_seconds: float | None
    min_workers: int | None  # both None unless the job is elastic
    max_workers: int | None
    array_parent_id: str | None
    array_index: int | None
    array_size: int | None  # on the parent and on each child
    depends_on: tuple[Dependency, ...]
    attempts: int
    preemptions: int
    exit_code: int | None
    current_workers: int
    created_at: float
    updated_at: float
    started_at: float | None
    stopped_at: float | None
    workdir: str | None = None  # where its workers start; None: the executor's directory
    exported_environment: dict[str, str] | None = None  # the submitter's (on an array's parent)
    progress: dict | None = None  # an elastic job's latest step, world size, loss, samples/s
    result: dict | None = None  # what its training reported (trainer.report()), last attempt
    num_nodes: int | None = None  # a multi-node job (AWS Batch's nodeProperties.numNodes)
    tags: dict[str, str] = _dict()
    aws: dict[str, Any] = _dict()
    launcher: str | None = None  # an elastic job's Launcher (None: dyntrain's)
    share: str | None = None  # its share identifier, in a fair-share queue
    scheduling_priority: int = 0  # orders the jobs of one share, higher first

    @property
    def elastic(self) -> ElasticSettings | None:
        return elastic_settings(self.min_workers, self.max_workers, self.launcher)

    @property
    def torchrun(self) -> bool:
        """Its workers run a plain script as torchrun would (restarted at each resize)."""
        return self.elastic is not None and self.elastic.launcher is Launcher.TORCHRUN

    @property
    def is_array_parent(self) -> bool:
        return self.array_size is not None and self.array_parent_id is None


@dataclass(frozen=True, slots=True)
class JobEntry(_Workers):
    """What the controller keeps in memory about an unfinished job: no command, no JSON."""

    id: str
    queue: str
    status: JobStatus
    status_reason: str | None
    created_at: float
    resources: Resources
    min_workers: int | None
    max_workers: int | None
    array_parent_id: str | None
    array_index: int | None
    array_size: int | None
    depends_on: tuple[Dependency, ...] = ()
    num_nodes: int | None = None
    share: str | None = None
    scheduling_priority: int = 0

    @property
    def is_array_parent(self) -> bool:
        return self.array_size is not None and self.array_parent_id is None


@dataclass(frozen=True)
class WorkerRecord:
    """One worker process of a job attempt, where it runs, and how to find it again."""

    id: str
    job_id: str
    attempt_no: int
    compute_environment: str
    capacity_type: str
    price_per_slot_hour: float
    handle: dict | None
    state: WorkerState
    started_at: float
    leave_reason: str | None = None
    exit_code: int | None = None
    leave_at: float | None = None
    stopped_at: float | None = None


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a job as the store keeps it: when it ran and how it ended (the running
    attempt the controller keeps in memory is ``dyntrain.service.engine.attempts.Attempt``)."""

    job_id: str
    attempt_no: int
    started_at: float
    stopped_at: float | None
    exit_code: int | None
    reason: str | None


@dataclass(frozen=True)
class Usage:
    id: int
    job_id: str
    attempt_no: int
    compute_environment: str
    capacity_type: CapacityType
    worker_seconds: float
    price_per_slot_hour: float
    wasted: bool
    recorded_at: float


@dataclass(frozen=True)
class LogLine:
    seq: int
    attempt_no: int
    worker: str | None
    line: str
    at: float


@dataclass(frozen=True)
class LogStream:
    """The log of one attempt of one job: what a CloudWatch log stream describes."""

    job_id: str
    attempt_no: int
    job_name: str
    definition_name: str | None
    created_at: float  # the attempt's start
    first_at: float | None  # first and last line, None while it has none
    last_at: float | None
    stored_bytes: int


@dataclass(frozen=True)
class Event:
    id: int
    job_id: str | None
    kind: str
    payload: dict[str, Any]
    at: float


def elastic_settings(min_w: int | None, max_w: int | None,
             launcher: str | None = None) -> ElasticSettings | None:
    return (None if min_w is None or max_w is None
            else ElasticSettings(min_w, max_w, parse_launcher(launcher)))
