"""Jobs across hosts (network namespaces of ``dyntrain.testing.hosts``): each host has its own
address, a hostname that resolves to 127.0.1.1, its own disk; no environment variable tells
the product anything. The run folder is the bed's shared folder (a shared file system)."""

from __future__ import annotations

import pytest

from conftest import SCRIPTS, wait_for
from dyntrain.testing.jobs import HostJob
from test_elastic_e2e import assert_exactly_once, max_param_diff

pytestmark = pytest.mark.slow
HOSTS = 3


def ledger_job(hosts, name: str, *run_args: str, args: tuple[str, ...] = ()) -> HostJob:
    """The ledger workload launched on host 0 with one local worker, held slow (each chunk
    0.05 s longer) until the test removes ``job.gate``."""
    out = hosts.shared / name
    gate = hosts.shared / f"{name}.hold"
    gate.touch()
    job = HostJob(hosts.host(0), out, [SCRIPTS / "ledger_train.py", "--slow-while", gate, *args],
                  ["--workers", "1:3", "--nproc", "1", *run_args])
    job.gate = gate
    return job


def finish(job: HostJob) -> str:
    job.gate.unlink()
    code = job.wait(240)
    out = job.launcher.text()
    assert code == 0, out[-3000:]
    return out


def test_remote_workers_join_with_loopback_hostnames_and_match_the_static_run(hosts,
                                                                              static_ledger):
    job = ledger_job(hosts, "join")
    for h in (1, 2):
        job.add_worker(hosts.host(h))
    wait_for(lambda: job.world() == 3, "three workers training", timeout=180)
    out = finish(job)
    joins = [e for e in job.events() if e["event"] == "join"]
    assert joins and all(e["steps_redone"] == 0 for e in joins), out
    assert "generation 4" not in out  # one or two joins, not a loop of re-formations
    assert_exactly_once(job.out)
    assert max_param_diff(static_ledger, job.out) == 0.0


def test_a_worker_its_peers_cannot_reach_is_told_why_and_the_job_goes_on(hosts, static_ledger):
    job = ledger_job(hosts, "unreachable")
    bad = job.add_worker(hosts.host(1), "--advertise-address", "127.0.1.1")
    job.add_worker(hosts.host(2))
    assert bad.wait(180) == 1
    said = bad.text()
    assert "its peers cannot reach it at 127.0.1.1:" in said, said[-2000:]
    assert "w0 could not connect to 127.0.1.1:" in said and "Connection refused" in said
    assert "--advertise-address" in said  # how to fix it
    wait_for(lambda: job.world() == 2, "the other two training", timeout=180)
    out = finish(job)
    assert "removed: its peers cannot reach it at 127.0.1.1" in out
    assert_exactly_once(job.out)
    assert max_param_diff(static_ledger, job.out) == 0.0
