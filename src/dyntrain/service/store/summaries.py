"""Reads for dashboards and metrics: counts by group, newest-first job search, events by kind."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from dyntrain.service.core.model import JobStatus, ValidationError
from dyntrain.service.core.records import Event, Job
from dyntrain.service.store.base import Part, _enum
from dyntrain.service.store.dependencies import deps_of
from dyntrain.service.store.jobs import _job_from_row
from dyntrain.service.store.schema import events, jobs


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class SummaryStore(Part):
    """Read-only views over jobs and events that the web dashboard and /metrics need."""

    def count_jobs_by_queue_and_status(self) -> dict[tuple[str, JobStatus], int]:
        """(queue, status) -> number of jobs; an array job counts as its children (its parent,
        whose status summarises theirs, does not). Absent pairs have none."""
        not_parent = sa.or_(jobs.c.array_size.is_(None), jobs.c.array_parent_id.is_not(None))
        q = (sa.select(jobs.c.queue, jobs.c.status, sa.func.count()).where(not_parent)
             .group_by(jobs.c.queue, jobs.c.status))
        with self._tx(write=False) as conn:
            return {(queue, JobStatus(status)): n for queue, status, n in conn.execute(q)}

    def search_jobs(self, *, queue: str | None = None,
                    status: Iterable[JobStatus | str] | None = None, text: str | None = None,
                    parent: str | None = None, limit: int = 100, offset: int = 0
                    ) -> tuple[list[Job], int]:
        """Jobs newest first and how many match in all; top-level jobs unless ``parent`` names an
        array job. ``text`` matches a job id's start or any part of its name."""
        if limit < 1 or offset < 0:
            raise ValidationError(f"need limit >= 1 and offset >= 0, got {limit} and {offset}")
        where = [jobs.c.array_parent_id == parent if parent is not None
                 else jobs.c.array_parent_id.is_(None)]
        if queue:
            where.append(jobs.c.queue == queue)
        if status is not None:
            wanted = [_enum(JobStatus, s, "status").value for s in status]
            if wanted:
                where.append(jobs.c.status.in_(wanted))
        if text:
            pattern = _like_escape(text)
            where.append(sa.or_(jobs.c.id.like(f"{pattern}%", escape="\\"),
                                jobs.c.name.like(f"%{pattern}%", escape="\\")))
        order = ([jobs.c.array_index] if parent is not None
                 else [jobs.c.created_at.desc(), jobs.c.id.desc()])
        with self._tx(write=False) as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(jobs)
                                 .where(*where)).scalar_one()
            rows = conn.execute(sa.select(jobs).where(*where).order_by(*order)
                                .limit(limit).offset(offset)).all()
            deps = deps_of(conn, [r.id for r in rows if r.array_parent_id is None])
            return [_job_from_row(r._mapping, deps.get(r.id, ())) for r in rows], total

    def count_events_by_kind(self, prefix: str = "") -> dict[str, int]:
        """kind -> number of events whose kind starts with ``prefix``, over every job."""
        q = (sa.select(events.c.kind, sa.func.count())
             .where(events.c.kind.like(f"{_like_escape(prefix)}%", escape="\\"))
             .group_by(events.c.kind))
        with self._tx(write=False) as conn:
            return dict(conn.execute(q).all())

    def list_job_events(self, job_id: str, prefix: str, limit: int = 10_000) -> list[Event]:
        """One job's events whose kind starts with ``prefix``, oldest first."""
        q = (sa.select(events).where(events.c.job_id == job_id,
                                     events.c.kind.like(f"{_like_escape(prefix)}%", escape="\\"))
             .order_by(events.c.id).limit(limit))
        with self._tx(write=False) as conn:
            return [Event(r.id, r.job_id, r.kind, r.payload, r.at) for r in conn.execute(q)]
