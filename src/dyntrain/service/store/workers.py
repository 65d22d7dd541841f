"""Worker processes and the worker time they used."""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa

from dyntrain.service.core.model import CapacityType, ValidationError, WorkerState
from dyntrain.service.core.records import Usage, WorkerRecord
from dyntrain.service.store.base import Part, _enum, _one
from dyntrain.service.store.columns import WORKER_FIELDS
from dyntrain.service.store.schema import jobs, usage, workers


class WorkerStore(Part):
    """Worker processes and the worker time they used."""

    def add_worker(self, worker: WorkerRecord) -> None:
        with self._tx() as conn:
            _one(conn, jobs, "job", id=worker.job_id)
            conn.execute(workers.insert().values(**{
                **dataclasses.asdict(worker),
                "state": _enum(WorkerState, worker.state, "worker state").value}))

    def update_worker(self, worker_id: str, **changes: Any) -> None:
        unknown = set(changes) - {"handle", "state", "leave_reason", "exit_code", "leave_at",
                                  "stopped_at"}
        if unknown:
            raise ValidationError(f"cannot change worker field(s) {sorted(unknown)}")
        if "state" in changes:
            changes["state"] = _enum(WorkerState, changes["state"], "worker state").value
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
            q = q.where(workers.c.state != WorkerState.EXITED.value)
        with self._tx(write=False) as conn:
            return [_worker_from_row(r._mapping) for r in conn.execute(q)]

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


def _worker_from_row(row: Any) -> WorkerRecord:
    """A worker's record; its state, text in the table, as a ``WorkerState``."""
    return WorkerRecord(**{c: row[c] for c in WORKER_FIELDS if c != "state"},
                        state=WorkerState(row["state"]))
