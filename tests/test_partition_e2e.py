"""A worker that was cut off and comes back changes nothing: real processes, real gloo, signals,
real network partitions.

A member is frozen (SIGSTOP) for longer than the failure timeout while its generation sums a
step with it: the others find its heartbeat gone, abandon the generation and train on without
it. Then it wakes up (SIGCONT) in the middle of the collectives it was frozen in, while the
others train. Nothing it sends may reach them (before the fence, it changed the survivors'
gradients: max |diff| 166 and 758 against the static run in two trials), and it may write
nothing: the job ends bitwise equal to the static run with every sample applied exactly once. The
woken worker learns that it was declared dead and starts over as a new worker, re-admitted with
the state handed over afresh.

The same across hosts (network namespaces, ``dyntrain.testing.hosts``): the link of a worker's
host, of the leader's host, or of the coordinator's own host goes down for longer than the
failure timeout while its workers live, and comes back while the others train.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DYNTRAIN, ROOT, SCRIPTS, read_jsonl
from dyntrain.testing.jobs import CLI, HostJob, Output, clean_env
from dyntrain.testing.wait import wait_until
from test_elastic_e2e import assert_exactly_once, max_param_diff, world_sizes

pytestmark = pytest.mark.slow

LEDGER = str(SCRIPTS / "ledger_train.py")
HOSTS = 3  # for the hostbed fixture


def rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return read_jsonl(path) if path.exists() else []


def events(out: Path) -> list[dict]:
    path = out / "events.jsonl"
    return read_jsonl(path) if path.exists() else []


def readmitted(job_events: list[dict], cut: list[str]) -> bool:
    """Whether every worker of ``cut`` has joined again as a new worker."""
    joined = {w for e in job_events if e["event"] == "join" for w in e["workers"]}
    return {f"{w}.r1" for w in cut} <= joined


def test_a_frozen_worker_that_comes_back_is_fenced_and_rejoins(tmp_path, static_ledger):
    out, hold = tmp_path / "run", tmp_path / "hold"
    hold.touch()  # each chunk takes 50 ms more until the test has seen the re-admission
    script = [LEDGER, "--slow-while", str(hold)]
    # the frozen one joins with `dyntrain worker` (a local worker found dead is killed by the
    # launcher)
    launcher = subprocess.Popen(
        [*DYNTRAIN, "run", "--workers", "1:2", "--nproc", "1", "--failure-timeout", "2",
         "--out", str(out), *script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, cwd=ROOT)
    procs = [launcher]
    try:
        address = re.search(r"--coordinator (\S+)", launcher.stdout.readline()).group(1)
        with open(tmp_path / "cut.log", "w") as log:
            cut = subprocess.Popen([*DYNTRAIN, "worker", "--coordinator", address, *script],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        procs.append(cut)
        wait_until(lambda: any(r["world_size"] == 2 for r in rows(out)), "a step of world 2")
        os.kill(cut.pid, signal.SIGSTOP)
        crash = wait_until(lambda: [e for e in events(out) if e["event"] == "crash"],
                           "the others to go on without the frozen worker")[0]
        seen = len(rows(out))
        wait_until(lambda: len(rows(out)) >= seen + 2, "two steps without it")
        os.kill(cut.pid, signal.SIGCONT)
        wait_until(lambda: readmitted(events(out), crash["workers"]) or cut.poll() is not None,
                   "the woken worker to be re-admitted (or to end)", timeout=180)
        hold.unlink()
        rest = launcher.communicate(timeout=240)[0]
        cut.wait(timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert launcher.returncode == 0, rest[-3000:]
    assert_exactly_once(out)
    assert max_param_diff(static_ledger, out) == 0.0
    woke = (tmp_path / "cut.log").read_text()
    assert cut.returncode == 0, woke[-3000:]
    again = f"{crash['workers'][0]}.r1"
    assert "was declared dead (no heartbeat for 2 s) while it was cut off" in woke, woke[-2000:]
    assert f"starting over as the new worker {again}" in woke
    assert [e["event"] for e in events(out)] == ["start", "join", "crash", "join"]
    assert readmitted(events(out), crash["workers"])
    assert 2 in world_sizes(out)[2:]  # trained on together after the re-admission


def host_job(hosts, name: str, *run_args: str, remote: tuple[int, ...] = (1, 2),
             workload: tuple[str, ...] = ()) -> HostJob:
    """The ledger workload (with ``workload``'s flags) launched on host 0 (failure timeout
    2 s), its run folder in the bed's shared folder, held slow (each chunk 50 ms longer) until
    the test removes ``job.gate``, and ``dyntrain worker`` on each host of ``remote``. The
    workers start with the launcher, not after it: the port is picked beforehand on host 0
    (its own network), so that they import torch while it does."""
    gate = hosts.shared / f"{name}.hold"
    gate.touch()
    home = hosts.host(0)
    port = home.run([sys.executable, "-c", "import socket; s = socket.socket(); "
                     "s.bind(('', 0)); print(s.getsockname()[1])"], check=True).stdout.strip()
    job = HostJob(home, hosts.shared / name, [LEDGER, "--slow-while", gate, *workload],
                  ["--port", port, "--workers", "1:3", "--failure-timeout", "2", *run_args])
    job.gate, job.remote, job.command_port = gate, {}, int(port)
    for index in remote:
        job.remote[index] = Output(hosts.host(index).popen(
            [*CLI, "worker", "--coordinator", f"{home.address}:{port}", "--connect-timeout",
             "180", *job.command], env=clean_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
        job.workers.append(job.remote[index])
    return job


def host_of(worker: str) -> int:
    """The host index of a ``dyntrain worker`` id (``host2-4242`` -> 2)."""
    return int(worker.split("-")[0].removeprefix("host"))


def worker_on(job: HostJob, host) -> str:
    """The id of the worker that joined from ``host`` (``dyntrain worker``: host-pid)."""
    return wait_until(lambda: next((w for e in job.events() for w in e["workers"]
                                  if w.startswith(f"{host.name}-")), None),
                      f"the worker of {host.name} to join", timeout=180)


def partition_and_heal(hosts, job: HostJob, index: int, cut: list[str]) -> None:
    """Take host ``index`` off the network until the others went on without ``cut`` (their
    heartbeats stopped) and trained two steps, then bring it back; wait until each worker of
    ``cut`` has been re-admitted as a new worker (or its process ended)."""
    hosts.partition(index)
    try:
        wait_until(lambda: set(cut) <= {w for e in job.events() if e["event"] == "crash"
                                      for w in e["workers"]},
                   "the others to go on without the cut-off workers", timeout=180)
        seen = len(job.metrics())
        wait_until(lambda: len(job.metrics()) >= seen + 2, "two steps without them", timeout=180)
    finally:
        hosts.heal(index)
    wait_until(lambda: readmitted(job.events(), cut) or all(
        job.remote[host_of(w)].proc.poll() is not None for w in cut),
        "the cut-off workers to be re-admitted (or to end)", timeout=240)


def assert_healed_like_static(job: HostJob, cut: list[str], static_ledger) -> None:
    job.gate.unlink()
    code = job.wait(240)
    said = job.launcher.text()
    assert code == 0, said[-3000:]
    codes = [worker.wait(120) for worker in job.workers]
    assert_exactly_once(job.out)
    assert max_param_diff(static_ledger, job.out) == 0.0
    woken = "\n".join(w.text() for w in job.workers)
    assert codes == [0] * len(codes), woken[-3000:]
    for worker in cut:
        assert f"worker {worker} was declared dead" in woken, woken[-3000:]
        assert f"starting over as the new worker {worker}.r1" in woken
    assert readmitted(job.events(), cut)


def test_partition_and_heal_of_a_workers_host_in_a_sharded_job(hosts, static_ledger):
    """ZeRO-2 with r = 2 on three hosts: the cut-off worker's shards have copies elsewhere, so
    the others go on without it and without a checkpoint; healed, its process (alive all the
    while) rejoins as a new worker and receives its shards again. The model is the unsharded
    static run's, bit for bit: nothing of the abandoned generation lands anywhere."""
    job = host_job(hosts, "sharded", "--nproc", "1", workload=("--shard", "2"))
    wait_until(lambda: job.world() == 3, "three workers training", timeout=180)
    cut = [worker_on(job, hosts.host(2))]
    partition_and_heal(hosts, job, 2, cut)
    assert_healed_like_static(job, cut, static_ledger)
    said = job.launcher.text() + "\n".join(w.text() for w in job.workers)
    assert "lost the optimizer state" not in said, said[-3000:]


def test_partition_and_heal_of_the_leaders_host_then_of_a_workers_host(hosts, static_ledger):
    """The leader's host is cut off and heals; then, in the same job, the other remote worker's
    host (a worker that is not the leader, or the leader the first heal left it to be)."""
    # a remote worker starts the job (the leader: whichever said hello first); the launcher's
    # own worker joins then
    job = host_job(hosts, "leader", "--nproc", "0", "--events", "t=0:join=1")
    wait_until(lambda: job.world() == 3, "three workers training", timeout=180)
    leader = job.events()[0]["workers"][0]
    assert host_of(leader) in (1, 2), leader
    partition_and_heal(hosts, job, host_of(leader), [leader])
    wait_until(lambda: job.world() == 3, "three workers training again", timeout=180)
    other = 3 - host_of(leader)
    worker = worker_on(job, hosts.host(other))
    partition_and_heal(hosts, job, other, [worker])
    assert_healed_like_static(job, [leader, worker], static_ledger)


def test_partition_and_heal_of_the_coordinators_host(hosts, static_ledger):
    # the coordinator and its local worker on host 0; both remote workers lose them (and
    # still reach each other)
    job = host_job(hosts, "coordinator", "--nproc", "1")
    wait_until(lambda: job.world() == 3, "three workers training", timeout=180)
    cut = [worker_on(job, hosts.host(1)), worker_on(job, hosts.host(2))]
    partition_and_heal(hosts, job, 0, cut)
    assert_healed_like_static(job, cut, static_ledger)


def test_the_launchers_host_lost_for_good_a_worker_hosts_the_coordinator(hosts, static_ledger):
    """``--takeover``: the launcher's host (the coordinator, its store and a local worker) is
    cut off and its processes SIGKILLed mid-run. The workers of the other two hosts agree
    without a store on the first of them in rank order to host a new coordinator on its own
    host at the old port, re-attach to it, and finish the job on their own, bitwise the static
    run, every sample applied once."""
    job = host_job(hosts, "takeover", "--nproc", "1", "--takeover")
    wait_until(lambda: job.world() == 3, "three workers training", timeout=180)
    first = events(job.out)[0]["generation"]
    hosts.lose(0)
    job.gate.unlink()
    codes = [worker.wait(240) for worker in job.workers]
    said = "\n".join(w.text() for w in job.workers)
    assert codes == [0, 0], said[-3000:]
    record = json.loads((job.out / "coordinator.json").read_text())
    successor = hosts.host(host_of(record["by"]))
    assert record["epoch"] == 1 and successor.index in (1, 2), record
    assert record["address"] == f"{successor.address}:{job.command_port}", record
    log = successor.path(f"/tmp/dyntrain-successor-{record['by']}.log")
    try:
        wait_until(lambda: "job done" in log.read_text(), "the successor's coordinator to end",
                   timeout=120)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{log.read_text()[-4000:]}") from None
    assert_exactly_once(job.out)
    assert max_param_diff(static_ledger, job.out) == 0.0
    seen = events(job.out)
    assert "reattach" in [e["event"] for e in seen], seen
    assert job.world() == 2 and first is not None
    assert "w0 lost: lost with the coordinator's host" in log.read_text()
