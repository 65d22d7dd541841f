"""Job log lines and events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from dyntrain.service.model import ValidationError
from dyntrain.service.store.base import StoreBase, _one
from dyntrain.service.store.records import Event, LogLine
from dyntrain.service.store.schema import events, job_logs, jobs


class LogStore(StoreBase):
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


