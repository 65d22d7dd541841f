"""Jobs across hosts (network namespaces of ``dyntrain.testing.hosts``): each host has its own
address, a hostname that resolves to 127.0.1.1, its own disk; no environment variable tells
the product anything. The run folder is the bed's shared folder (a shared file system)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import SCRIPTS
from dyntrain.elastic.protocol import FAILURE_TIMEOUT
from dyntrain.errors import EXIT_USAGE
from dyntrain.testing.jobs import HostJob
from dyntrain.testing.wait import wait_until
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


def wait_job_rows(job: HostJob, row_matches, what: str, timeout: float) -> None:
    """Wait for a metrics row that ``row_matches``; a timeout shows the last rows' world
    sizes, chunks and step times."""
    try:
        wait_until(lambda: any(row_matches(r) for r in job.metrics()), what, timeout=timeout)
    except TimeoutError as exc:
        rows = [(r["step"], r["world_size"], r["chunks"], r.get("samples_per_s"))
                for r in job.metrics()][-12:]
        raise TimeoutError(f"{exc}; last rows (step, world, chunks, samples/s): {rows}") from None


def finish(job: HostJob, timeout: float = 240) -> str:
    job.gate.unlink()
    code = job.wait(timeout)
    out = job.launcher.text()
    assert code == 0, out[-3000:]
    return out


def test_remote_workers_join_and_a_partitioned_one_is_found_by_its_silence(hosts,
                                                                          static_ledger):
    # hosts 1 and 2 resolve their names to 127.0.1.1: they must advertise their own address
    job = ledger_job(hosts, "join")
    for h in (1, 2):
        job.add_worker(hosts.host(h))
    wait_until(lambda: job.world() == 3, "three workers training", timeout=180)
    joins = [e for e in job.events() if e["event"] == "join"]
    assert joins and all(e["steps_redone"] == 0 for e in joins)
    assert "generation 4" not in job.launcher.text()  # one or two joins, not a livelock
    # four busy loops per core: live workers keep their heartbeat within the default timeout
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(8)]
    try:
        steps = len(job.metrics())
        wait_until(lambda: len(job.metrics()) >= steps + 20, "steps under contention", timeout=180)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    assert "crash" not in [e["event"] for e in job.events()], job.launcher.text()[-3000:]
    hosts.partition(2)
    crash = wait_until(lambda: next((e for e in job.events() if e["event"] == "crash"), None),
                       "the partitioned worker declared lost", timeout=120)
    assert crash["workers"][0].startswith("host2-")
    assert crash["reason"] == f"no heartbeat for {FAILURE_TIMEOUT:g} s"
    finish(job)
    assert job.world() == 2
    assert_exactly_once(job.out)
    assert max_param_diff(static_ledger, job.out) == 0.0


def test_a_worker_its_peers_cannot_reach_is_told_why_and_the_job_goes_on(hosts, static_ledger):
    job = ledger_job(hosts, "unreachable")
    bad = job.add_worker(hosts.host(1), "--advertise-address", "127.0.1.1")
    job.add_worker(hosts.host(2))
    assert bad.wait(180) == EXIT_USAGE, bad.text()[-3000:]  # a setting the user fixes
    said = bad.text()
    assert "its peers cannot reach it at 127.0.1.1:" in said, said[-2000:]
    # the peer that reports it is whichever tried to connect (rank order: who said hello first,
    # which the load of the machine decides)
    assert re.search(r"\b\w+ could not connect to 127\.0\.1\.1:\d+: [^)]*Connection refused",
                     said), said[-2000:]
    assert "--advertise-address" in said  # how to fix it
    wait_until(lambda: job.world() == 2, "the other two training", timeout=180)
    out = finish(job)
    assert "removed: its peers cannot reach it at 127.0.1.1" in out
    assert_exactly_once(job.out)
    assert max_param_diff(static_ledger, job.out) == 0.0


def test_a_host_behind_a_slow_link_keeps_training_and_balancing_stays_bitwise(hosts,
                                                                            static_ledger):
    # host 1: 100 Mbit/s both ways (tbf) and chunks 10x slower; 8 MB of optimizer state that
    # only travels make its hand-over take the link's time
    hosts.slow_link(1, rate="100mbit")
    job = ledger_job(hosts, "slow", args=("--ballast-mb", "8", "--step-delay", "0.02",
                                          "--slow-in", "host:host1", "--slow-factor", "10",
                                          "--slow-only-held"))
    # host 0's own worker trains first, so host 1's joins it as rank 1 (the rows' chunks are by
    # rank; host 1's worker would be rank 0 if it said hello first)
    wait_until(lambda: job.world() == 1, "host 0's worker training", timeout=180)
    job.add_worker(hosts.host(1))
    wait_until(lambda: job.world() == 2, "the slow host training", timeout=180)
    # while the job is held, host 1's chunks sleep 0.25 s and host 0's 0.07 s. The balancer
    # moves a chunk only for a step 10% shorter, so with 8 chunks it needs host 1 at least
    # ~1.4x slower as measured: CPU contention adds the same to both (up to ~0.35 s a chunk
    # here), which a smaller difference (0.13 against 0.06 s) does not outweigh at load 10
    wait_job_rows(job, lambda r: r["world_size"] == 2 and r["chunks"][0] > r["chunks"][1],
                  "host 1 given fewer chunks", timeout=180)
    # released, host 1 is as fast as host 0 for the remaining ~200 steps
    finish(job)
    [join] = [e for e in job.events() if e["event"] == "join"]
    assert join["state_sync_s"] >= 8 * 2**20 * 8 / 100e6 * 0.9  # it went over the slow link
    assert [e["event"] for e in job.events()] == ["start", "join"]  # nobody was evicted
    rows = [r for r in job.metrics() if r["world_size"] == 2]
    assert any(r["chunks"][0] > r["chunks"][1] for r in rows), "host 1 never got fewer chunks"
    assert all(sum(r["chunks"]) == 8 for r in rows)
    assert_exactly_once(job.out)
    assert max_param_diff(static_ledger, job.out) == 0.0


def test_a_sharded_jobs_copies_live_on_two_hosts_so_losing_one_loses_nothing(hosts, tmp_path):
    """Level 1, ``r = 2``, two workers on each of two hosts: the plan puts a tensor's two
    copies on different hosts (each member's failure domain is the address it advertises), so
    when host 1 vanishes with both of its workers no shard is lost: the survivors go on from
    the state they hold, without a checkpoint, and end bitwise the unsharded static run.
    Without failure domains some tensors' both copies were on host 1 (``test_shardplan``)."""
    from concurrent.futures import ThreadPoolExecutor

    from test_gpt_workload import SMALL
    from test_sharded import _same_final, _static_run

    # 120 steps: while held (each chunk 0.5 s longer), at least 1 s a step at world 2, so the
    # remote workers have two minutes to start and join on a loaded machine before the job
    # could end (with SMALL's 20 steps it once ended at world 2, under load, before they had)
    args = [*SMALL, "--max-steps", "120"]
    # the static reference is made while the job waits for the remote workers to start
    with ThreadPoolExecutor(1) as pool:
        static = pool.submit(_static_run, tmp_path / "static", args)
        _lose_a_host_of_a_sharded_job(hosts, args)
        _same_final(static.result(), hosts.shared / "sharded")


def _lose_a_host_of_a_sharded_job(hosts, args) -> None:
    """The sharded job of ARGS on hosts 0 and 1 (two workers each) until host 1 is lost, then to
    its end at world 2, in the bed's folder ``sharded``."""
    hold = hosts.shared / "sharded.hold"
    hold.touch()
    job = HostJob(hosts.host(0), hosts.shared / "sharded",
                  [SCRIPTS / "gpt_held.py", hold, *args, "--shard", "1"],
                  ["--workers", "2:4", "--nproc", "2"])
    remote = [job.add_worker(hosts.host(1)) for _ in range(2)]
    try:
        wait_until(lambda: job.world() == 4, "two workers on each host training", timeout=180)
    except TimeoutError as exc:
        said = "\n".join(w.text()[-1500:] for w in remote)
        raise TimeoutError(f"{exc}; worlds {sorted({r['world_size'] for r in job.metrics()})}"
                             f"\nlauncher: {job.launcher.text()[-2000:]}\nhost 1: {said}") from None
    hosts.lose(1)
    wait_until(lambda: any(e["event"] == "crash" for e in job.events()),
               "host 1's workers declared lost", timeout=120)
    hold.unlink()
    assert job.wait(240) == 0, job.launcher.text()[-3000:]
    out = job.launcher.text()
    assert "lost the optimizer state" not in out, out[-3000:]
    events = job.events()
    lost = {w for e in events if e["event"] == "crash" for w in e["workers"]}
    assert len(lost) == 2 and all(w.startswith("host1-") for w in lost), events
    assert "resume" not in [e["event"] for e in events], events  # no checkpoint was read
    assert job.world() == 2
