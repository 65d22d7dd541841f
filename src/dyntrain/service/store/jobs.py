"""Jobs (submitted, read, updated) and their attempts; their dependencies are checked and read
by ``dependencies``."""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from dyntrain.elastic.numerics import KernelLevel
from dyntrain.service.core.fairshare import check_share
from dyntrain.service.core.model import (
    Dependency,
    DependencyType,
    ElasticSettings,
    JobDefinitionSpec,
    JobStatus,
    Resources,
    RetryStrategy,
    State,
    ValidationError,
    check_array_size,
    check_name,
    never_fits,
    parse_launcher,
    substitute,
)
from dyntrain.service.core.records import ACTIVE, AttemptRecord, Job
from dyntrain.service.core.submitter import (
    check_run_folder,
    clean,
    job_numerics,
    kernel_refusal,
    pinned_kernels,
)
from dyntrain.service.store.base import Part, _enum, _exists, _one
from dyntrain.service.store.columns import (
    MUTABLE_JOB_FIELDS,
    launcher_column,
    retry_from_json,
    retry_to_json,
)
from dyntrain.service.store.definitions import _definition_from_row, _find_definition
from dyntrain.service.store.dependencies import check_deps, deps_of, normalise_deps
from dyntrain.service.store.schema import (
    attempts,
    compute_environments,
    job_dependencies,
    job_queues,
    jobs,
    queue_environments,
)

MAX_NODES = 1000
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class JobStore(Part):
    """Jobs (submitted, read, updated) and their attempts; their dependencies are checked and read
by ``dependencies``."""

    def submit(self, *, queue: str, definition: str | None = None,
               command: Sequence[str] | None = None, name: str | None = None,
               parameters: dict[str, Any] | None = None,
               environment: dict[str, str] | None = None, resources: Resources | None = None,
               array_size: int | None = None, depends_on: Iterable[Dependency] = (),
               workers: tuple[int, int] | None = None, retry_attempts: int | None = None,
               timeout_seconds: float | None = None, job_id: str | None = None,
               workdir: str | None = None,
               exported_environment: dict[str, str] | None = None,
               retry_strategy: RetryStrategy | None = None, num_nodes: int | None = None,
               tags: dict[str, str] | None = None, aws: dict[str, Any] | None = None,
               client_token: str | None = None, launcher: str | None = None,
               kernel_levels: Sequence[KernelLevel] | None = None, share: str | None = None,
               scheduling_priority: int | None = None) -> Job:
        """Create a job (and, for an array job, its ``array_size`` children) as SUBMITTED.

        ``definition`` is ``name`` (latest active revision) or ``name:revision``; ``command``
        alone makes an inline job, and with a definition overrides its command. ``parameters``
        and ``environment`` are merged over the definition's; ``Ref::x`` in the command is
        resolved now. ``workers=(min, max)`` makes the job elastic. A ``SEQUENTIAL`` dependency
        names the job itself (``job_id`` or ``""``). ``workdir`` (absolute) is where its workers
        start; ``exported_environment`` is the submitter's environment, under the job's own
        (see ``dyntrain.service.core.submitter``). A job whose workers fit no slot of the queue's
        environments is refused: it could never run. ``retry_strategy`` replaces the
        definition's (``retry_attempts`` then sets its attempts). ``num_nodes`` makes a
        multi-node job: without ``workers``, that many plain workers start together and node 0
        decides the outcome. ``client_token`` makes the submit idempotent: a submit with a token
        already used returns that job, unchanged. ``tags`` and ``aws`` are kept with the job.
        ``launcher`` (``Launcher``'s values) says how an elastic job's workers run; it needs
        ``workers`` here or in the definition. ``kernel_levels``: the CPU kernel levels the
        service's hosts run (``Executor.kernel_levels``); a job pinned to another is refused.
        ``share``: its share identifier, which a queue with a fair-share scheduling policy
        requires and any other refuses; ``scheduling_priority`` (0-9999) orders a share's jobs.
        """
        array_size = check_array_size(array_size)
        if definition is None and command is None:
            raise ValidationError("submit needs a job definition or a command")
        if job_id is not None and not (isinstance(job_id, str) and _JOB_ID.fullmatch(job_id)):
            raise ValidationError(f"job id {job_id!r} must be 1-64 letters, digits, '-' or '_' "
                                  "and start with a letter or digit")
        explicit_id, job_id = job_id is not None, job_id or uuid.uuid4().hex
        deps = normalise_deps(job_id, depends_on, array_size)
        elastic = ElasticSettings(*workers) if workers is not None else None
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ValidationError(f"timeout must be positive, got {timeout_seconds}")
        if workdir is not None and not (isinstance(workdir, str) and os.path.isabs(workdir)
                                        and "\x00" not in workdir):
            raise ValidationError(f"workdir must be an absolute path, got {workdir!r}")
        if num_nodes is not None and not 1 <= num_nodes <= MAX_NODES:
            raise ValidationError(f"a multi-node job needs 1-{MAX_NODES} nodes, got {num_nodes}")
        exports = None if exported_environment is None else clean(exported_environment)
        try:
            with self._tx() as conn:
                # Dated inside the write transaction, submits serialised (SQLite: by its write
                # lock; PostgreSQL: by an advisory lock): jobs commit in created_at order, which
                # is what lets the controller find new jobs after a watermark
                # (Store.scheduling.scan_jobs).
                if conn.dialect.name == "postgresql":
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(
                        sa.func.hashtext("dyntrain:submit"))))
                found = None if client_token is None else _by_token(conn, client_token)
                if found is not None:
                    return found
                now = self.clock()
                if explicit_id and _exists(conn, jobs, id=job_id):
                    raise ValidationError(f"job id {job_id!r} already exists")
                qrow = _one(conn, job_queues, "job queue", name=queue)
                if qrow.state != State.ENABLED.value:
                    raise ValidationError(f"job queue {queue!r} is {qrow.state} and takes no "
                                          "jobs")
                check_share(queue, qrow.scheduling_policy, share, scheduling_priority)
                spec, ref = _definition(conn, definition)
                base_cmd = tuple(command) if command is not None else spec.command
                if not base_cmd or not all(isinstance(a, str) and a for a in base_cmd):
                    raise ValidationError(
                        "command must be a non-empty list of non-empty strings" if spec is None
                        or command is not None else f"job definition {ref[0]}:{ref[1]} has no "
                        "command: give one with the job")
                params = {**dict(spec.parameters if spec else ()),
                          **{str(k): str(v) for k, v in (parameters or {}).items()}}
                env = {**dict(spec.environment if spec else ()),
                       **{str(k): str(v) for k, v in (environment or {}).items()}}
                check_run_folder(env)
                job_numerics(env)  # a bad DYNTRAIN_THREADS & co.: refused now, in one line
                retry = retry_strategy or (spec.retry_strategy if spec else RetryStrategy())
                if retry_attempts is not None:
                    retry = RetryStrategy(retry_attempts, retry.evaluate_on_exit)
                elastic = _with_launcher(elastic or (spec.elastic if spec else None),
                                         launcher)
                level = pinned_kernels(env, exports, elastic is not None)
                refused = (None if kernel_levels is None or level is None
                           else kernel_refusal(level, kernel_levels))
                if refused:
                    raise ValidationError(f"job refused: {refused}")
                job_name = check_name("job", name or (spec.name if spec else "inline"))
                res = resources or (spec.resources if spec else Resources())
                timeout = timeout_seconds or (spec.timeout_seconds if spec else None)
                check_deps(conn, job_id, deps, array_size)
                row = {
                    "id": job_id, "name": job_name, "queue": queue, "definition_name": ref[0],
                    "definition_revision": ref[1], "command": substitute(base_cmd, params),
                    "environment": env, "parameters": params, "cpus": res.cpus,
                    "gpus": res.gpus, "memory_mib": res.memory_mib,
                    "retry_strategy": retry_to_json(retry), "timeout_seconds": timeout,
                    "min_workers": elastic.min_workers if elastic else None,
                    "max_workers": elastic.max_workers if elastic else None,
                    "launcher": launcher_column(elastic),
                    "array_parent_id": None, "array_index": None, "array_size": array_size,
                    "status": JobStatus.SUBMITTED.value, "status_reason": None, "attempts": 0,
                    "preemptions": 0, "exit_code": None, "current_workers": 0, "log_seq": 0,
                    "created_at": now, "updated_at": now, "started_at": None,
                    "stopped_at": None, "workdir": workdir, "exported_environment": exports,
                    "progress": None, "result": None, "num_nodes": num_nodes, "tags": tags or None,
                    "aws": aws or None, "client_token": client_token,
                    "share_identifier": share, "scheduling_priority": scheduling_priority,
                }
                never = never_fits(queue, res, _queue_slots(conn, queue))
                if never:
                    raise ValidationError(f"job refused: it {never}")
                conn.execute(jobs.insert(), [row])
                if deps:
                    conn.execute(job_dependencies.insert(), [
                        {"job_id": job_id, "depends_on": d.job_id, "type": d.type.value}
                        for d in deps])
                if array_size:
                    conn.execute(jobs.insert(), [
                        {**row, "id": f"{job_id}:{i}", "array_parent_id": job_id,
                         "array_index": i, "client_token": None,
                         "exported_environment": None}  # read from the parent
                        for i in range(array_size)])
            return _job_from_row(row, deps)
        except ValidationError as e:
            if client_token is None or not isinstance(e.__cause__, IntegrityError):
                raise
            with self._tx(write=False) as conn:  # a concurrent retry inserted it first
                found = _by_token(conn, client_token)
            if found is None:
                raise
            return found

    def exported_environment(self, job: Job) -> dict[str, str]:
        """The submitter's environment of ``job`` (an array child's is on its parent)."""
        if job.array_parent_id is None:
            return dict(job.exported_environment or {})
        with self._tx(write=False) as conn:
            found = conn.execute(sa.select(jobs.c.exported_environment)
                                 .where(jobs.c.id == job.array_parent_id)).scalar()
        return dict(found or {})

    def get_job(self, job_id: str) -> Job:
        with self._tx(write=False) as conn:
            row = _one(conn, jobs, "job", id=job_id)
            return _job_from_row(row._mapping, deps_of(conn, [job_id]).get(job_id, ()))

    def list_jobs(self, queue: str | None = None,
                  status: JobStatus | str | Iterable[JobStatus | str] | None = None,
                  parent: str | None = None, *, top_level: bool = False, limit: int = 100,
                  offset: int = 0, name: str | None = None, definition: str | None = None,
                  created_after: float | None = None, created_before: float | None = None,
                  newest_first: bool = False) -> list[Job]:
        """Jobs by creation time (then array index, then id); ``top_level`` hides children.

        ``name`` (case-insensitive) and ``definition`` (a definition's name, or
        ``name:revision``) match exactly, or as a prefix when they end with ``*``;
        ``created_after``/``created_before`` bound the creation time (exclusive).
        """
        if limit < 1 or offset < 0:
            raise ValidationError(f"need limit >= 1 and offset >= 0, got {limit} and {offset}")
        q = sa.select(jobs)
        if name is not None:
            q = q.where(_matches(sa.func.lower(jobs.c.name), name.lower()))
        if definition is not None:
            dname, colon, drev = definition.partition(":")
            q = q.where(_matches(jobs.c.definition_name, dname))
            if colon:
                if not drev.isdigit():
                    raise ValidationError(f"job definition {definition!r}: revision must be a "
                                          "number")
                q = q.where(jobs.c.definition_revision == int(drev))
        if created_after is not None:
            q = q.where(jobs.c.created_at > created_after)
        if created_before is not None:
            q = q.where(jobs.c.created_at < created_before)
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
        if newest_first:
            q = q.order_by(jobs.c.created_at.desc(), jobs.c.array_index.desc().nulls_last(),
                           jobs.c.id.desc())
        else:
            q = q.order_by(jobs.c.created_at, jobs.c.array_index.nulls_first(), jobs.c.id)
        with self._tx(write=False) as conn:
            rows = conn.execute(q.limit(limit).offset(offset)).all()
            deps = deps_of(conn, [r.id for r in rows if r.array_parent_id is None])
            return [_job_from_row(r._mapping, deps.get(r.id, ())) for r in rows]

    def job_ids_starting_with(self, prefix: str, limit: int = 10) -> list[str]:
        """Ids of top-level jobs that begin with ``prefix`` (at most ``limit``, in id order):
        what a short id, as the CLI prints them, may stand for."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(jobs.c.id).where(
                jobs.c.id.startswith(prefix, autoescape=True), jobs.c.array_parent_id.is_(None))
                .order_by(jobs.c.id).limit(limit))
            return [r.id for r in rows]

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

    def add_attempt(self, job_id: str, attempt_no: int, started_at: float) -> AttemptRecord:
        with self._tx() as conn:
            _one(conn, jobs, "job", id=job_id)
            if _exists(conn, attempts, job_id=job_id, attempt_no=attempt_no):
                raise ValidationError(f"job {job_id!r} already has attempt {attempt_no}")
            conn.execute(attempts.insert().values(job_id=job_id, attempt_no=attempt_no,
                                                  started_at=started_at))
        return AttemptRecord(job_id, attempt_no, started_at, None, None, None)

    def finish_attempt(self, job_id: str, attempt_no: int, exit_code: int | None,
                       reason: str | None, stopped_at: float) -> AttemptRecord:
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
        return AttemptRecord(job_id, attempt_no, row.started_at, stopped_at, exit_code, reason)

    def list_attempts(self, job_id: str) -> list[AttemptRecord]:
        with self._tx(write=False) as conn:
            _one(conn, jobs, "job", id=job_id)
            rows = conn.execute(sa.select(attempts).where(attempts.c.job_id == job_id)
                                .order_by(attempts.c.attempt_no))
            return [AttemptRecord(r.job_id, r.attempt_no, r.started_at, r.stopped_at, r.exit_code,
                            r.reason) for r in rows]


def _queue_slots(conn: Connection, queue: str) -> list[tuple[str, Resources]]:
    """(name, slot) of each of ``queue``'s compute environments, in the queue's order."""
    ce = compute_environments
    rows = conn.execute(
        sa.select(ce.c.name, ce.c.slot_cpus, ce.c.slot_gpus, ce.c.slot_memory_mib)
        .join(queue_environments, queue_environments.c.compute_environment == ce.c.name)
        .where(queue_environments.c.queue == queue).order_by(queue_environments.c.position))
    return [(r.name, Resources(r.slot_cpus, r.slot_gpus, r.slot_memory_mib)) for r in rows]


def _definition(conn: Connection, definition: str | None
                ) -> tuple[JobDefinitionSpec | None, tuple[str | None, int | None]]:
    """The spec and (name, revision) of ``name`` or ``name:revision``; (None, (None, None))."""
    if definition is None:
        return None, (None, None)
    dname, _, drev = definition.partition(":")
    if drev and not drev.isdigit():
        raise ValidationError(f"job definition {definition!r}: revision must be a number")
    d = _definition_from_row(_find_definition(conn, dname, int(drev) if drev else None))
    if d.status != ACTIVE:
        raise ValidationError(f"job definition {d.ref} is deregistered")
    return d.spec, (d.name, d.revision)


def _matches(column: sa.ColumnElement, pattern: str) -> sa.ColumnElement:
    """``column == pattern``, or a prefix match when ``pattern`` ends with ``*``."""
    if not pattern.endswith("*"):
        return column == pattern
    return column.startswith(pattern[:-1], autoescape=True)


def _by_token(conn: Connection, client_token: str) -> Job | None:
    row = conn.execute(sa.select(jobs).where(jobs.c.client_token == client_token)).first()
    if row is None:
        return None
    return _job_from_row(row._mapping, deps_of(conn, [row.id]).get(row.id, ()))


def _job_from_row(r: Any, deps: Iterable[Dependency]) -> Job:
    return Job(
        id=r["id"], name=r["name"], queue=r["queue"], status=JobStatus(r["status"]),
        status_reason=r["status_reason"], definition_name=r["definition_name"],
        definition_revision=r["definition_revision"], command=tuple(r["command"]),
        environment=dict(r["environment"]), parameters=dict(r["parameters"]),
        resources=Resources(r["cpus"], r["gpus"], r["memory_mib"]),
        retry_strategy=retry_from_json(r["retry_strategy"]),
        timeout_seconds=r["timeout_seconds"], min_workers=r["min_workers"],
        max_workers=r["max_workers"], array_parent_id=r["array_parent_id"],
        array_index=r["array_index"], array_size=r["array_size"], depends_on=tuple(deps),
        attempts=r["attempts"], preemptions=r["preemptions"], exit_code=r["exit_code"],
        current_workers=r["current_workers"], created_at=r["created_at"],
        updated_at=r["updated_at"], started_at=r["started_at"], stopped_at=r["stopped_at"],
        workdir=r["workdir"], exported_environment=r["exported_environment"],
        progress=r["progress"], result=r.get("result"), num_nodes=r.get("num_nodes"),
        tags=dict(r.get("tags") or {}), aws=dict(r.get("aws") or {}),
        launcher=r.get("launcher"), share=r.get("share_identifier"),
        scheduling_priority=r.get("scheduling_priority") or 0)


def _with_launcher(elastic: ElasticSettings | None,
                   launcher: str | None) -> ElasticSettings | None:
    """The job's elastic settings with the submit's ``launcher`` (None: the definition's)."""
    if launcher is None:
        return elastic
    chosen = parse_launcher(launcher)
    if elastic is None:
        raise ValidationError(f"launcher {chosen.value} needs workers MIN:MAX (an elastic job)")
    return dataclasses.replace(elastic, launcher=chosen)
