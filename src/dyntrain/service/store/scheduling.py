"""What the controller reads and writes in bulk: unfinished jobs, many transitions at once,
the claim of a pass's starts, array children counted by status.

These keep a scheduling pass's database work proportional to what changed, not to the queue: the
controller reads new jobs after a watermark, and moves thousands of array children with one
statement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import bindparam

from dyntrain.service.core.model import JobStatus, Resources, ValidationError, WorkerState
from dyntrain.service.core.records import Job, JobEntry, WorkerRecord
from dyntrain.service.store.base import _TERMINAL, Part, _enum
from dyntrain.service.store.columns import MUTABLE_JOB_FIELDS
from dyntrain.service.store.dependencies import deps_of
from dyntrain.service.store.jobs import _job_from_row
from dyntrain.service.store.schema import attempts, events, jobs, usage, workers

CHUNK = 500  # ids per IN (...) list

_ENTRY_COLUMNS = [jobs.c[n] for n in (
    "id", "queue", "status", "status_reason", "created_at", "cpus", "gpus", "memory_mib",
    "min_workers", "max_workers", "array_parent_id", "array_index", "array_size", "num_nodes",
    "share_identifier", "scheduling_priority")]


def _chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(ids), CHUNK):
        yield ids[i:i + CHUNK]


class WorkerExitRow(NamedTuple):
    b_id: str
    b_code: int | None
    b_at: float
    b_why: str | None


class UsageRow(NamedTuple):
    job_id: str
    attempt_no: int
    compute_environment: str
    capacity_type: str
    worker_seconds: float
    price_per_slot_hour: float
    wasted: bool
    recorded_at: float


class AttemptEnd(NamedTuple):
    """How an attempt ended and what its job becomes."""

    b_job: str
    b_no: int
    b_code: int | None
    b_reason: str
    b_at: float
    b_status: str
    b_attempts: int
    b_preemptions: int
    b_stopped: float | None


class SchedulingStore(Part):
    """Bulk reads and writes of the controller."""

    def scan_jobs(self, after: tuple[float, str] | None = None,
                  limit: int = 2000) -> list[JobEntry]:
        """Unfinished jobs created after ``after`` = (created_at, id), in that order.

        Passing the last entry's (created_at, id) back pages through them; on SQLite jobs commit
        in created_at order, so a later call finds exactly the jobs submitted since.
        """
        q = sa.select(*_ENTRY_COLUMNS).where(jobs.c.status.not_in(_TERMINAL))
        if after is not None:
            q = q.where(sa.or_(jobs.c.created_at > after[0],
                               sa.and_(jobs.c.created_at == after[0], jobs.c.id > after[1])))
        q = q.order_by(jobs.c.created_at, jobs.c.id).limit(limit)
        with self._tx(write=False) as conn:
            rows = conn.execute(q).all()
            deps = deps_of(conn, [r.id for r in rows if r.array_parent_id is None])
        return [JobEntry(r.id, r.queue, JobStatus(r.status), r.status_reason, r.created_at,
                         Resources(r.cpus, r.gpus, r.memory_mib), r.min_workers, r.max_workers,
                         r.array_parent_id, r.array_index, r.array_size, deps.get(r.id, ()),
                         r.num_nodes, r.share_identifier, r.scheduling_priority or 0)
                for r in rows]

    def get_jobs(self, ids: Sequence[str]) -> dict[str, Job]:
        """The jobs of these ids that exist."""
        out: dict[str, Job] = {}
        with self._tx(write=False) as conn:
            for part in _chunks(list(ids)):
                rows = conn.execute(sa.select(jobs).where(jobs.c.id.in_(part))).all()
                deps = deps_of(conn, [r.id for r in rows if r.array_parent_id is None])
                out.update((r.id, _job_from_row(r._mapping, deps.get(r.id, ()))) for r in rows)
        return out

    def job_statuses(self, ids: Sequence[str]) -> dict[str, tuple[JobStatus, bool]]:
        """(status, whether it is an array parent) of each of these jobs that exists."""
        out: dict[str, tuple[JobStatus, bool]] = {}
        with self._tx(write=False) as conn:
            for part in _chunks(list(ids)):
                out.update((r.id, (JobStatus(r.status), r.array_size is not None
                                   and r.array_parent_id is None)) for r in conn.execute(
                    sa.select(jobs.c.id, jobs.c.status, jobs.c.array_size,
                              jobs.c.array_parent_id).where(jobs.c.id.in_(part))))
        return out

    def child_status_counts(self, parent_ids: Sequence[str]) -> dict[str, Counter]:
        """Array parent -> how many of its children are in each status."""
        out: dict[str, Counter] = {p: Counter() for p in parent_ids}
        with self._tx(write=False) as conn:
            for part in _chunks(list(parent_ids)):
                for parent, status, n in conn.execute(
                        sa.select(jobs.c.array_parent_id, jobs.c.status, sa.func.count())
                        .where(jobs.c.array_parent_id.in_(part))
                        .group_by(jobs.c.array_parent_id, jobs.c.status)):
                    out[parent][JobStatus(status)] = n
        return out

    def transition_many(self, ids: Sequence[str], from_status: JobStatus | str,
                        to_status: JobStatus | str, reason: str | None,
                        **changes: Any) -> list[str]:
        """``transition`` for many jobs in one transaction; returns the ids that moved."""
        values = _job_changes(to_status, reason, changes, self.clock())
        frm = _enum(JobStatus, from_status, "status").value
        moved: list[str] = []
        with self._tx() as conn:
            for part in _chunks(list(ids)):
                moved += conn.execute(jobs.update().where(jobs.c.id.in_(part),
                                                          jobs.c.status == frm)
                                      .values(**values).returning(jobs.c.id)).scalars()
        return moved

    def transition_children(self, parent_id: str, from_status: JobStatus | str,
                            to_status: JobStatus | str, reason: str | None,
                            **changes: Any) -> list[str]:
        """Move every child of an array job that is in ``from_status``; returns their ids."""
        values = _job_changes(to_status, reason, changes, self.clock())
        frm = _enum(JobStatus, from_status, "status").value
        with self._tx() as conn:
            return list(conn.execute(jobs.update().where(jobs.c.array_parent_id == parent_id,
                                                         jobs.c.status == frm)
                                     .values(**values).returning(jobs.c.id)).scalars())

    def last_attempt_numbers(self, ids: Sequence[str]) -> dict[str, int]:
        """Job -> the number of its latest attempt (absent: none yet)."""
        out: dict[str, int] = {}
        with self._tx(write=False) as conn:
            for part in _chunks(list(ids)):
                out.update(conn.execute(
                    sa.select(attempts.c.job_id, sa.func.max(attempts.c.attempt_no))
                    .where(attempts.c.job_id.in_(part)).group_by(attempts.c.job_id)).all())
        return out

    def settle(self, exits: Sequence[WorkerExitRow], usages: Sequence[UsageRow],
               ends: Sequence[AttemptEnd]) -> None:
        """A step's worker exits, their worker time and the attempts they end, in one
        transaction: a few statements however many there are."""
        now = self.clock()
        with self._tx() as conn:
            if exits:
                conn.execute(workers.update().where(workers.c.id == bindparam("b_id")).values(
                    state=WorkerState.EXITED.value, exit_code=bindparam("b_code"),
                    stopped_at=bindparam("b_at"),
                    leave_reason=sa.func.coalesce(workers.c.leave_reason, bindparam("b_why"))),
                    [e._asdict() for e in exits])
            if usages:
                conn.execute(usage.insert(), [u._asdict() for u in usages])
            if not ends:
                return
            rows = [e._asdict() for e in ends]
            conn.execute(attempts.update().where(
                attempts.c.job_id == bindparam("b_job"),
                attempts.c.attempt_no == bindparam("b_no")).values(
                exit_code=bindparam("b_code"), reason=bindparam("b_reason"),
                stopped_at=bindparam("b_at")), rows)
            conn.execute(jobs.update().where(jobs.c.id == bindparam("b_job")).values(
                status=bindparam("b_status"), status_reason=bindparam("b_reason"),
                attempts=bindparam("b_attempts"), preemptions=bindparam("b_preemptions"),
                exit_code=bindparam("b_code"), stopped_at=bindparam("b_stopped"),
                current_workers=0, updated_at=now), rows)
            conn.execute(events.insert(), [
                {"job_id": e.b_job, "kind": "attempt", "at": e.b_at,
                 "payload": {"attempt": e.b_no, "exit_code": e.b_code, "status": e.b_status,
                             "reason": e.b_reason}} for e in ends])

    def claim_starts(self, starts: Sequence[tuple[str, int, list[WorkerRecord]]],
                     started_at: float) -> list[str]:
        """For each (job, attempt number, workers): RUNNABLE -> STARTING if still RUNNABLE (a
        compare-and-set), the attempt and its worker records (no handles yet). One transaction
        of three statements; returns the jobs claimed."""
        if not starts:
            return []
        with self._tx() as conn:
            claimed = set(conn.execute(jobs.update().where(
                jobs.c.id.in_([s[0] for s in starts]),
                jobs.c.status == JobStatus.RUNNABLE.value).values(
                status=JobStatus.STARTING.value, status_reason="starting workers",
                started_at=started_at, updated_at=started_at).returning(jobs.c.id)).scalars())
            mine = [s for s in starts if s[0] in claimed]
            if mine:
                conn.execute(attempts.insert(), [
                    {"job_id": job_id, "attempt_no": number, "started_at": started_at}
                    for job_id, number, _ in mine])
                conn.execute(workers.insert(), [_worker_row(w) for _, _, records in mine
                                                for w in records])
        return [s[0] for s in mine]

    def unclaim_start(self, job_id: str, attempt_no: int, reason: str,
                      started_at: float | None) -> bool:
        """Take back a claim whose workers never started (the executor had no room): its
        attempt and worker records go, and the job is RUNNABLE again (if still STARTING) with
        ``reason`` and the ``started_at`` it had before; one transaction. True if it moved."""
        now = self.clock()
        with self._tx() as conn:
            moved = conn.execute(jobs.update().where(
                jobs.c.id == job_id, jobs.c.status == JobStatus.STARTING.value).values(
                status=JobStatus.RUNNABLE.value, status_reason=reason, started_at=started_at,
                current_workers=0, updated_at=now)).rowcount
            if moved:
                conn.execute(workers.delete().where(workers.c.job_id == job_id,
                                                    workers.c.attempt_no == attempt_no))
                conn.execute(attempts.delete().where(attempts.c.job_id == job_id,
                                                     attempts.c.attempt_no == attempt_no))
        return bool(moved)

    def record_launch(self, handles: dict[str, dict], never_started: Sequence[str],
                      running: dict[str, int]) -> None:
        """Store started workers' handles, mark the others never started, and move jobs
        (job -> its workers) from STARTING to RUNNING."""
        now = self.clock()
        with self._tx() as conn:
            if handles:
                conn.execute(workers.update().where(workers.c.id == bindparam("b_id"))
                             .values(handle=bindparam("b_handle")),
                             [{"b_id": k, "b_handle": v} for k, v in handles.items()])
            if never_started:
                conn.execute(workers.update().where(workers.c.id.in_(list(never_started)))
                             .values(state=WorkerState.EXITED.value, stopped_at=now,
                                     leave_reason="never started"))
            if running:
                conn.execute(jobs.update().where(
                    jobs.c.id == bindparam("b_id"),
                    jobs.c.status == JobStatus.STARTING.value).values(
                    status=JobStatus.RUNNING.value, status_reason="running",
                    current_workers=bindparam("b_n"), updated_at=now),
                    [{"b_id": k, "b_n": v} for k, v in running.items()])


def _job_changes(to_status: JobStatus | str, reason: str | None, changes: dict,
                 now: float) -> dict[str, Any]:
    bad = sorted(set(changes) - MUTABLE_JOB_FIELDS)
    if bad:
        raise ValidationError(f"job field(s) {', '.join(bad)} cannot be updated")
    return {**changes, "status": _enum(JobStatus, to_status, "status").value,
            "status_reason": reason, "updated_at": now}


def _worker_row(w: WorkerRecord) -> dict[str, Any]:
    return {"id": w.id, "job_id": w.job_id, "attempt_no": w.attempt_no,
            "compute_environment": w.compute_environment, "capacity_type": w.capacity_type,
            "price_per_slot_hour": w.price_per_slot_hour, "handle": w.handle,
            "state": WorkerState(w.state).value, "started_at": w.started_at,
            "leave_reason": w.leave_reason, "exit_code": w.exit_code, "leave_at": w.leave_at,
            "stopped_at": w.stopped_at}

