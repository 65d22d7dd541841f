"""Peers that cannot reach each other, and group formations that keep failing.

The probes run over real sockets; the coordinator is stepped by hand with fake workers (as in
``test_coordinator``). On real hosts: ``tests/test_multihost.py``.
"""

from __future__ import annotations

import socket

import pytest

from conftest import SCRIPTS, run_cli
from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.reach import (
    ProbeListener,
    Unreachable,
    probe_peers,
    unreachable_members,
)
from dyntrain.elastic.membership.formation import ATTEMPTS
from dyntrain.elastic.membership.phases import Phase
from dyntrain.elastic.worker.address import advertise_address, check_bindable, interface_address
from dyntrain.errors import DyntrainError
from test_coordinator import (  # noqa: F401 (the fixture)
    CANARY,
    SETTINGS,
    FakeWorker,
    Job,
    store,
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probes_name_the_peer_they_cannot_reach():
    listener = ProbeListener("127.0.0.1")
    try:
        dead = f"127.0.0.1:{closed_port()}"
        failed = probe_peers({"a": listener.endpoint, "b": dead})
        assert [(f.worker, f.endpoint, f.error) for f in failed] == \
            [("b", dead, "Connection refused")]
        # the listener accepts and closes: its backlog never fills up
        for _ in range(3):
            assert probe_peers({f"w{i}": listener.endpoint for i in range(40)}) == []
    finally:
        listener.close()
    assert probe_peers({"a": listener.endpoint})[0].error == "Connection refused"


def report(worker: str, endpoint: str = "127.0.1.1:9") -> dict:
    return {"worker": worker, "endpoint": endpoint, "error": "Connection refused"}


def test_the_member_most_peers_cannot_reach_is_removed_first():
    removed = unreachable_members({"a": [report("c")], "b": [report("c"), report("a")]})
    assert list(removed) == ["c", "a"]  # c: named twice; then b still cannot reach a
    assert removed["c"] == ["a could not connect to 127.0.1.1:9: Connection refused",
                            "b could not connect to 127.0.1.1:9: Connection refused"]
    # two that cannot reach each other: the newcomer goes, the member that trained stays
    assert list(unreachable_members({"a": [report("b")], "b": [report("a")]},
                                    newcomers=["b"])) == ["b"]
    assert list(unreachable_members({"a": [report("b")], "b": [report("a")]},
                                    newcomers=["a"])) == ["a"]
    # what a removed member said about others no longer counts
    assert list(unreachable_members({"a": [report("b")], "b": [report("c")]})) == ["b"]
    assert unreachable_members({}) == {}


def test_a_member_its_peers_cannot_reach_is_removed_and_told_why(store):  # noqa: F811
    job = Job(store)
    job.start("a", step=1)
    job.w["b"] = FakeWorker(store, "b")
    job.w["b"].send(p.Hello("fp", {}, host="hb", pid=2, probe="127.0.1.1:4242",
                            numerics=SETTINGS, canary=CANARY))
    store.append(p.ROSTER, "b ")
    store.add(p.ROSTER_COUNT, 1)
    job.tick()
    assert job.ctl(0, "a") == p.Control.REFORM
    job.w["a"].ready(0, 1)
    job.tick()  # b joins: generation 1 carries each member's probe endpoint
    gen = job.gen(1)
    assert gen.members == ("a", "b") and gen.probes == ("", "127.0.1.1:4242")
    assert gen.peer_probes("a") == {"b": "127.0.1.1:4242"} and gen.peer_probes("b") == {}
    job.w["a"].send(p.Ready(1, 1, p.ReadyReason.UNREACHABLE,
                            unreachable=(Unreachable(**report("b", "127.0.1.1:4242")),)))
    job.tick()
    assert job.ctl(1, "b") == p.Control.ABORT
    job.w["b"].ready(1, None, reason="abort")
    assert job.tick() is Phase.RUNNING
    assert job.gen(2).members == ("a",)
    told = store.get(p.reply_key("b")).decode()
    assert told.startswith("reject:its peers cannot reach it at 127.0.1.1:4242, the address it "
                           "advertised (a could not connect to 127.0.1.1:4242: Connection "
                           "refused); start it with --advertise-address")
    job.w["a"].metrics(2, 2)
    job.tick()
    assert job.kinds() == ["start", "removed"]  # no join of b, no crash of a world of 2
    assert job.sink.events[-1]["world_before"] == 1 and job.sink.events[-1]["world_after"] == 1


def fail_formation(job: Job, number: int, *members: str) -> None:
    for wid in members:
        job.w[wid].ready(number, 1, reason="error: Connection reset by peer")


def test_a_group_that_keeps_failing_to_form_backs_off_then_drops_the_newcomer(store):  # noqa: F811,E501
    job = Job(store)
    job.start("a", step=1)
    job.hello("b")
    job.tick()
    job.w["a"].ready(0, 1)
    job.tick()
    delays = []
    for number in range(1, ATTEMPTS + 1):
        assert job.gen().members == ("a", "b")
        fail_formation(job, number, "a", "b")
        job.tick()
        began = job.clock.now
        while job.latest() == number and job.phase is not Phase.FAILED:
            assert job.tick(0.05) is not Phase.FAILED
            if job.clock.now - began > 30:
                break
        delays.append(round(job.clock.now - began, 2))
    assert delays[:4] == pytest.approx([0.0, 0.25, 0.5, 1.0], abs=0.06)  # ticks of 0.05 s
    assert any("could not form (a: Connection reset by peer; b: Connection reset by peer); "
               "attempt 2 of 6 in 0 s" in line for line in job.sink.logs)
    # the sixth failure: b, the worker that was not there when a trained, is removed
    assert job.gen().members == ("a",)
    assert store.get(p.reply_key("b")).decode().startswith(
        "reject:the group could not form with it 6 times in a row (a: Connection reset")


def test_a_group_of_old_members_that_cannot_form_fails_the_job_with_the_error(store):  # noqa: F811,E501
    job = Job(store)
    job.start("a", "b", step=1)
    job.w["a"].ready(0, 1, reason="error: peer went away")
    job.w["b"].ready(0, 1, reason="abort")
    job.tick()
    for number in range(1, ATTEMPTS + 1):
        job.tick(10.0)  # past every backoff
        assert job.latest() == number
        fail_formation(job, number, "a", "b")
        job.tick()
    assert job.phase is Phase.FAILED
    assert job.coord.failure.startswith("the workers could not form their group 6 times in a "
                                        "row: a: Connection reset by peer")
    assert job.job_state().startswith("failed:the workers could not form")


def test_a_death_explains_a_failed_formation(store):  # noqa: F811
    job = Job(store)
    job.start("a", "b", "c", step=1)
    for _ in range(ATTEMPTS + 2):  # each formation fails because one more member died
        number = job.latest()
        members = job.gen().members
        job.coord.mark_dead(members[-1], "exit code -9")
        fail_formation(job, number, *members[:-1])
        job.hello(f"n{number}")
        assert job.tick() is Phase.RUNNING
    assert job.coord.formation.failures == 0


def test_an_advertised_address_must_be_this_hosts():
    assert check_bindable("127.0.0.1", "--advertise-address") == "127.0.0.1"
    with pytest.raises(DyntrainError, match=r"--advertise-address 192.0.2.7 is not an address "
                                            r"of this host \(Cannot assign requested address\)"):
        advertise_address(("127.0.0.1", 1), "192.0.2.7")
    assert interface_address("lo") == "127.0.0.1"
    assert advertise_address(("127.0.0.1", 1), iface="lo") == "127.0.0.1"
    with pytest.raises(DyntrainError, match="--iface nosuch0: no IPv4 address on that interface"
                                            ".*this host has: lo"):
        interface_address("nosuch0")
    assert advertise_address(("127.0.0.1", 1)) == "127.0.0.1"


@pytest.mark.parametrize("options, said", [
    (["--advertise-address", "192.0.2.7"], "--advertise-address 192.0.2.7 is not an address of "
                                           "this host (Cannot assign requested address)"),
    (["--iface", "nosuch0"], "--iface nosuch0: no IPv4 address on that interface"),
    (["--iface", "lo", "--advertise-address", "127.0.0.1"],
     "give --advertise-address or --iface, not both"),
])
def test_dyntrain_worker_says_what_is_wrong_with_its_address(options, said):
    proc = run_cli(["worker", "--coordinator", "127.0.0.1:9", *options,
                    SCRIPTS / "ledger_train.py"], timeout=60)
    assert proc.returncode != 0
    assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_dyntrain_worker_waits_for_the_job_its_coordinator_publishes(tmp_path):
    """A worker that connects before its coordinator published the job (the moment between
    listening and publishing: a worker started with the launcher) waits for it and trains with
    the job's run folder; one that never sees a job says so instead of training without its
    run folder (its checkpoints and final.pt would have gone nowhere)."""
    import json
    import subprocess
    from datetime import timedelta

    import torch.distributed as dist

    from conftest import DYNTRAIN, ROOT

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    script = tmp_path / "where.py"
    script.write_text("import os; print('out=' + os.environ.get('DYNTRAIN_OUT', 'none'))\n")
    address = f"127.0.0.1:{server.port}"
    nothing = run_cli(["worker", "--coordinator", address, "--connect-timeout", "2", script],
                      timeout=60)
    assert nothing.returncode != 0 and "out=" not in nothing.stdout, nothing.stdout
    assert f"the coordinator at {address} published no job within 2 s" in nothing.stderr
    assert len(nothing.stderr.strip().splitlines()) == 1, nothing.stderr
    worker = subprocess.Popen([*DYNTRAIN, "worker", "--coordinator", address,
                               "--connect-timeout", "60", str(script)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server.set(p.JOB_INFO, json.dumps({"out_dir": str(tmp_path / "run")}))
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0 and f"out={tmp_path / 'run'}" in out, out + err
