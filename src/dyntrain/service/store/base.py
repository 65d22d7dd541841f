"""The store's engine, transactions and row helpers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from dyntrain.service.core.model import JobStatus, ValidationError
from dyntrain.service.store.schema import upgrade

_UNSET: Any = object()

_TERMINAL = [s.value for s in JobStatus if s.is_terminal()]


class Database:
    """The engine and the transactions that every part of the store runs its calls in."""

    def __init__(self, url: str, *, echo: bool = False, busy_timeout_ms: int = 30_000,
                 clock: Callable[[], float] = time.time,
                 idle_transaction_ms: int | None = None) -> None:
        """``idle_transaction_ms`` (PostgreSQL): the server ends a session that sits this long
        inside a transaction (a process frozen or cut off while it held row locks), so that
        its locks never outlive it for long."""
        self.url = url
        self.clock = clock
        self._sqlite = url.startswith("sqlite")
        kw: dict[str, Any] = {"echo": echo}
        if self._sqlite and url in ("sqlite://", "sqlite:///:memory:"):
            kw["poolclass"] = sa.pool.StaticPool  # one shared in-memory database
            kw["connect_args"] = {"check_same_thread": False}
        elif not self._sqlite:
            kw["pool_pre_ping"] = True
            if idle_transaction_ms:
                kw["connect_args"] = {"options": "-c idle_in_transaction_session_timeout="
                                                 f"{int(idle_transaction_ms)}"}
        self.engine: Engine = sa.create_engine(url, **kw)
        self._local = threading.local()  # the connection of a batch() on this thread
        if self._sqlite:
            _sqlite_setup(self.engine, busy_timeout_ms)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_all(self) -> list[str]:
        """Create or upgrade the schema (see ``schema.upgrade``); returns what changed."""
        with self._tx() as conn:
            return upgrade(conn)

    @contextmanager
    def fenced(self, check: Callable[[Connection], None]) -> Iterator[None]:
        """Start each write transaction of this thread with ``check`` (which raises to refuse
        it, nothing written): a leader's fencing, see ``store/leases.py``."""
        previous = getattr(self._local, "fence", None)
        self._local.fence = check
        try:
            yield
        finally:
            self._local.fence = previous

    def _fence(self, conn: Connection) -> None:
        check = getattr(self._local, "fence", None)
        if check is not None:
            check(conn)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Run this thread's store calls in one write transaction: one commit for all of them.

        Each call inside still succeeds or fails as a whole (a savepoint); an exception that
        leaves the block rolls everything back. For many small writes in a row (one controller
        step), which would otherwise pay a commit each.
        """
        if getattr(self._local, "conn", None) is not None:
            yield  # already in one
            return
        with self.engine.connect() as conn:
            if self._sqlite:
                conn.execution_options(dyntrain_write=True)
            with conn.begin():
                self._fence(conn)
                self._local.conn = conn
                try:
                    yield
                finally:
                    self._local.conn = None

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Connection]:
        """One transaction; a constraint violation (a racing writer) becomes a ValidationError."""
        outer = getattr(self._local, "conn", None)
        try:
            if outer is not None:
                with outer.begin_nested():
                    yield outer
                return
            with self.engine.connect() as conn:
                if self._sqlite:
                    conn.execution_options(dyntrain_write=write)
                with conn.begin():
                    if write:
                        self._fence(conn)
                    yield conn
        except IntegrityError as e:
            first = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
            raise ValidationError(f"conflicting write, nothing was changed: {first}") from e


class Part:
    """One aggregate's calls, each in a transaction of the database that the parts share."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def clock(self) -> Callable[[], float]:
        return self.db.clock

    def _tx(self, write: bool = True) -> AbstractContextManager[Connection]:
        return self.db._tx(write)


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
        known = f" ({known_names(conn, table, kind)})" \
            if kind in _NAMED and set(keys) == {"name"} else ""
        raise ValidationError(f"unknown {kind} {':'.join(str(v) for v in keys.values())!r}"
                              f"{known}")
    return row


# the named resources whose "unknown ..." errors list what exists
_NAMED = {"compute environment": "compute environments", "job queue": "job queues",
          "job definition": "job definitions"}
_SHOWN = 10


def known_names(conn: Connection, table: sa.Table, kind: str, *where: Any) -> str:
    """``job queues: batch, training``, or ``there are no job queues``: what exists, for an
    error about one that does not (at most ``_SHOWN`` names)."""
    names = conn.execute(sa.select(table.c.name).where(*where).distinct()
                         .order_by(table.c.name).limit(_SHOWN + 1)).scalars().all()
    plural = _NAMED[kind]
    if not names:
        return f"there are no {plural}"
    more = ", ..." if len(names) > _SHOWN else ""
    return f"{plural}: {', '.join(names[:_SHOWN])}{more}"

