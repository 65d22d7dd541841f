"""Fair-share scheduling policies (AWS Batch's), which job queues name."""

from __future__ import annotations

import sqlalchemy as sa

from dyntrain.service.core.fairshare import FairsharePolicy, ShareAttributes
from dyntrain.service.core.model import ValidationError, check_name
from dyntrain.service.core.records import SchedulingPolicy
from dyntrain.service.store.base import Part, _exists, _one
from dyntrain.service.store.schema import job_queues, scheduling_policies

_KIND = "scheduling policy"


class PolicyStore(Part):
    """Scheduling policies by name; one in use by a job queue is not deleted."""

    def create(self, name: str, policy: FairsharePolicy,
               tags: dict[str, str] | None = None) -> SchedulingPolicy:
        check_name(_KIND, name)
        now = self.clock()
        with self._tx() as conn:
            if _exists(conn, scheduling_policies, name=name):
                raise ValidationError(f"scheduling policy {name!r} already exists")
            conn.execute(scheduling_policies.insert().values(
                name=name, **_columns(policy), created_at=now, updated_at=now,
                tags=tags or None))
        return SchedulingPolicy(name, policy, now, now, dict(tags or {}))

    def get(self, name: str) -> SchedulingPolicy:
        with self._tx(write=False) as conn:
            return _from_row(_one(conn, scheduling_policies, _KIND, name=name))

    def list(self) -> list[SchedulingPolicy]:
        """By name."""
        with self._tx(write=False) as conn:
            return [_from_row(r) for r in conn.execute(
                sa.select(scheduling_policies).order_by(scheduling_policies.c.name))]

    def update(self, name: str, policy: FairsharePolicy) -> SchedulingPolicy:
        now = self.clock()
        with self._tx() as conn:
            old = _from_row(_one(conn, scheduling_policies, _KIND, name=name, for_update=True))
            conn.execute(scheduling_policies.update()
                         .where(scheduling_policies.c.name == name)
                         .values(**_columns(policy), updated_at=now))
        return SchedulingPolicy(name, policy, old.created_at, now, old.tags)

    def queues_using(self, name: str) -> list[str]:
        with self._tx(write=False) as conn:
            return list(conn.scalars(sa.select(job_queues.c.name)
                                     .where(job_queues.c.scheduling_policy == name)
                                     .order_by(job_queues.c.name)))

    def delete(self, name: str) -> None:
        """Refused while a job queue uses it."""
        with self._tx() as conn:
            _one(conn, scheduling_policies, _KIND, name=name, for_update=True)
            using = list(conn.scalars(sa.select(job_queues.c.name)
                                      .where(job_queues.c.scheduling_policy == name)))
            if using:
                raise ValidationError(f"scheduling policy {name} is in use by job queue(s) "
                                      f"{', '.join(sorted(using))}")
            conn.execute(scheduling_policies.delete().where(scheduling_policies.c.name == name))


def _columns(policy: FairsharePolicy) -> dict:
    return {"share_decay_seconds": policy.share_decay_seconds,
            "compute_reservation": policy.compute_reservation,
            "share_distribution": [[a.identifier, a.weight_factor] for a in policy.shares]}


def _from_row(r: sa.Row) -> SchedulingPolicy:
    policy = FairsharePolicy(r.share_decay_seconds, r.compute_reservation,
                             tuple(ShareAttributes(i, w) for i, w in r.share_distribution))
    return SchedulingPolicy(r.name, policy, r.created_at, r.updated_at, dict(r.tags or {}))
