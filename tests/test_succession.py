"""Who hosts a ``dyntrain run --takeover`` job's coordinator when its host is lost: pure."""

import io

from dyntrain.elastic import protocol as p
from dyntrain.elastic.runs.coordinator_file import read_coordinator_file
from dyntrain.elastic.runs.storage import open_store
from dyntrain.elastic.worker.succession import (
    STARTUP_SECONDS,
    Succession,
    Takeover,
    due,
    earlier_addresses,
    lost_host,
    presumed_lost,
    successor_addresses,
    successors,
)
from dyntrain.launch.successor import Superseded, claim, host

# rank order: w0 (the launcher's local worker, on the coordinator's host 10.0.0.10), a and b on
# host 11, c on host 12
GEN = p.Generation(4, ("b", "w0", "a", "c"), 90,
                   probes=("10.0.0.11:7001", "10.0.0.10:7000", "10.0.0.11:7002",
                           "10.0.0.12:7003"))
COORDINATOR = "10.0.0.10:29400"


def test_every_member_names_the_same_successors_from_the_generation_alone():
    lost = lost_host(COORDINATOR)
    assert lost == "10.0.0.10"
    assert successors(GEN, lost) == ["b", "a", "c"]  # rank order, the lost host left out
    assert presumed_lost(GEN, lost) == ["w0"]
    # each successor listens on its own host at the old port: one address per host
    assert successor_addresses(GEN, lost, 29400) == ["10.0.0.11:29400", "10.0.0.12:29400"]
    # each yields to those ranked before it
    assert earlier_addresses(GEN, lost, "b", 29400) == []
    assert earlier_addresses(GEN, lost, "a", 29400) == ["10.0.0.11:29400"]
    assert earlier_addresses(GEN, lost, "c", 29400) == ["10.0.0.11:29400"]


def test_successor_k_hosts_after_k_plus_one_waits_and_a_lost_member_never():
    lost = lost_host(COORDINATOR)
    assert not due(GEN, lost, "b", away=5.9, after=6.0)
    assert due(GEN, lost, "b", away=6.0, after=6.0)
    # the second waits for the first, and for its process to start
    assert not due(GEN, lost, "a", away=12.0 + STARTUP_SECONDS - 0.1, after=6.0)
    assert due(GEN, lost, "a", away=12.0 + STARTUP_SECONDS, after=6.0)
    assert not due(GEN, lost, "w0", away=1e9, after=6.0)


def test_a_job_without_takeover_looks_nowhere_else_and_hosts_nothing():
    none = Succession(Takeover.from_info({"out_dir": "/x"}), {}, "b",
                      lambda: p.Position(p.WorkerState.RUNNING, GEN, 90))
    assert none.within == 0.0 and none.addresses(COORDINATOR) == []
    none.poll(COORDINATOR, away=1e9)
    assert none.started is None
    takeover = Takeover(6.0, 90.0, {"min_workers": 1}, epoch=2)
    assert Takeover.from_info({"takeover": takeover.to_json()}) == takeover
    before = Succession(takeover, {}, "b", p.Position)  # no generation yet: no successor known
    assert before.addresses(COORDINATOR) == []
    during = Succession(takeover, {}, "b", lambda: p.Position(p.WorkerState.RUNNING, GEN, 90))
    assert during.within == 90.0
    assert during.addresses(COORDINATOR) == ["10.0.0.11:29400", "10.0.0.12:29400"]


def test_a_launcher_learns_from_the_run_folder_that_a_successor_took_its_job(tmp_path):
    store = open_store(tmp_path)
    superseded = Superseded(store, "run-1", every=0.0)
    assert superseded() is None  # nothing recorded
    claim(store, "10.0.0.10:29400", "run-1", 0, "launcher")
    assert superseded() is None  # its own claim
    claim(store, "10.0.0.11:29400", "run-2", 1, "x")
    assert superseded() is None  # another job's
    claim(store, "10.0.0.11:29400", "run-1", 1, "b")
    assert superseded() == {"address": "10.0.0.11:29400", "job": "run-1", "epoch": 1, "by": "b"}


def test_a_successor_that_cannot_read_the_run_folder_says_so_in_one_line_and_goes_on(tmp_path):
    """The run folder was on the lost host's own disk: the successor's host sees no numerics
    record there. It says so in one line, still hosts the coordinator (claimed at the next
    epoch in the same path on its own host), and fails the job only when no worker comes."""
    out = tmp_path / "run"  # empty: not the job's folder as this host sees it
    conf = {"min_workers": 1, "max_workers": 2, "settle_seconds": 0.0, "failure_timeout": 0.3,
            "allow_mixed_numerics": False}
    spec = {"info": {"out_dir": str(out), "job": "run-1"},
            "takeover": Takeover(1.0, 5.0, conf).to_json(), "by": "b", "host": "127.0.0.1",
            "port": 0, "lost_host": "10.0.0.10", "expect": [], "lost": [], "earlier": []}
    said = io.StringIO()
    assert host(spec, said) == 1  # no worker comes to it here: every worker is gone
    lines = said.getvalue().splitlines()
    cannot = [line for line in lines if "cannot be read from 127.0.0.1" in line]
    assert len(cannot) == 1 and "10.0.0.10" in cannot[0], lines
    record = read_coordinator_file(out)
    assert (record["job"], record["epoch"], record["by"]) == ("run-1", 1, "b"), record
    assert record["address"].startswith("127.0.0.1:")
    assert any("hosts the job's coordinator" in line for line in lines), lines
    assert "every worker is gone" in lines[-1], lines
