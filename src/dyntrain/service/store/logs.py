"""Job log lines and events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.records import Event, LogLine, LogStream
from dyntrain.service.store.base import Part, _one
from dyntrain.service.store.schema import attempts, events, job_logs, jobs


class LogStore(Part):
    """Job log lines and events."""

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

    def count_log_lines(self, job_id: str, worker: str) -> int:
        """How many lines of ``worker`` the job's log holds (where to go on after a restart)."""
        with self._tx(write=False) as conn:
            return conn.scalar(sa.select(sa.func.count()).select_from(job_logs).where(
                job_logs.c.job_id == job_id, job_logs.c.worker == worker))

    # ---------------------------------------------------------------------- logs by attempt

    def log_streams(self, *, job_ids: Sequence[str] | None = None,
                    job_id_prefix: str | None = None, job_name: str | None = None,
                    definition_name: str | None = None) -> list[LogStream]:
        """One entry per started attempt, by job creation then attempt, narrowed by the
        arguments given (all must hold)."""
        line_stats = (sa.select(job_logs.c.job_id, job_logs.c.attempt_no,
                                sa.func.min(job_logs.c.at).label("first_at"),
                                sa.func.max(job_logs.c.at).label("last_at"),
                                sa.func.sum(sa.func.length(job_logs.c.line)).label("size"))
                      .group_by(job_logs.c.job_id, job_logs.c.attempt_no).subquery())
        q = (sa.select(attempts.c.job_id, attempts.c.attempt_no, attempts.c.started_at,
                       jobs.c.name, jobs.c.definition_name, line_stats.c.first_at,
                       line_stats.c.last_at, line_stats.c.size)
             .join(jobs, jobs.c.id == attempts.c.job_id)
             .outerjoin(line_stats, sa.and_(line_stats.c.job_id == attempts.c.job_id,
                                            line_stats.c.attempt_no == attempts.c.attempt_no))
             .order_by(jobs.c.created_at, jobs.c.id, attempts.c.attempt_no))
        if job_ids is not None:
            q = q.where(attempts.c.job_id.in_(list(job_ids)))
        if job_id_prefix:
            q = q.where(attempts.c.job_id.startswith(job_id_prefix, autoescape=True))
        if job_name is not None:
            q = q.where(jobs.c.name == job_name)
        if definition_name is not None:
            q = q.where(jobs.c.definition_name == definition_name)
        with self._tx(write=False) as conn:
            return [LogStream(r.job_id, r.attempt_no, r.name, r.definition_name, r.started_at,
                              r.first_at, r.last_at, int(r.size or 0)) for r in conn.execute(q)]

    def attempt_log(self, job_id: str, attempt_no: int, *, after_seq: int | None = None,
                    before_seq: int | None = None, start_at: float | None = None,
                    end_at: float | None = None, limit: int = 10_000,
                    newest: bool = False) -> list[LogLine]:
        """Lines of one attempt, oldest first: the first ``limit`` of those that match, or with
        ``newest`` the last ``limit``. ``start_at`` is inclusive, ``end_at`` exclusive."""
        q = sa.select(job_logs).where(job_logs.c.job_id == job_id,
                                      job_logs.c.attempt_no == attempt_no)
        if after_seq is not None:
            q = q.where(job_logs.c.seq > after_seq)
        if before_seq is not None:
            q = q.where(job_logs.c.seq < before_seq)
        q = _in_time(q, start_at, end_at)
        q = q.order_by(job_logs.c.seq.desc() if newest else job_logs.c.seq).limit(limit)
        with self._tx(write=False) as conn:
            out = [LogLine(r.seq, r.attempt_no, r.worker, r.line, r.at) for r in conn.execute(q)]
        return out[::-1] if newest else out

    def search_logs(self, streams: Sequence[tuple[str, int]] | None = None, *,
                    start_at: float | None = None, end_at: float | None = None,
                    terms: Sequence[str] = (), offset: int = 0,
                    limit: int = 10_000) -> list[tuple[str, LogLine]]:
        """(job id, line) of the given (job, attempt) streams (all when None), interleaved by
        time; each of ``terms`` must occur in a line."""
        q = sa.select(job_logs)
        if streams is not None:
            if not streams:
                return []
            q = q.where(sa.tuple_(job_logs.c.job_id, job_logs.c.attempt_no).in_(list(streams)))
        q = _in_time(q, start_at, end_at)
        for term in terms:
            q = q.where(job_logs.c.line.contains(term, autoescape=True))
        q = q.order_by(job_logs.c.at, job_logs.c.job_id, job_logs.c.seq).offset(offset)
        with self._tx(write=False) as conn:
            return [(r.job_id, LogLine(r.seq, r.attempt_no, r.worker, r.line, r.at))
                    for r in conn.execute(q.limit(limit))]

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




def _in_time(q: sa.Select, start_at: float | None, end_at: float | None) -> sa.Select:
    if start_at is not None:
        q = q.where(job_logs.c.at >= start_at)
    if end_at is not None:
        q = q.where(job_logs.c.at < end_at)
    return q
