"""Several `dyntrain server` replicas on one PostgreSQL: one leads, another takes over.

The lease and its fencing are tested on the store of a real PostgreSQL (two replicas' election
rounds with clocks an hour apart, a write of a stale epoch); the takeover with three real
server processes sharing one state directory and one database: the leader SIGKILLed while an
elastic and a plain job run and another is submitted meanwhile, then the new leader frozen
(SIGSTOP) until a third replica leads and let go on (SIGCONT): it finds its lease gone and
stops acting.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from functools import partial

import boto3
import httpx
import pytest
import torch

from conftest import read_jsonl
from dyntrain.service.client import Client
from dyntrain.service.engine.leadership import Leadership, LeaseConfig
from dyntrain.service.store import Store
from dyntrain.service.store.leases import Fenced, LeaseStore
from dyntrain.testing.jobs import pinned_env
from dyntrain.testing.pgtemp import create_database, drop_database
from dyntrain.testing.wait import wait_until

from .test_cli_service import PY, ROOT, _env, assert_one_line_error, cli, start_server

DIGITS = [PY, "-m", "dyntrain.workloads.digits", "--epochs", "4"]  # 88 steps
STEP_DELAY = ["--step-delay", "0.01"]  # sleeps only: the same math without it
TAKEOVER_S = 15.0


@pytest.fixture
def pg_db(pg_server):
    name = f"ha_{uuid.uuid4().hex[:12]}"
    url = create_database(pg_server, name)
    yield url
    drop_database(pg_server, name)


class Skewed:
    """A clock ``offset`` seconds off this host's."""

    def __init__(self, clock, offset: float) -> None:
        self.clock, self.offset, self.frozen = clock, offset, False

    def __call__(self) -> float:
        return self.clock() + self.offset


def test_ha_lease_follows_the_databases_clock_not_the_hosts(pg_db):
    """Two replicas whose clocks differ by two hours: the first takes the lease and renews
    it, the second never takes it while it is renewed, and takes it (epoch 2) once the first
    stops renewing for longer than the ttl; the first then finds it gone."""
    ahead = Store(pg_db, clock=Skewed(time.time, 3600.0))
    behind = Store(pg_db, clock=Skewed(time.time, -3600.0))
    ahead.create_all()
    config = dict(ttl_seconds=1.0, renew_seconds=0.2)
    a = Leadership(ahead, LeaseConfig("a", "http://a", **config),
                   monotonic=Skewed(time.monotonic, 3600.0))
    b = Leadership(behind, LeaseConfig("b", "http://b", **config),
                   monotonic=Skewed(time.monotonic, -3600.0))
    try:
        assert a.claim() == 1 and b.claim() is None
        renewed_until = time.monotonic() + 2.5  # more than twice the ttl
        while time.monotonic() < renewed_until:
            assert a.claim() == 1, "the leader lost a lease it renews"
            assert b.claim() is None, "taken over while renewed"
            time.sleep(0.2)
        took = wait_until(b.claim, "the lease to lapse and be taken over", 10, 0.1)
        assert took == 2 and a.claim() is None and a.term() is None
        lease = behind.leases.current()
        assert lease.holder == "b" and lease.epoch == 2 and lease.remaining > 0
        assert {r.name: r.leader for r in ahead.leases.list_replicas()} == {"a": False,
                                                                           "b": True}
    finally:
        ahead.close()
        behind.close()


def fence(store: Store, holder: str, epoch: int):
    """``store``'s writes in this thread fenced as the leader ``holder`` at ``epoch``."""
    return store.fenced(partial(LeaseStore.check, holder=holder, epoch=epoch))


def test_ha_a_write_fenced_by_a_stale_epoch_changes_nothing(pg_db):
    store = Store(pg_db)
    store.create_all()
    try:
        store.leases.claim("old", None, ttl=60.0, epoch=None)
        with fence(store, "old", 1):
            store.logs.add_event(None, "written", {"by": "old"})  # it holds the lease
        # its lease is taken over (made to lapse here rather than waited for)
        assert store.leases.release("old", 1)
        assert store.leases.claim("new", None, ttl=60.0, epoch=None).epoch == 2
        before = store.logs.list_events(None)
        with pytest.raises(Fenced, match="no longer holds the controller's lease at epoch 1"):
            with fence(store, "old", 1):
                store.logs.add_event(None, "stale", {"by": "old"})
        with pytest.raises(Fenced), fence(store, "old", 1), store.batch():
            store.logs.add_event(None, "stale", {"by": "old, batched"})
        assert store.logs.list_events(None) == before
        with fence(store, "new", 2):
            store.logs.add_event(None, "written", {"by": "new"})  # the holder writes on
        assert [e.payload for e in store.logs.list_events(None)][-1] == {"by": "new"}
    finally:
        store.close()


def test_ha_replicas_on_sqlite_are_refused_in_one_line(tmp_path):
    proc = cli("server", "--replica", "--port", "0", "--state-dir", tmp_path / "state")
    assert_one_line_error(proc, "several replicas need PostgreSQL")
