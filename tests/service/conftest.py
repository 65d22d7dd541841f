"""Fixtures for the job service: a throw-away PostgreSQL server and a Store on each backend.

The server starts once per session, only if a postgres-backed test runs, and is skipped (with the
reason) when PostgreSQL's binaries are missing. Run the SQLite half alone with ``-k sqlite``.
"""

from __future__ import annotations

import uuid

import pytest

from dyntrain.service.store import Store
from dyntrain.testing.pgtemp import (
    PostgresUnavailable,
    create_database,
    drop_database,
    start_postgres,
)


@pytest.fixture(scope="session")
def pg_server() -> str:
    """URL of the server's admin database (``postgres``)."""
    try:
        server = start_postgres()
    except PostgresUnavailable as e:
        pytest.skip(f"PostgreSQL not available: {e}")
    yield server.url
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path) -> Store:
    """A fresh, empty Store: a new SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        url, drop = f"sqlite:///{tmp_path / 'store.db'}", None
    else:
        server = request.getfixturevalue("pg_server")
        name = f"t_{uuid.uuid4().hex[:16]}"
        url = create_database(server, name)

        def drop() -> None:
            drop_database(server, name)
    s = Store(url)
    s.create_all()
    yield s
    s.close()
    if drop is not None:
        drop()

