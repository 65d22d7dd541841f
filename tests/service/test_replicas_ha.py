"""Several `dyntrain server` replicas on one PostgreSQL: one leads, another takes over.

The lease and its fencing are tested on the store of a real PostgreSQL: two replicas' election
rounds with clocks two hours apart, a write of a stale epoch, a leader frozen inside a
transaction (the database ends it, the takeover goes on, nothing of it is committed) and a
renewal that its own leader's writes never hold up. The takeover is tested with three real
server processes sharing one state directory and one database: the leader SIGKILLed while an
elastic and a plain job run and another is submitted meanwhile (bitwise the static run, nothing
run twice, boto3 against a replica that does not lead); the new leader frozen (SIGSTOP) until
another leads and let go on (SIGCONT): it finds its lease gone and stops acting, a terminate
sent to it reaches the leader, the CLI asks the next URL, the dashboard shows who leads; and
the other replicas lost, then the leader restarted: nothing lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
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
        self.clock, self.offset = clock, offset

    def __call__(self) -> float:
        return self.clock() + self.offset


def test_ha_lease_follows_the_databases_clock_not_the_hosts(pg_db):
    """Two replicas whose clocks differ by two hours: the first takes the lease and renews
    it, the second never takes it while it is renewed, and takes it (epoch 2) once the first
    stops renewing for longer than the ttl; the first then finds it gone."""
    ahead = Store(pg_db, clock=Skewed(time.time, 3600.0))
    behind = Store(pg_db, clock=Skewed(time.time, -3600.0))
    ahead.create_all()
    # a ttl well above a loaded test process's stalls: a renewal late by more than the ttl is
    # a lapse (the lease is then rightly taken again, at the next epoch)
    config = dict(ttl_seconds=3.0, renew_seconds=0.2)
    a = Leadership(ahead, LeaseConfig("a", "http://a", **config),
                   monotonic=Skewed(time.monotonic, 3600.0))
    b = Leadership(behind, LeaseConfig("b", "http://b", **config),
                   monotonic=Skewed(time.monotonic, -3600.0))
    try:
        assert a.claim() == 1 and b.claim() is None
        # renewed every 0.2 s for more than twice the ttl: never taken over meanwhile
        started = time.monotonic()

        def renewed_long_enough():
            assert a.claim() == 1, "the leader lost a lease it renews"
            assert b.claim() is None, "taken over while renewed"
            return time.monotonic() - started >= 6.5

        wait_until(renewed_long_enough, "the lease renewed for 6.5 s", 60, 0.2, 0.2)
        took = wait_until(b.claim, "the lease to lapse and be taken over", 20, 0.1)
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


def test_ha_a_leader_frozen_inside_a_transaction_does_not_block_the_takeover(pg_db):
    """The frozen leader's transaction holds the lease row's share lock: the database ends it
    after the idle timeout, the other replica takes the lease over, and the frozen write,
    resumed, is not committed."""
    old, new = Store(pg_db, idle_transaction_ms=500), Store(pg_db)
    old.create_all()
    frozen, outcome = threading.Event(), []

    def leader_step() -> None:
        try:
            with fence(old, "old", 1), old.batch():
                old.logs.add_event(None, "frozen", {"by": "old"})
                frozen.wait(60)  # SIGSTOPped here, inside the transaction
        except Exception as exc:
            outcome.append(exc)

    try:
        old.leases.claim("old", None, ttl=1.0, epoch=None)
        step = threading.Thread(target=leader_step)
        step.start()
        took = wait_until(lambda: new.leases.claim("new", None, ttl=60.0, epoch=None),
                          "the lease to be taken over", 30, 0.2)
        assert took.epoch == 2
        frozen.set()  # SIGCONT: its commit finds its session ended
        step.join(30)
        assert outcome, "the frozen transaction committed"
        assert [e.kind for e in new.logs.list_events(None)].count("frozen") == 0
    finally:
        frozen.set()
        old.close()
        new.close()


def test_ha_the_leaders_own_writes_never_hold_up_its_renewal(pg_db):
    store = Store(pg_db)
    store.create_all()
    inside, done = threading.Event(), threading.Event()

    def leader_step() -> None:
        with fence(store, "lead", 1), store.batch():
            store.logs.add_event(None, "step", {})
            inside.set()
            done.wait(60)  # a long step: its transaction holds the lease row's share lock

    step = threading.Thread(target=leader_step)
    try:
        store.leases.claim("lead", None, ttl=60.0, epoch=None)
        step.start()
        assert inside.wait(30)
        renewed = []
        renew = threading.Thread(target=lambda: renewed.append(
            store.leases.claim("lead", None, ttl=60.0, epoch=1)))
        renew.start()
        renew.join(30)
        assert renewed and renewed[0].epoch == 1, "the renewal waited for the leader's own step"
    finally:
        done.set()
        step.join(30)
        store.close()


def test_ha_replicas_on_sqlite_are_refused_in_one_line(tmp_path):
    proc = cli("server", "--replica", "--port", "0", "--state-dir", tmp_path / "state")
    assert_one_line_error(proc, "several replicas need PostgreSQL")


# ---- three server processes on one database and one state directory --------------------------

PLAIN = """import os, sys, time
open(sys.argv[1], "a").write(f"{os.getpid()}\\n")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
"""
SMALL = {"cpus": 0.25, "memory_mib": 128}


class Replicas:
    """Three `dyntrain server --replica` processes: their processes, URLs and logs."""

    def __init__(self, tmp, db: str) -> None:
        self.tmp, self.db, self.state = tmp, db, tmp / "state"
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []
        with ThreadPoolExecutor(3) as pool:  # their start-ups overlap
            started = [pool.submit(self.start, i) for i in range(3)]
        failed = [f.exception() for f in started if f.exception() is not None]
        for f in started:
            if f.exception() is None:
                proc, url = f.result()
                self.procs.append(proc)
                self.urls.append(url)
        if failed:
            self.stop()
            raise failed[0]

    def start(self, i: int) -> tuple[subprocess.Popen, str]:
        return start_server(self.state, self.tmp / f"replica-{i}.log", "--replica", "--db",
                            self.db, "--warm-workers", "0")  # the default lease: ttl 5 s

    def live(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.poll() is None]

    def health(self, i: int) -> dict | None:
        try:
            return httpx.get(f"{self.urls[i]}/health", timeout=1).json()
        except httpx.HTTPError:
            return None

    def leader(self, among: list[int] | None = None) -> int | None:
        for i in self.live() if among is None else among:
            if (self.health(i) or {}).get("leader"):
                return i
        return None

    def wait_leader(self, among: list[int] | None = None) -> int:
        """The replica that leads (of ``among``), once one does."""
        return wait_until(lambda: self.leader(among), "a replica to lead", 60,
                          until=lambda i: i is not None)

    def log(self, i: int) -> str:
        return (self.tmp / f"replica-{i}.log").read_text()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, pg_server):
    name = f"ha_{uuid.uuid4().hex[:12]}"
    db = create_database(pg_server, name)
    bed = Replicas(tmp_path_factory.mktemp("replicas"), db)
    try:
        with Client(bed.urls[-1]) as client:  # any replica takes every request
            client.create_compute_environment(
                name="ha", capacity_type="ON_DEMAND", price_per_slot_hour=0.0, min_slots=0,
                desired_slots=8, max_slots=8, slot=SMALL)
            client.create_job_queue(name="ha", priority=10, compute_environments=["ha"])
        yield bed
    finally:
        bed.stop()
        drop_database(pg_server, name)
    for i in range(3):
        assert "Traceback" not in bed.log(i), bed.log(i)[-3000:]


def workers_of(state, job_id: str) -> list[int]:
    """The pids of a job's workers, from the supervisors' journals of what they started."""
    return [record["pid"]
            for path in (state / "executor" / "workers").glob("supervisor-*.started")
            for line in path.read_text().splitlines()
            if (record := json.loads(line))["id"].startswith(job_id.replace(":", "_") + "-")]


def ended(client: Client, job_id: str) -> dict | None:
    job = client.get_job(job_id)
    return job if job["status"] in ("SUCCEEDED", "FAILED") else None


@pytest.mark.slow
def test_ha_leader_sigkilled_another_leads_and_no_job_is_lost_or_run_twice(replicas, tmp_path):
    static = subprocess.Popen(DIGITS, env=pinned_env(_env(), DYNTRAIN_OUT=str(tmp_path / "s")),
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=ROOT)
    lead = replicas.wait_leader()
    epoch = replicas.health(lead)["epoch"]
    others = [i for i in replicas.live() if i != lead]
    starts, release = tmp_path / "starts", tmp_path / "release"
    with Client(replicas.urls[others[0]]) as client:  # any replica takes every request
        elastic = client.submit(queue="ha", command=DIGITS + STEP_DELAY,
                                workers={"min": 2, "max": 2}, resources=SMALL)["id"]
        plain = client.submit(queue="ha", command=[PY, "-c", PLAIN, str(starts), str(release)],
                              resources=SMALL)["id"]
    run = replicas.state / "runs" / "jobs" / elastic
    wait_until(lambda: starts.exists() and (run / "metrics.jsonl").exists()
               and len(read_jsonl(run / "metrics.jsonl")) >= 5, "both jobs to run", 180)

    replicas.procs[lead].kill()  # the leader's coordinator and scheduler die with it
    killed = time.monotonic()
    replicas.procs[lead].wait()
    trainers = workers_of(replicas.state, elastic)
    assert len(trainers) == 2
    for pid in trainers:  # the job must not end before the takeover, however slow
        os.killpg(pid, signal.SIGSTOP)
    urls = ",".join([replicas.urls[lead], *(replicas.urls[i] for i in others)])
    with Client(urls) as client:  # the dead one first: the next one answers
        queued = client.submit(queue="ha", command=[PY, "-c", "pass"], resources=SMALL)["id"]
        assert client.base_url != replicas.urls[lead]
    new = replicas.wait_leader(others)
    took = time.monotonic() - killed
    wait_until(lambda: "re-attach to its coordinator" in replicas.log(new),
               "the new leader to host the elastic job's coordinator", 60)
    for pid in trainers:
        os.killpg(pid, signal.SIGCONT)
    assert took < TAKEOVER_S, f"the takeover took {took:.1f} s"
    assert replicas.health(new)["epoch"] == epoch + 1
    assert [replicas.health(i)["leader"] for i in others].count(True) == 1

    release.touch()
    with Client(urls) as client:
        final = {j: wait_until(lambda j=j: ended(client, j), f"job {j} to end", 240)
                 for j in (elastic, plain, queued)}
    for job in final.values():
        assert job["status"] == "SUCCEEDED", job["status_reason"]
        assert job["attempts"] == 1 and job["preemptions"] == 0
    assert len(starts.read_text().splitlines()) == 1, "the plain job ran twice"

    events = read_jsonl(run / "events.jsonl")
    assert [e["event"] for e in events] == ["start", "reattach"], events
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl")]
    assert sorted(steps) == list(range(1, 89)), "every step once, none lost, none redone"
    assert static.wait(timeout=180) == 0
    ours = torch.load(run / "final.pt", weights_only=True)
    theirs = torch.load(tmp_path / "s" / "final.pt", weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "not bitwise equal"

    survivor = next(i for i in others if i != new)  # AWS Batch's API on one that does not lead
    batch = boto3.client("batch", endpoint_url=replicas.urls[survivor], region_name="eu-west-1",
                         aws_access_key_id="ha", aws_secret_access_key="ha")
    described = batch.describe_jobs(jobs=[elastic, plain, queued])["jobs"]
    assert {j["jobId"]: j["status"] for j in described} == dict.fromkeys(final, "SUCCEEDED")


@pytest.mark.slow
def test_ha_a_frozen_leader_finds_its_lease_gone_and_stops_acting(replicas, tmp_path):
    lead = replicas.wait_leader()
    epoch = replicas.health(lead)["epoch"]
    others = [i for i in replicas.live() if i != lead]
    replicas.procs[lead].send_signal(signal.SIGSTOP)  # frozen, or cut off: it cannot tell
    try:
        new = replicas.wait_leader(others)
        starts, release = tmp_path / "starts", tmp_path / "never"
        with Client(replicas.urls[new]) as client:
            job = client.submit(queue="ha", command=[PY, "-c", PLAIN, str(starts),
                                                     str(release)], resources=SMALL)["id"]
            wait_until(starts.exists, "the new leader to start the job", 60)
    finally:
        replicas.procs[lead].send_signal(signal.SIGCONT)  # the partition heals
    now = replicas.health(new)["epoch"]
    assert now > epoch
    wait_until(lambda: replicas.log(lead).count("stops acting"), "the old leader to stop", 30)
    assert replicas.health(lead)["leader"] is False and replicas.health(lead)["epoch"] >= now
    with Client(replicas.urls[lead]) as client:  # it still answers, from the database
        client.terminate(job)  # handed to the leader, whose worker it is
        final = wait_until(lambda: ended(client, job), "the job to end", 120)
    assert final["status"] == "FAILED" and "terminated" in final["status_reason"], final
    assert final["attempts"] == 1
    assert len(starts.read_text().splitlines()) == 1, "the job ran twice"
    dead = [i for i in range(3) if replicas.procs[i].poll() is not None]
    urls = ",".join([*(replicas.urls[i] for i in dead), replicas.urls[lead]])
    shown = cli("status", job, url=urls)  # the CLI asks the next URL too
    assert shown.returncode == 0 and "FAILED" in shown.stdout, (shown.stdout, shown.stderr)
    name = replicas.urls[new].removeprefix("http://")
    page = httpx.get(f"{replicas.urls[lead]}/", timeout=10).text  # the dashboard of any replica
    assert f"<strong>{name}</strong> leads (epoch {now})" in page
    for i in dead:  # the one SIGKILLed before
        row = page.split(f'data-replica="{replicas.urls[i].removeprefix("http://")}"')[1]
        assert "not answering" in row.split("</tr>")[0]


@pytest.mark.slow
def test_ha_the_others_lost_then_the_leader_restarted_loses_nothing(replicas, tmp_path):
    lead = replicas.wait_leader()
    starts, release = tmp_path / "starts", tmp_path / "release"
    with Client(replicas.urls[lead]) as client:
        job = client.submit(queue="ha", command=[PY, "-c", PLAIN, str(starts), str(release)],
                            resources=SMALL)["id"]
        wait_until(starts.exists, "the job to start", 60)
    for i in replicas.live():  # the others first, then the leader itself
        if i != lead:
            replicas.procs[i].kill()
            replicas.procs[i].wait()
    replicas.procs[lead].kill()
    replicas.procs[lead].wait()
    replicas.procs[lead], replicas.urls[lead] = replicas.start(lead)
    assert replicas.wait_leader() == lead
    release.touch()
    with Client(replicas.urls[lead]) as client:
        final = wait_until(lambda: ended(client, job), "the job to end", 120)
        assert final["status"] == "SUCCEEDED" and final["attempts"] == 1, final["status_reason"]
        assert {j["id"] for j in client.list_jobs(queue="ha")} >= {job}
    assert len(starts.read_text().splitlines()) == 1, "the job ran twice"
