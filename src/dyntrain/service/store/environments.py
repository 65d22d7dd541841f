"""Compute environments, job queues and capacity traces."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dyntrain.service.core.model import (
    CapacityType,
    CEStatus,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    Resources,
    State,
    ValidationError,
)
from dyntrain.service.core.records import ComputeEnvironment, JobQueue
from dyntrain.service.store.base import _TERMINAL, _UNSET, Part, _enum, _exists, _one
from dyntrain.service.store.schema import (
    capacity_traces,
    compute_environments,
    job_queues,
    jobs,
    queue_environments,
    scheduling_policies,
)


class EnvironmentStore(Part):
    """Compute environments, job queues and capacity traces."""

    def create_compute_environment(self, spec: ComputeEnvironmentSpec, *,
                                   tags: dict[str, str] | None = None,
                                   aws: dict[str, Any] | None = None) -> ComputeEnvironment:
        now = self.clock()
        with self._tx() as conn:
            if _exists(conn, compute_environments, name=spec.name):
                raise ValidationError(f"compute environment {spec.name!r} already exists")
            conn.execute(compute_environments.insert().values(
                **_ce_values(spec), status=CEStatus.VALID.value, status_reason=None,
                created_at=now, updated_at=now, tags=tags or None, aws=aws or None))
        return ComputeEnvironment(spec, CEStatus.VALID, None, now, now, dict(tags or {}),
                                  dict(aws or {}))

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
            status_reason: str | None = _UNSET,
            aws: dict[str, Any] | None = None) -> ComputeEnvironment:
        """Change the given fields (the result is validated as a whole spec); ``aws`` replaces
        the AWS fields kept with it."""
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
            kept = old.aws if aws is None else aws
            now = self.clock()
            conn.execute(compute_environments.update()
                         .where(compute_environments.c.name == name)
                         .values(**_ce_values(spec), status=new_status.value,
                                 status_reason=reason, updated_at=now, aws=kept or None))
        return ComputeEnvironment(spec, new_status, reason, old.created_at, now, old.tags,
                                  dict(kept))

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

    def create_job_queue(self, spec: JobQueueSpec, *, tags: dict[str, str] | None = None,
                         aws: dict[str, Any] | None = None) -> JobQueue:
        now = self.clock()
        with self._tx() as conn:
            if _exists(conn, job_queues, name=spec.name):
                raise ValidationError(f"job queue {spec.name!r} already exists")
            _check_envs(conn, spec)
            _check_policy(conn, spec)
            conn.execute(job_queues.insert().values(
                name=spec.name, priority=spec.priority, state=spec.state.value,
                created_at=now, updated_at=now, tags=tags or None, aws=aws or None,
                scheduling_policy=spec.scheduling_policy,
                preempt_plain_jobs=spec.preempt_plain_jobs))
            _write_queue_envs(conn, spec)
        return JobQueue(spec, now, now, dict(tags or {}), dict(aws or {}))

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
                         compute_environments: Sequence[str] | None = None,
                         aws: dict[str, Any] | None = None,
                         scheduling_policy: str | None = None,
                         preempt_plain_jobs: bool | None = None) -> JobQueue:
        """Change the given fields; ``aws`` replaces the AWS fields kept with it."""
        with self._tx() as conn:
            old = self._queue(conn, _one(conn, job_queues, "job queue", name=name,
                                         for_update=True))
            changes: dict[str, Any] = {k: v for k, v in (("priority", priority),
                                                         ("state", state),
                                                         ("scheduling_policy", scheduling_policy),
                                                         ("preempt_plain_jobs",
                                                          preempt_plain_jobs))
                                          if v is not None}
            if compute_environments is not None:
                changes["compute_environments"] = tuple(compute_environments)
            spec = dataclasses.replace(old.spec, **changes)
            if spec.scheduling_policy != old.spec.scheduling_policy:
                _check_policy(conn, spec)
            kept = old.aws if aws is None else aws
            now = self.clock()
            conn.execute(job_queues.update().where(job_queues.c.name == name).values(
                priority=spec.priority, state=spec.state.value, updated_at=now,
                aws=kept or None, scheduling_policy=spec.scheduling_policy,
                preempt_plain_jobs=spec.preempt_plain_jobs))
            if spec.compute_environments != old.spec.compute_environments:
                _check_envs(conn, spec)
                conn.execute(queue_environments.delete()
                             .where(queue_environments.c.queue == name))
                _write_queue_envs(conn, spec)
        return JobQueue(spec, old.created_at, now, old.tags, dict(kept))

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

    # ------------------------------------------------------------------------- capacity traces

    def set_capacity_trace(self, compute_environment: str, csv: str, started_at: float,
                           loop: bool = False) -> None:
        """Replay ``csv`` (see ``dyntrain.service.core.capacity``) as this environment's slots
        from now."""
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
                              r.updated_at, dict(r.tags or {}), dict(r.aws or {}))


def _queue_from_row(r: sa.Row, envs: Sequence[str]) -> JobQueue:
    return JobQueue(JobQueueSpec(r.name, r.priority, tuple(envs), State(r.state),
                                 r.scheduling_policy, bool(r.preempt_plain_jobs)),
                    r.created_at, r.updated_at, dict(r.tags or {}), dict(r.aws or {}))


def _check_envs(conn: Connection, spec: JobQueueSpec) -> None:
    known = set(conn.scalars(sa.select(compute_environments.c.name).where(
        compute_environments.c.name.in_(spec.compute_environments))))
    missing = [e for e in spec.compute_environments if e not in known]
    if missing:
        raise ValidationError(f"job queue {spec.name}: unknown compute environment(s) "
                              f"{', '.join(missing)}")


def _check_policy(conn: Connection, spec: JobQueueSpec) -> None:
    if spec.scheduling_policy is not None and not _exists(conn, scheduling_policies,
                                                          name=spec.scheduling_policy):
        raise ValidationError(f"job queue {spec.name}: unknown scheduling policy "
                              f"{spec.scheduling_policy}")


def _write_queue_envs(conn: Connection, spec: JobQueueSpec) -> None:
    conn.execute(queue_environments.insert(), [
        {"queue": spec.name, "position": i, "compute_environment": ce}
        for i, ce in enumerate(spec.compute_environments)])


