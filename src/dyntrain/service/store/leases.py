"""Which service replica leads: the controller's lease, the replicas' heartbeats, and the
terminations that a replica which does not lead hands to the one that does.

Every time here is the database's clock (``db_now``), never a host's: a replica whose clock is
off by an hour takes, renews and loses the lease exactly as one whose clock is right. A lease
row names its holder and its ``epoch``, which grows by one each time another replica (or the
same one, after it lost it) takes it over; the leader renews it before ``expires_at``.

Fencing: ``check`` is the statement a leader's write transaction starts with (``Database.fenced``
runs it): it reads the lease row ``FOR KEY SHARE`` and refuses (``Fenced``) unless this replica
still holds it at this epoch and it has not lapsed. A takeover locks the row ``FOR UPDATE``,
which waits until every such write has committed, so a write either lands before the lease
moved or not at all; a renewal locks it ``FOR NO KEY UPDATE``, which those writes do not hold
up, so the leader's own work never delays its renewal. A replica frozen inside such a
transaction would keep every other one from taking the lease over: replicas open their
sessions with PostgreSQL's ``idle_in_transaction_session_timeout`` set to the lease's ttl, so
the server ends a frozen transaction (nothing of it is committed) and its lock goes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dyntrain.errors import DyntrainError
from dyntrain.service.core.model import ValidationError
from dyntrain.service.store.base import Part
from dyntrain.service.store.schema import leases, replicas, termination_requests

CONTROLLER = "controller"  # the lease that the controller runs under


class Fenced(DyntrainError):
    """A write of a leader whose lease is gone: nothing was changed."""


@dataclass(frozen=True)
class Lease:
    """The controller's lease as the database sees it now.

    Args:
        holder: the replica that holds (or last held) it.
        url: where that replica answers.
        epoch: grows by one with each new holder.
        acquired_at: when this epoch began (database time, epoch seconds).
        remaining: seconds until it lapses (database time; <= 0: lapsed).
    """

    holder: str
    url: str | None
    epoch: int
    acquired_at: float
    remaining: float


@dataclass(frozen=True)
class Replica:
    """One replica's last heartbeat: ``age`` seconds ago by the database's clock."""

    name: str
    url: str | None
    leader: bool
    started_at: float
    age: float


def db_now(conn: Connection) -> float:
    """The database's time now, in epoch seconds."""
    if conn.dialect.name == "sqlite":
        expr = sa.text("(julianday('now') - 2440587.5) * 86400.0")
    else:
        expr = sa.text("extract(epoch from clock_timestamp())")
    return float(conn.execute(sa.select(expr)).scalar_one())


class LeaseStore(Part):
    """The controller's lease, the replicas and the handed-over terminations."""

    def claim(self, holder: str, url: str | None, ttl: float, epoch: int | None) -> Lease | None:
        """Renew the lease that ``holder`` holds at ``epoch`` for ``ttl`` seconds, or take it
        when it is free or lapsed (a new epoch); None when another replica holds it (or this
        one lost it at ``epoch``: it must claim anew, with ``epoch`` None)."""
        try:
            with self._tx() as conn:
                now = db_now(conn)
                query = sa.select(leases).where(leases.c.name == CONTROLLER)
                row = conn.execute(query.with_for_update(key_share=True)).first()
                if row is None:
                    conn.execute(leases.insert().values(
                        name=CONTROLLER, holder=holder, url=url, epoch=1, acquired_at=now,
                        expires_at=now + ttl))
                    return Lease(holder, url, 1, now, ttl)
                if row.holder == holder and row.epoch == epoch and row.expires_at > now:
                    conn.execute(leases.update().where(leases.c.name == CONTROLLER)
                                 .values(expires_at=now + ttl, url=url))
                    return Lease(holder, url, row.epoch, row.acquired_at, ttl)
                if row.expires_at > now:
                    return None  # another holds it, or this one's term ended
                # a takeover: wait until the old leader's fenced writes under way are done
                row = conn.execute(query.with_for_update()).first()
                now = db_now(conn)
                new = row.epoch + 1
                conn.execute(leases.update().where(leases.c.name == CONTROLLER).values(
                    holder=holder, url=url, epoch=new, acquired_at=now, expires_at=now + ttl))
                return Lease(holder, url, new, now, ttl)
        except ValidationError:  # two replicas created the row at once: the other one won
            return None

    def release(self, holder: str, epoch: int) -> bool:
        """Let the lease lapse now (a leader that stops), so another takes it at once."""
        with self._tx() as conn:
            now = db_now(conn)
            return bool(conn.execute(
                leases.update().where(leases.c.name == CONTROLLER, leases.c.holder == holder,
                                      leases.c.epoch == epoch, leases.c.expires_at > now)
                .values(expires_at=now)).rowcount)

    def current(self) -> Lease | None:
        """The lease now (None: nobody ever held it)."""
        with self._tx(write=False) as conn:
            now = db_now(conn)
            row = conn.execute(sa.select(leases).where(leases.c.name == CONTROLLER)).first()
        if row is None:
            return None
        return Lease(row.holder, row.url, row.epoch, row.acquired_at, row.expires_at - now)

    @staticmethod
    def check(conn: Connection, holder: str, epoch: int) -> None:
        """Raise ``Fenced`` unless ``holder`` holds the lease at ``epoch`` and it has not lapsed;
        run first in a leader's write transaction (see the module docstring)."""
        now = db_now(conn)
        held = conn.execute(
            sa.select(leases.c.epoch).where(
                leases.c.name == CONTROLLER, leases.c.holder == holder,
                leases.c.epoch == epoch, leases.c.expires_at > now)
            .with_for_update(read=True, key_share=True)).first()
        if held is None:
            raise Fenced(f"replica {holder} no longer holds the controller's lease at epoch "
                         f"{epoch}: its write was refused")

    # ---- replicas -------------------------------------------------------------------------------

    def beat(self, name: str, url: str | None, leader: bool) -> None:
        """Record that replica ``name`` is alive now (and whether it leads)."""
        with self._tx() as conn:
            now = db_now(conn)
            done = conn.execute(replicas.update().where(replicas.c.name == name)
                                .values(url=url, leader=leader, seen_at=now)).rowcount
            if not done:
                conn.execute(replicas.insert().values(name=name, url=url, leader=leader,
                                                      started_at=now, seen_at=now))

    def list_replicas(self) -> list[Replica]:
        """Every replica that ever beat, the most recently seen first."""
        with self._tx(write=False) as conn:
            now = db_now(conn)
            rows = conn.execute(sa.select(replicas).order_by(replicas.c.seen_at.desc(),
                                                             replicas.c.name)).all()
        return [Replica(r.name, r.url, r.leader, r.started_at, max(0.0, now - r.seen_at))
                for r in rows]

    # ---- terminations handed to the leader ------------------------------------------------------

    def request_termination(self, job_id: str, reason: str) -> None:
        """Ask the leader to terminate ``job_id`` (its workers run under the leader only)."""
        with self._tx() as conn:
            now = db_now(conn)
            if not conn.execute(termination_requests.update()
                                .where(termination_requests.c.job_id == job_id)
                                .values(reason=reason)).rowcount:
                conn.execute(termination_requests.insert().values(
                    job_id=job_id, reason=reason, requested_at=now))

    def take_terminations(self) -> list[tuple[str, str]]:
        """The terminations asked for, oldest first, each handed out once."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(termination_requests.c.job_id,
                                          termination_requests.c.reason)
                                .order_by(termination_requests.c.requested_at)).all()
            if rows:
                conn.execute(termination_requests.delete().where(
                    termination_requests.c.job_id.in_([r.job_id for r in rows])))
        return [(r.job_id, r.reason) for r in rows]
