"""Persistence of the job service: SQLAlchemy Core over SQLite (embedded) or PostgreSQL.

``Store(url)`` takes ``sqlite:///path.db`` (WAL, busy timeout and foreign keys are switched on for
every connection; write transactions start with ``BEGIN IMMEDIATE`` so writers queue on the busy
timeout instead of failing mid-transaction) or ``postgresql+psycopg://user@host:port/db``.

Every public method runs in one transaction of its own: it either commits everything or, on any
error, nothing. Bad requests raise ``ValidationError`` with a one-line message. Methods return
frozen dataclasses (never rows or ORM objects), so callers hold no session.

Times are float seconds since the epoch. Children of an array job have ids ``<parent>:<index>``
(as in AWS Batch) and carry the parent's resolved command, environment and settings; the parent's
dependencies are stored on the parent only (the controller applies them to the children, child i
following child i of an ``N_TO_N`` dependency and child i-1 for ``SEQUENTIAL``).
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from dyntrain.service.model import (
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
    check_array_size,
    check_name,
    substitute,
)

ACTIVE, INACTIVE = "ACTIVE", "INACTIVE"  # job definition revisions
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_UNSET: Any = object()

# ---------------------------------------------------------------------------------------- schema

metadata = sa.MetaData()
_Id = sa.String(80)
_Name = sa.String(128)
_Serial = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: an alias of rowid


def _times(*names: str, nullable: bool = False) -> list[sa.Column]:
    return [sa.Column(n, sa.Double, nullable=nullable) for n in names]


compute_environments = sa.Table(
    "compute_environments", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("capacity_type", sa.String(16), nullable=False),
    sa.Column("price_per_slot_hour", sa.Double, nullable=False),
    sa.Column("slot_cpus", sa.Double, nullable=False),
    sa.Column("slot_gpus", sa.Integer, nullable=False),
    sa.Column("slot_memory_mib", sa.Integer, nullable=False),
    sa.Column("min_slots", sa.Integer, nullable=False),
    sa.Column("desired_slots", sa.Integer, nullable=False),
    sa.Column("max_slots", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_reason", sa.Text),
    *_times("created_at", "updated_at"),
)

job_queues = sa.Table(
    "job_queues", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    *_times("created_at", "updated_at"),
)

queue_environments = sa.Table(
    "queue_environments", metadata,
    sa.Column("queue", _Name, sa.ForeignKey("job_queues.name", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("compute_environment", _Name, sa.ForeignKey("compute_environments.name"),
              nullable=False, index=True),
    sa.UniqueConstraint("queue", "compute_environment"),
)

job_definitions = sa.Table(
    "job_definitions", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("revision", sa.Integer, primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("command", sa.JSON, nullable=False),
    sa.Column("environment", sa.JSON, nullable=False),
    sa.Column("parameters", sa.JSON, nullable=False),
    sa.Column("cpus", sa.Double, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("memory_mib", sa.Integer, nullable=False),
    sa.Column("retry_strategy", sa.JSON, nullable=False),
    sa.Column("timeout_seconds", sa.Double),
    sa.Column("min_workers", sa.Integer),
    sa.Column("max_workers", sa.Integer),
    *_times("created_at"),
)

jobs = sa.Table(
    "jobs", metadata,
    sa.Column("id", _Id, primary_key=True),
    sa.Column("name", _Name, nullable=False),
    sa.Column("queue", _Name, nullable=False),  # no FK: finished jobs outlive their queue
    sa.Column("definition_name", _Name),
    sa.Column("definition_revision", sa.Integer),
    sa.Column("command", sa.JSON, nullable=False),
    sa.Column("environment", sa.JSON, nullable=False),
    sa.Column("parameters", sa.JSON, nullable=False),
    sa.Column("cpus", sa.Double, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("memory_mib", sa.Integer, nullable=False),
    sa.Column("retry_strategy", sa.JSON, nullable=False),
    sa.Column("timeout_seconds", sa.Double),
    sa.Column("min_workers", sa.Integer),
    sa.Column("max_workers", sa.Integer),
    sa.Column("array_parent_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE")),
    sa.Column("array_index", sa.Integer),
    sa.Column("array_size", sa.Integer),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_reason", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("preemptions", sa.Integer, nullable=False),
    sa.Column("exit_code", sa.Integer),
    sa.Column("current_workers", sa.Integer, nullable=False),
    sa.Column("log_seq", sa.Integer, nullable=False),  # last log line's sequence number
    *_times("created_at", "updated_at"),
    *_times("started_at", "stopped_at", nullable=True),
    sa.Index("ix_jobs_created", "created_at", "id"),
    sa.Index("ix_jobs_queue_status", "queue", "status", "created_at"),
    sa.Index("ix_jobs_status", "status"),
    sa.Index("ix_jobs_parent", "array_parent_id", "array_index"),
)

job_dependencies = sa.Table(
    "job_dependencies", metadata,
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("depends_on", _Id, sa.ForeignKey("jobs.id"), primary_key=True, index=True),
    sa.Column("type", sa.String(16), nullable=False),
)

attempts = sa.Table(
    "attempts", metadata,
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("attempt_no", sa.Integer, primary_key=True),
    sa.Column("exit_code", sa.Integer),
    sa.Column("reason", sa.Text),
    *_times("started_at"),
    *_times("stopped_at", nullable=True),
)

usage = sa.Table(
    "usage", metadata,
    sa.Column("id", _Serial, primary_key=True, autoincrement=True),
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False,
              index=True),
    sa.Column("attempt_no", sa.Integer, nullable=False),
    sa.Column("compute_environment", _Name, nullable=False),
    sa.Column("capacity_type", sa.String(16), nullable=False),
    sa.Column("worker_seconds", sa.Double, nullable=False),
    sa.Column("price_per_slot_hour", sa.Double, nullable=False),
    sa.Column("wasted", sa.Boolean, nullable=False),
    *_times("recorded_at"),
)

job_logs = sa.Table(
    "job_logs", metadata,
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("attempt_no", sa.Integer, nullable=False),
    sa.Column("worker", sa.String(128)),
    sa.Column("line", sa.Text, nullable=False),
    *_times("at"),
)

events = sa.Table(
    "events", metadata,
    sa.Column("id", _Serial, primary_key=True, autoincrement=True),
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE")),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    *_times("at"),
    sa.Index("ix_events_job", "job_id", "id"),
)

workers = sa.Table(
    "workers", metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False,
              index=True),
    sa.Column("attempt_no", sa.Integer, nullable=False),
    sa.Column("compute_environment", _Name, nullable=False),
    sa.Column("capacity_type", sa.String(16), nullable=False),
    sa.Column("price_per_slot_hour", sa.Double, nullable=False),
    sa.Column("handle", sa.JSON),  # the executor's handle, to adopt the worker after a restart
    sa.Column("state", sa.String(16), nullable=False, index=True),  # RUNNING, LEAVING, EXITED
    sa.Column("leave_reason", sa.Text),
    sa.Column("exit_code", sa.Integer),
    *_times("started_at"),
    *_times("leave_at", "stopped_at", nullable=True),
)

capacity_traces = sa.Table(
    "capacity_traces", metadata,
    sa.Column("compute_environment", _Name,
              sa.ForeignKey("compute_environments.name", ondelete="CASCADE"), primary_key=True),
    sa.Column("csv", sa.Text, nullable=False),
    sa.Column("loop", sa.Boolean, nullable=False),
    *_times("started_at"),
)

# ----------------------------------------------------------------------------- returned records


class _NamedBySpec:
    """Records whose name is their spec's."""

    spec: ComputeEnvironmentSpec | JobQueueSpec | JobDefinitionSpec

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class ComputeEnvironment(_NamedBySpec):
    spec: ComputeEnvironmentSpec
    status: CEStatus
    status_reason: str | None
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class JobQueue(_NamedBySpec):
    spec: JobQueueSpec
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class JobDefinition(_NamedBySpec):
    spec: JobDefinitionSpec
    revision: int
    status: str  # ACTIVE or INACTIVE (deregistered)
    created_at: float

    @property
    def ref(self) -> str:
        return f"{self.spec.name}:{self.revision}"


@dataclass(frozen=True)
class Job:
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

    @property
    def elastic(self) -> ElasticSettings | None:
        if self.min_workers is None or self.max_workers is None:
            return None
        return ElasticSettings(self.min_workers, self.max_workers)

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
    state: str
    started_at: float
    leave_reason: str | None = None
    exit_code: int | None = None
    leave_at: float | None = None
    stopped_at: float | None = None


_WORKER_FIELDS = [f.name for f in dataclasses.fields(WorkerRecord)]


@dataclass(frozen=True)
class Attempt:
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
class Event:
    id: int
    job_id: str | None
    kind: str
    payload: dict[str, Any]
    at: float


# Columns update_job may change; everything else about a job is fixed at submit.
MUTABLE_JOB_FIELDS = frozenset({
    "status", "status_reason", "attempts", "preemptions", "started_at", "stopped_at",
    "exit_code", "current_workers", "min_workers", "max_workers",
})


def _retry_to_json(r: RetryStrategy) -> dict:
    return {"attempts": r.attempts,
            "evaluate_on_exit": [{"action": rule.action.value, "on_exit_code": rule.on_exit_code,
                                  "on_reason": rule.on_reason} for rule in r.evaluate_on_exit]}


def _retry_from_json(d: dict) -> RetryStrategy:
    return RetryStrategy(d["attempts"], tuple(
        RetryRule(RetryAction(x["action"]), x.get("on_exit_code"), x.get("on_reason"))
        for x in d.get("evaluate_on_exit", ())))


def _elastic(min_w: int | None, max_w: int | None) -> ElasticSettings | None:
    return None if min_w is None or max_w is None else ElasticSettings(min_w, max_w)


# ------------------------------------------------------------------------------------- the store


class Store:
    """The service's database. Thread-safe: each call takes a pooled connection of its own."""

    def __init__(self, url: str, *, echo: bool = False, busy_timeout_ms: int = 30_000,
                 clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.clock = clock
        self._sqlite = url.startswith("sqlite")
        kw: dict[str, Any] = {"echo": echo}
        if self._sqlite and url in ("sqlite://", "sqlite:///:memory:"):
            kw["poolclass"] = sa.pool.StaticPool  # one shared in-memory database
            kw["connect_args"] = {"check_same_thread": False}
        elif not self._sqlite:
            kw["pool_pre_ping"] = True
        self.engine: Engine = sa.create_engine(url, **kw)
        if self._sqlite:
            _sqlite_setup(self.engine, busy_timeout_ms)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_all(self) -> None:
        """Create the tables and indexes that do not exist yet."""
        with self._tx() as conn:
            metadata.create_all(conn)

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Connection]:
        """One transaction; a constraint violation (a racing writer) becomes a ValidationError."""
        with self.engine.connect() as conn:
            if self._sqlite:
                conn.execution_options(dyntrain_write=write)
            try:
                with conn.begin():
                    yield conn
            except IntegrityError as e:
                first = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
                raise ValidationError(f"conflicting write, nothing was changed: {first}") from e

    # --------------------------------------------------------------------- compute environments

    def create_compute_environment(self, spec: ComputeEnvironmentSpec) -> ComputeEnvironment:
        now = self.clock()
        with self._tx() as conn:
            if _exists(conn, compute_environments, name=spec.name):
                raise ValidationError(f"compute environment {spec.name!r} already exists")
            conn.execute(compute_environments.insert().values(
                **_ce_values(spec), status=CEStatus.VALID.value, status_reason=None,
                created_at=now, updated_at=now))
        return ComputeEnvironment(spec, CEStatus.VALID, None, now, now)

    def get_compute_environment(self, name: str) -> ComputeEnvironment:
        with self._tx(write=False) as conn:
            return _ce_from_row(_one(conn, compute_environments, "compute environment", name=name))

    def list_compute_environments(self) -> list[ComputeEnvironment]:
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(compute_environments)
                                .order_by(compute_environments.c.name))
            return [_ce_from_row(r) for r in rows]

    def update_compute_environment(
            self, name: str, *, state: State | str | None = None, min_slots: int | None = None,
            desired_slots: int | None = None, max_slots: int | None = None,
            price_per_slot_hour: float | None = None, status: CEStatus | str | None = None,
            status_reason: str | None = _UNSET) -> ComputeEnvironment:
        """Change the given fields (the result is validated as a whole spec)."""
        changes = {k: v for k, v in (("state", state), ("min_slots", min_slots),
                                     ("desired_slots", desired_slots), ("max_slots", max_slots),
                                     ("price_per_slot_hour", price_per_slot_hour))
                   if v is not None}
        with self._tx() as conn:
            old = _ce_from_row(_one(conn, compute_environments, "compute environment", name=name,
                                    for_update=True))
            spec = dataclasses.replace(old.spec, **changes)
            new_status = old.status if status is None else _enum(CEStatus, status, "status")
            reason = old.status_reason if status_reason is _UNSET else status_reason
            now = self.clock()
            conn.execute(compute_environments.update()
                         .where(compute_environments.c.name == name)
                         .values(**_ce_values(spec), status=new_status.value,
                                 status_reason=reason, updated_at=now))
        return ComputeEnvironment(spec, new_status, reason, old.created_at, now)

    def delete_compute_environment(self, name: str) -> None:
        with self._tx() as conn:
            _one(conn, compute_environments, "compute environment", name=name, for_update=True)
            users = conn.scalars(sa.select(queue_environments.c.queue)
                                 .where(queue_environments.c.compute_environment == name)
                                 .order_by(queue_environments.c.queue)).all()
            if users:
                raise ValidationError(f"compute environment {name!r} is used by job queue(s) "
                                      f"{', '.join(users)}; update or delete them first")
            conn.execute(compute_environments.delete().where(compute_environments.c.name == name))

    # ------------------------------------------------------------------------------ job queues

    def create_job_queue(self, spec: JobQueueSpec) -> JobQueue:
        now = self.clock()
        with self._tx() as conn:
            if _exists(conn, job_queues, name=spec.name):
                raise ValidationError(f"job queue {spec.name!r} already exists")
            _check_envs(conn, spec)
            conn.execute(job_queues.insert().values(
                name=spec.name, priority=spec.priority, state=spec.state.value,
                created_at=now, updated_at=now))
            _write_queue_envs(conn, spec)
        return JobQueue(spec, now, now)

    def get_job_queue(self, name: str) -> JobQueue:
        with self._tx(write=False) as conn:
            return self._queue(conn, _one(conn, job_queues, "job queue", name=name))

    def list_job_queues(self) -> list[JobQueue]:
        """By priority, highest first, then by name."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(job_queues).order_by(job_queues.c.priority.desc(),
                                                               job_queues.c.name)).all()
            envs: dict[str, list[str]] = {}
            for q, ce in conn.execute(sa.select(queue_environments.c.queue,
                                                queue_environments.c.compute_environment)
                                      .order_by(queue_environments.c.queue,
                                                queue_environments.c.position)):
                envs.setdefault(q, []).append(ce)
            return [_queue_from_row(r, envs.get(r.name, [])) for r in rows]

    def update_job_queue(self, name: str, *, priority: int | None = None,
                         state: State | str | None = None,
                         compute_environments: Sequence[str] | None = None) -> JobQueue:
        with self._tx() as conn:
            old = self._queue(conn, _one(conn, job_queues, "job queue", name=name,
                                         for_update=True))
            changes: dict[str, Any] = {k: v for k, v in (("priority", priority),
                                                         ("state", state)) if v is not None}
            if compute_environments is not None:
                changes["compute_environments"] = tuple(compute_environments)
            spec = dataclasses.replace(old.spec, **changes)
            now = self.clock()
            conn.execute(job_queues.update().where(job_queues.c.name == name).values(
                priority=spec.priority, state=spec.state.value, updated_at=now))
            if spec.compute_environments != old.spec.compute_environments:
                _check_envs(conn, spec)
                conn.execute(queue_environments.delete()
                             .where(queue_environments.c.queue == name))
                _write_queue_envs(conn, spec)
        return JobQueue(spec, old.created_at, now)

    def delete_job_queue(self, name: str) -> None:
        """Refused while the queue holds unfinished jobs; finished jobs keep the queue's name."""
        with self._tx() as conn:
            _one(conn, job_queues, "job queue", name=name, for_update=True)
            unfinished = conn.scalar(sa.select(sa.func.count()).select_from(jobs).where(
                jobs.c.queue == name, jobs.c.status.not_in(_TERMINAL)))
            if unfinished:
                raise ValidationError(f"job queue {name!r} still has {unfinished} unfinished "
                                      "job(s); disable it and let them finish first")
            conn.execute(job_queues.delete().where(job_queues.c.name == name))

    def _queue(self, conn: Connection, row: sa.Row) -> JobQueue:
        envs = conn.scalars(sa.select(queue_environments.c.compute_environment)
                            .where(queue_environments.c.queue == row.name)
                            .order_by(queue_environments.c.position)).all()
        return _queue_from_row(row, envs)

    # ------------------------------------------------------------------------- job definitions

    def register_job_definition(self, spec: JobDefinitionSpec) -> tuple[str, int]:
        """Store ``spec`` as the next revision of its name (1 for a new name)."""
        for attempt in range(5):
            try:
                with self._tx() as conn:
                    if conn.dialect.name == "postgresql":  # SQLite: writers already serialise
                        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(
                            sa.func.hashtext("job_definitions:" + spec.name))))
                    last = conn.scalar(sa.select(sa.func.max(job_definitions.c.revision))
                                       .where(job_definitions.c.name == spec.name))
                    revision = (last or 0) + 1
                    conn.execute(job_definitions.insert().values(
                        name=spec.name, revision=revision, status=ACTIVE,
                        command=list(spec.command), environment=dict(spec.environment),
                        parameters=dict(spec.parameters), cpus=spec.resources.cpus,
                        gpus=spec.resources.gpus, memory_mib=spec.resources.memory_mib,
                        retry_strategy=_retry_to_json(spec.retry_strategy),
                        timeout_seconds=spec.timeout_seconds,
                        min_workers=spec.elastic.min_workers if spec.elastic else None,
                        max_workers=spec.elastic.max_workers if spec.elastic else None,
                        created_at=self.clock()))
                return spec.name, revision
            except ValidationError as e:
                # a concurrent register took the same revision number (only if another
                # program registers without the lock); try again
                if attempt == 4 or not isinstance(e.__cause__, IntegrityError):
                    raise
        raise AssertionError("unreachable")

    def get_job_definition(self, name: str, revision: int | None = None) -> JobDefinition:
        """A given revision (even if deregistered), or the latest active one."""
        with self._tx(write=False) as conn:
            return _definition_from_row(_find_definition(conn, name, revision))

    def list_job_definitions(self, name: str | None = None,
                             include_inactive: bool = False) -> list[JobDefinition]:
        q = sa.select(job_definitions).order_by(job_definitions.c.name,
                                                job_definitions.c.revision)
        if name is not None:
            q = q.where(job_definitions.c.name == name)
        if not include_inactive:
            q = q.where(job_definitions.c.status == ACTIVE)
        with self._tx(write=False) as conn:
            return [_definition_from_row(r) for r in conn.execute(q)]

    def deregister_job_definition(self, name: str, revision: int) -> None:
        """Mark a revision INACTIVE: it can no longer be submitted (idempotent)."""
        with self._tx() as conn:
            _one(conn, job_definitions, "job definition", name=name, revision=revision)
            conn.execute(job_definitions.update().where(
                job_definitions.c.name == name, job_definitions.c.revision == revision)
                .values(status=INACTIVE))

    # ------------------------------------------------------------------------------------ jobs

    def submit(self, *, queue: str, definition: str | None = None,
               command: Sequence[str] | None = None, name: str | None = None,
               parameters: dict[str, Any] | None = None,
               environment: dict[str, str] | None = None, resources: Resources | None = None,
               array_size: int | None = None, depends_on: Iterable[Dependency] = (),
               workers: tuple[int, int] | None = None, retry_attempts: int | None = None,
               timeout_seconds: float | None = None, job_id: str | None = None) -> Job:
        """Create a job (and, for an array job, its ``array_size`` children) as SUBMITTED.

        ``definition`` is ``name`` (latest active revision) or ``name:revision``; ``command``
        alone makes an inline job, and with a definition overrides its command. ``parameters``
        and ``environment`` are merged over the definition's; ``Ref::x`` in the command is
        resolved now. ``workers=(min, max)`` makes the job elastic. A ``SEQUENTIAL`` dependency
        names the job itself (``job_id`` or ``""``).
        """
        array_size = check_array_size(array_size)
        if definition is None and command is None:
            raise ValidationError("submit needs a job definition or a command")
        if job_id is not None and not (isinstance(job_id, str) and _JOB_ID.match(job_id)):
            raise ValidationError(f"job id {job_id!r} must be 1-64 letters, digits, '-' or '_' "
                                  "and start with a letter or digit")
        explicit_id, job_id = job_id is not None, job_id or uuid.uuid4().hex
        deps = _normalise_deps(job_id, depends_on, array_size)
        elastic = ElasticSettings(*workers) if workers is not None else None
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ValidationError(f"timeout must be positive, got {timeout_seconds}")
        now = self.clock()
        with self._tx() as conn:
            if explicit_id and _exists(conn, jobs, id=job_id):
                raise ValidationError(f"job id {job_id!r} already exists")
            qrow = _one(conn, job_queues, "job queue", name=queue)
            if qrow.state != State.ENABLED.value:
                raise ValidationError(f"job queue {queue!r} is {qrow.state} and takes no jobs")
            if definition is not None:
                dname, _, drev = definition.partition(":")
                if drev and not drev.isdigit():
                    raise ValidationError(f"job definition {definition!r}: revision must be a "
                                          "number")
                d = _definition_from_row(_find_definition(conn, dname,
                                                          int(drev) if drev else None))
                if d.status != ACTIVE:
                    raise ValidationError(f"job definition {d.ref} is deregistered")
                spec, ref = d.spec, (d.name, d.revision)
            else:
                spec, ref = None, (None, None)
            base_cmd = tuple(command) if command is not None else spec.command
            if not base_cmd or not all(isinstance(a, str) and a for a in base_cmd):
                raise ValidationError("command must be a non-empty list of non-empty strings")
            params = {**dict(spec.parameters if spec else ()),
                      **{str(k): str(v) for k, v in (parameters or {}).items()}}
            env = {**dict(spec.environment if spec else ()),
                   **{str(k): str(v) for k, v in (environment or {}).items()}}
            retry = spec.retry_strategy if spec else RetryStrategy()
            if retry_attempts is not None:
                retry = RetryStrategy(retry_attempts, retry.evaluate_on_exit)
            elastic = elastic or (spec.elastic if spec else None)
            job_name = check_name("job", name or (spec.name if spec else "inline"))
            res = resources or (spec.resources if spec else Resources())
            timeout = timeout_seconds or (spec.timeout_seconds if spec else None)
            _check_deps(conn, job_id, deps, array_size)
            row = {
                "id": job_id, "name": job_name, "queue": queue, "definition_name": ref[0],
                "definition_revision": ref[1], "command": substitute(base_cmd, params),
                "environment": env, "parameters": params, "cpus": res.cpus, "gpus": res.gpus,
                "memory_mib": res.memory_mib, "retry_strategy": _retry_to_json(retry),
                "timeout_seconds": timeout,
                "min_workers": elastic.min_workers if elastic else None,
                "max_workers": elastic.max_workers if elastic else None,
                "array_parent_id": None, "array_index": None, "array_size": array_size,
                "status": JobStatus.SUBMITTED.value, "status_reason": None, "attempts": 0,
                "preemptions": 0, "exit_code": None, "current_workers": 0, "log_seq": 0,
                "created_at": now, "updated_at": now, "started_at": None, "stopped_at": None,
            }
            conn.execute(jobs.insert(), [row])
            if deps:
                conn.execute(job_dependencies.insert(), [
                    {"job_id": job_id, "depends_on": d.job_id, "type": d.type.value}
                    for d in deps])
            if array_size:
                conn.execute(jobs.insert(), [
                    {**row, "id": f"{job_id}:{i}", "array_parent_id": job_id, "array_index": i}
                    for i in range(array_size)])
        return _job_from_row(row, deps)

    def get_job(self, job_id: str) -> Job:
        with self._tx(write=False) as conn:
            row = _one(conn, jobs, "job", id=job_id)
            return _job_from_row(row._mapping, _deps_of(conn, [job_id]).get(job_id, ()))

    def list_jobs(self, queue: str | None = None,
                  status: JobStatus | str | Iterable[JobStatus | str] | None = None,
                  parent: str | None = None, *, top_level: bool = False, limit: int = 100,
                  offset: int = 0) -> list[Job]:
        """Jobs by creation time (then array index, then id); ``top_level`` hides children."""
        if limit < 1 or offset < 0:
            raise ValidationError(f"need limit >= 1 and offset >= 0, got {limit} and {offset}")
        q = sa.select(jobs)
        if queue is not None:
            q = q.where(jobs.c.queue == queue)
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            q = q.where(jobs.c.status.in_([_enum(JobStatus, s, "status").value
                                           for s in wanted]))
        if parent is not None:
            q = q.where(jobs.c.array_parent_id == parent)
        if top_level:
            q = q.where(jobs.c.array_parent_id.is_(None))
        q = q.order_by(jobs.c.created_at, jobs.c.array_index.nulls_first(), jobs.c.id)
        with self._tx(write=False) as conn:
            rows = conn.execute(q.limit(limit).offset(offset)).all()
            deps = _deps_of(conn, [r.id for r in rows if r.array_parent_id is None])
            return [_job_from_row(r._mapping, deps.get(r.id, ())) for r in rows]

    def child_statuses(self, parent_id: str) -> list[JobStatus]:
        """The statuses of an array job's children, by index."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(jobs.c.status).where(jobs.c.array_parent_id == parent_id)
                                .order_by(jobs.c.array_index))
            return [JobStatus(r.status) for r in rows]

    def count_jobs_by_status(self, queue: str | None = None) -> dict[JobStatus, int]:
        """Every status, with 0 where there are none."""
        q = sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)
        if queue is not None:
            q = q.where(jobs.c.queue == queue)
        with self._tx(write=False) as conn:
            counts = dict(conn.execute(q).all())
        return {s: counts.get(s.value, 0) for s in JobStatus}

    def list_dependents(self, job_id: str) -> list[Dependency]:
        """Jobs that depend on ``job_id`` (each as a Dependency naming the dependent job)."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(job_dependencies.c.job_id, job_dependencies.c.type)
                                .where(job_dependencies.c.depends_on == job_id)
                                .order_by(job_dependencies.c.job_id))
            return [Dependency(r.job_id, DependencyType(r.type)) for r in rows]

    def update_job(self, job_id: str, *, expected_status: JobStatus | str | None = None,
                   **changes: Any) -> bool:
        """Set ``changes`` if the job's status is ``expected_status`` (compare-and-set).

        Returns False, changing nothing, when the status differs (someone else moved the job
        first); with ``expected_status=None`` the update is unconditional.
        """
        bad = sorted(set(changes) - MUTABLE_JOB_FIELDS)
        if bad:
            raise ValidationError(f"job field(s) {', '.join(bad)} cannot be updated")
        if "status" in changes:
            changes["status"] = _enum(JobStatus, changes["status"], "status").value
        if changes.get("min_workers") is not None and changes.get("max_workers") is not None:
            ElasticSettings(changes["min_workers"], changes["max_workers"])
        cond = [jobs.c.id == job_id]
        if expected_status is not None:
            cond.append(jobs.c.status == _enum(JobStatus, expected_status, "status").value)
        with self._tx() as conn:
            done = conn.execute(jobs.update().where(*cond).values(
                **changes, updated_at=self.clock())).rowcount
            if not done and not _exists(conn, jobs, id=job_id):
                raise ValidationError(f"unknown job {job_id!r}")
        return bool(done)

    def transition(self, job_id: str, from_status: JobStatus | str, to_status: JobStatus | str,
                   reason: str | None = None, **changes: Any) -> bool:
        """Move ``from_status`` -> ``to_status`` (status_reason := reason) if still there."""
        return self.update_job(job_id, expected_status=from_status, status=to_status,
                               status_reason=reason, **changes)

    # -------------------------------------------------------------------------------- attempts

    def add_attempt(self, job_id: str, attempt_no: int, started_at: float) -> Attempt:
        with self._tx() as conn:
            _one(conn, jobs, "job", id=job_id)
            if _exists(conn, attempts, job_id=job_id, attempt_no=attempt_no):
                raise ValidationError(f"job {job_id!r} already has attempt {attempt_no}")
            conn.execute(attempts.insert().values(job_id=job_id, attempt_no=attempt_no,
                                                  started_at=started_at))
        return Attempt(job_id, attempt_no, started_at, None, None, None)

    def finish_attempt(self, job_id: str, attempt_no: int, exit_code: int | None,
                       reason: str | None, stopped_at: float) -> Attempt:
        with self._tx() as conn:
            _one(conn, jobs, "job", id=job_id)
            row = conn.execute(sa.select(attempts).where(
                attempts.c.job_id == job_id, attempts.c.attempt_no == attempt_no)).first()
            if row is None:
                raise ValidationError(f"job {job_id!r} has no attempt {attempt_no}")
            if row.stopped_at is not None:
                raise ValidationError(f"attempt {attempt_no} of job {job_id!r} already finished")
            conn.execute(attempts.update().where(attempts.c.job_id == job_id,
                                                 attempts.c.attempt_no == attempt_no)
                         .values(exit_code=exit_code, reason=reason, stopped_at=stopped_at))
        return Attempt(job_id, attempt_no, row.started_at, stopped_at, exit_code, reason)

    def list_attempts(self, job_id: str) -> list[Attempt]:
        with self._tx(write=False) as conn:
            _one(conn, jobs, "job", id=job_id)
            rows = conn.execute(sa.select(attempts).where(attempts.c.job_id == job_id)
                                .order_by(attempts.c.attempt_no))
            return [Attempt(r.job_id, r.attempt_no, r.started_at, r.stopped_at, r.exit_code,
                            r.reason) for r in rows]

    # ----------------------------------------------------------------------------------- usage

    def record_usage(self, job_id: str, attempt_no: int, compute_environment: str,
                     capacity_type: CapacityType | str, worker_seconds: float,
                     price_per_slot_hour: float, wasted: bool = False,
                     at: float | None = None) -> Usage:
        """One stretch of worker time; ``wasted`` marks work lost (to a preemption, say)."""
        ctype = _enum(CapacityType, capacity_type, "capacity type")
        if worker_seconds < 0 or price_per_slot_hour < 0:
            raise ValidationError("worker_seconds and price_per_slot_hour must be >= 0")
        at = self.clock() if at is None else at
        with self._tx() as conn:
            _one(conn, jobs, "job", id=job_id)
            new_id = conn.execute(usage.insert().values(
                job_id=job_id, attempt_no=attempt_no, compute_environment=compute_environment,
                capacity_type=ctype.value, worker_seconds=float(worker_seconds),
                price_per_slot_hour=float(price_per_slot_hour), wasted=bool(wasted),
                recorded_at=at)).inserted_primary_key[0]
        return Usage(new_id, job_id, attempt_no, compute_environment, ctype,
                     float(worker_seconds), float(price_per_slot_hour), bool(wasted), at)

    def job_usage(self, job_id: str) -> list[Usage]:
        with self._tx(write=False) as conn:
            _one(conn, jobs, "job", id=job_id)
            rows = conn.execute(sa.select(usage).where(usage.c.job_id == job_id)
                                .order_by(usage.c.id))
            return [Usage(r.id, r.job_id, r.attempt_no, r.compute_environment,
                          CapacityType(r.capacity_type), r.worker_seconds,
                          r.price_per_slot_hour, bool(r.wasted), r.recorded_at) for r in rows]

    # ------------------------------------------------------------------------------------ logs

    def append_log(self, job_id: str, attempt_no: int, worker: str | None,
                   lines: Sequence[str], at: float | None = None) -> int:
        """Append lines with the job's next sequence numbers; returns the last one."""
        lines = list(lines)
        at = self.clock() if at is None else at
        with self._tx() as conn:
            # bumping the counter locks the job's row, so appends to one job never interleave
            last = conn.execute(jobs.update().where(jobs.c.id == job_id)
                                .values(log_seq=jobs.c.log_seq + len(lines))
                                .returning(jobs.c.log_seq)).scalar()
            if last is None:
                raise ValidationError(f"unknown job {job_id!r}")
            first = last - len(lines) + 1
            if lines:
                conn.execute(job_logs.insert(), [
                    {"job_id": job_id, "seq": first + i, "attempt_no": attempt_no,
                     "worker": worker, "line": str(line), "at": at}
                    for i, line in enumerate(lines)])
        return last

    def read_log(self, job_id: str, after_seq: int = 0,
                 limit: int = 1000) -> tuple[list[LogLine], int]:
        """Lines with seq > ``after_seq``; returns them and the seq to pass next time."""
        with self._tx(write=False) as conn:
            _one(conn, jobs, "job", id=job_id)
            rows = conn.execute(sa.select(job_logs).where(job_logs.c.job_id == job_id,
                                                          job_logs.c.seq > after_seq)
                                .order_by(job_logs.c.seq).limit(limit))
            out = [LogLine(r.seq, r.attempt_no, r.worker, r.line, r.at) for r in rows]
        return out, (out[-1].seq if out else after_seq)

    # ---------------------------------------------------------------------------------- events

    def add_event(self, job_id: str | None, kind: str, payload: dict[str, Any] | None = None,
                  at: float | None = None) -> int:
        at = self.clock() if at is None else at
        with self._tx() as conn:
            if job_id is not None:
                _one(conn, jobs, "job", id=job_id)
            return conn.execute(events.insert().values(
                job_id=job_id, kind=kind, payload=dict(payload or {}), at=at)
            ).inserted_primary_key[0]

    def list_events(self, job_id: str | None = None, after_id: int = 0,
                    limit: int = 1000) -> list[Event]:
        """Events with id > ``after_id``, oldest first; all jobs' when ``job_id`` is None."""
        q = sa.select(events).where(events.c.id > after_id).order_by(events.c.id).limit(limit)
        if job_id is not None:
            q = q.where(events.c.job_id == job_id)
        with self._tx(write=False) as conn:
            return [Event(r.id, r.job_id, r.kind, r.payload, r.at) for r in conn.execute(q)]


    # --------------------------------------------------------------------------------- workers

    def add_worker(self, worker: WorkerRecord) -> None:
        with self._tx() as conn:
            _one(conn, jobs, "job", id=worker.job_id)
            conn.execute(workers.insert().values(**dataclasses.asdict(worker)))

    def update_worker(self, worker_id: str, **changes: Any) -> None:
        unknown = set(changes) - {"handle", "state", "leave_reason", "exit_code", "leave_at",
                                  "stopped_at"}
        if unknown:
            raise ValidationError(f"cannot change worker field(s) {sorted(unknown)}")
        with self._tx() as conn:
            done = conn.execute(workers.update().where(workers.c.id == worker_id)
                                .values(**changes)).rowcount
            if not done:
                raise ValidationError(f"unknown worker {worker_id!r}")

    def list_workers(self, job_id: str | None = None, active: bool = True) -> list[WorkerRecord]:
        """Workers (of one job, or all), oldest first; ``active``: not yet EXITED."""
        q = sa.select(workers).order_by(workers.c.started_at, workers.c.id)
        if job_id is not None:
            q = q.where(workers.c.job_id == job_id)
        if active:
            q = q.where(workers.c.state != WORKER_EXITED)
        with self._tx(write=False) as conn:
            return [WorkerRecord(**{c: r._mapping[c] for c in _WORKER_FIELDS})
                    for r in conn.execute(q)]

    # ------------------------------------------------------------------------- capacity traces

    def set_capacity_trace(self, compute_environment: str, csv: str, started_at: float,
                           loop: bool = False) -> None:
        """Replay ``csv`` (see dyntrain.service.capacity) as this environment's slots from now."""
        with self._tx() as conn:
            _one(conn, compute_environments, "compute environment", name=compute_environment)
            conn.execute(capacity_traces.delete().where(
                capacity_traces.c.compute_environment == compute_environment))
            conn.execute(capacity_traces.insert().values(
                compute_environment=compute_environment, csv=csv, loop=loop,
                started_at=started_at))

    def clear_capacity_trace(self, compute_environment: str) -> None:
        with self._tx() as conn:
            conn.execute(capacity_traces.delete().where(
                capacity_traces.c.compute_environment == compute_environment))

    def capacity_traces(self) -> dict[str, tuple[str, float, bool]]:
        """Environment -> (csv, started_at, loop) for every environment replaying a trace."""
        with self._tx(write=False) as conn:
            return {r.compute_environment: (r.csv, r.started_at, bool(r.loop))
                    for r in conn.execute(sa.select(capacity_traces))}


# ----------------------------------------------------------------------------------- internals

WORKER_RUNNING, WORKER_LEAVING, WORKER_EXITED = "RUNNING", "LEAVING", "EXITED"

_TERMINAL = [s.value for s in JobStatus if s.is_terminal()]


def _sqlite_setup(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # writers take the write lock up front: waiting on busy_timeout beats failing later
        write = conn.get_execution_options().get("dyntrain_write", True)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _enum(kind: type, value: Any, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ValidationError(f"unknown {what} {value!r}; expected one of "
                              f"{', '.join(m.value for m in kind)}") from None


def _where(table: sa.Table, keys: dict[str, Any]) -> list:
    return [table.c[k] == v for k, v in keys.items()]


def _exists(conn: Connection, table: sa.Table, **keys: Any) -> bool:
    return conn.execute(sa.select(sa.literal(1)).select_from(table)
                        .where(*_where(table, keys)).limit(1)).first() is not None


def _one(conn: Connection, table: sa.Table, kind: str, for_update: bool = False,
         **keys: Any) -> sa.Row:
    q = sa.select(table).where(*_where(table, keys))
    if for_update:
        q = q.with_for_update()  # PostgreSQL: row lock; SQLite: ignored (writers serialise)
    row = conn.execute(q).first()
    if row is None:
        raise ValidationError(f"unknown {kind} {':'.join(str(v) for v in keys.values())!r}")
    return row


def _ce_values(spec: ComputeEnvironmentSpec) -> dict[str, Any]:
    return {"name": spec.name, "capacity_type": spec.capacity_type.value,
            "price_per_slot_hour": spec.price_per_slot_hour, "slot_cpus": spec.slot.cpus,
            "slot_gpus": spec.slot.gpus, "slot_memory_mib": spec.slot.memory_mib,
            "min_slots": spec.min_slots, "desired_slots": spec.desired_slots,
            "max_slots": spec.max_slots, "state": spec.state.value}


def _ce_from_row(r: sa.Row) -> ComputeEnvironment:
    spec = ComputeEnvironmentSpec(
        name=r.name, capacity_type=CapacityType(r.capacity_type),
        price_per_slot_hour=r.price_per_slot_hour,
        slot=Resources(r.slot_cpus, r.slot_gpus, r.slot_memory_mib), min_slots=r.min_slots,
        desired_slots=r.desired_slots, max_slots=r.max_slots, state=State(r.state))
    return ComputeEnvironment(spec, CEStatus(r.status), r.status_reason, r.created_at,
                              r.updated_at)


def _queue_from_row(r: sa.Row, envs: Sequence[str]) -> JobQueue:
    return JobQueue(JobQueueSpec(r.name, r.priority, tuple(envs), State(r.state)),
                    r.created_at, r.updated_at)


def _check_envs(conn: Connection, spec: JobQueueSpec) -> None:
    known = set(conn.scalars(sa.select(compute_environments.c.name).where(
        compute_environments.c.name.in_(spec.compute_environments))))
    missing = [e for e in spec.compute_environments if e not in known]
    if missing:
        raise ValidationError(f"job queue {spec.name}: unknown compute environment(s) "
                              f"{', '.join(missing)}")


def _write_queue_envs(conn: Connection, spec: JobQueueSpec) -> None:
    conn.execute(queue_environments.insert(), [
        {"queue": spec.name, "position": i, "compute_environment": ce}
        for i, ce in enumerate(spec.compute_environments)])


def _find_definition(conn: Connection, name: str, revision: int | None) -> sa.Row:
    if revision is not None:
        return _one(conn, job_definitions, "job definition", name=name, revision=revision)
    row = conn.execute(sa.select(job_definitions).where(
        job_definitions.c.name == name, job_definitions.c.status == ACTIVE)
        .order_by(job_definitions.c.revision.desc()).limit(1)).first()
    if row is None:
        raise ValidationError(f"unknown job definition {name!r} (or no active revision)")
    return row


def _definition_from_row(r: sa.Row) -> JobDefinition:
    spec = JobDefinitionSpec(
        name=r.name, command=tuple(r.command), environment=tuple(r.environment.items()),
        parameters=tuple(r.parameters.items()),
        resources=Resources(r.cpus, r.gpus, r.memory_mib),
        retry_strategy=_retry_from_json(r.retry_strategy), timeout_seconds=r.timeout_seconds,
        elastic=_elastic(r.min_workers, r.max_workers))
    return JobDefinition(spec, r.revision, r.status, r.created_at)


def _normalise_deps(job_id: str, depends_on: Iterable[Dependency],
                    array_size: int | None) -> list[Dependency]:
    out: dict[str, Dependency] = {}
    for d in depends_on:
        if not isinstance(d, Dependency):
            raise ValidationError(f"depends_on entries must be Dependency, got {d!r}")
        if d.type is DependencyType.SEQUENTIAL:
            if d.job_id not in ("", job_id):
                raise ValidationError("a SEQUENTIAL dependency names the job itself, not "
                                      f"{d.job_id!r}")
            if array_size is None:
                raise ValidationError("a SEQUENTIAL dependency needs an array job")
            d = Dependency(job_id, DependencyType.SEQUENTIAL)
        elif d.job_id == job_id:
            raise ValidationError(f"dependency cycle: job {job_id!r} would depend on itself")
        if d.job_id in out and out[d.job_id] != d:
            raise ValidationError(f"job {d.job_id!r} is listed twice in depends_on")
        out[d.job_id] = d
    return sorted(out.values(), key=lambda d: d.job_id)  # the order reads give back


def _check_deps(conn: Connection, job_id: str, deps: list[Dependency],
                array_size: int | None) -> None:
    """Every dependency exists, N_TO_N pairs arrays of one size, and no cycle forms."""
    others = [d for d in deps if d.type is not DependencyType.SEQUENTIAL]
    if not others:
        return
    found = {r.id: r for r in conn.execute(
        sa.select(jobs.c.id, jobs.c.array_parent_id, jobs.c.array_size)
        .where(jobs.c.id.in_([d.job_id for d in others])))}
    missing = [d.job_id for d in others if d.job_id not in found]
    if missing:
        raise ValidationError(f"depends on unknown job(s) {', '.join(missing)}")
    for d in others:
        r = found[d.job_id]
        if d.type is DependencyType.N_TO_N and (
                array_size is None or r.array_parent_id is not None
                or r.array_size != array_size):
            raise ValidationError(f"an N_TO_N dependency on {d.job_id!r} needs both jobs to be "
                                  f"array jobs of one size (got {array_size} and {r.array_size})")
    # Walk everything the new job would (transitively) wait for; meeting the new job again is a
    # cycle. A child waits for what its parent waits for, so a child leads to its parent.
    seen = {d.job_id for d in others}
    frontier = set(seen)
    while frontier:
        edges = conn.execute(
            sa.select(job_dependencies.c.depends_on).where(
                job_dependencies.c.job_id.in_(frontier),
                job_dependencies.c.type != DependencyType.SEQUENTIAL.value)
            .union(sa.select(jobs.c.array_parent_id).where(
                jobs.c.id.in_(frontier), jobs.c.array_parent_id.is_not(None)))).scalars()
        nxt = set(edges) - seen
        if job_id in nxt:
            raise ValidationError(f"dependency cycle: job {job_id!r} would wait for itself")
        seen |= nxt
        frontier = nxt


def _deps_of(conn: Connection, ids: list[str]) -> dict[str, tuple[Dependency, ...]]:
    if not ids:
        return {}
    out: dict[str, list[Dependency]] = {}
    for r in conn.execute(sa.select(job_dependencies).where(job_dependencies.c.job_id.in_(ids))
                          .order_by(job_dependencies.c.job_id, job_dependencies.c.depends_on)):
        out.setdefault(r.job_id, []).append(Dependency(r.depends_on, DependencyType(r.type)))
    return {k: tuple(v) for k, v in out.items()}


def _job_from_row(r: Any, deps: Iterable[Dependency]) -> Job:
    return Job(
        id=r["id"], name=r["name"], queue=r["queue"], status=JobStatus(r["status"]),
        status_reason=r["status_reason"], definition_name=r["definition_name"],
        definition_revision=r["definition_revision"], command=tuple(r["command"]),
        environment=dict(r["environment"]), parameters=dict(r["parameters"]),
        resources=Resources(r["cpus"], r["gpus"], r["memory_mib"]),
        retry_strategy=_retry_from_json(r["retry_strategy"]),
        timeout_seconds=r["timeout_seconds"], min_workers=r["min_workers"],
        max_workers=r["max_workers"], array_parent_id=r["array_parent_id"],
        array_index=r["array_index"], array_size=r["array_size"], depends_on=tuple(deps),
        attempts=r["attempts"], preemptions=r["preemptions"], exit_code=r["exit_code"],
        current_workers=r["current_workers"], created_at=r["created_at"],
        updated_at=r["updated_at"], started_at=r["started_at"], stopped_at=r["stopped_at"])
