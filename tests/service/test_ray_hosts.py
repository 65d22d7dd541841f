"""The job service and a Ray cluster across hosts (network namespaces of a host bed), started as
a user starts them on separate machines: `ray start --head` on host 0 with the service, `ray
start --address HEAD:PORT` on hosts 1-3, each with its host's address as its node address and
`dyntrain_ce_*` slots. Every host's hostname resolves to 127.0.1.1 and no variable tells the
product how to connect. The state directory (and so every run folder) is in the bed's shared
folder, at the same path on every host, as a shared file system would be.

- An elastic job's coordinator, hosted by the service on host 0, is reached from the other
  hosts at host 0's address under its attempt's secret; the workers on three hosts form one
  group; the job grows onto a node that joins, shrinks when a node is cut off by the network
  (its link down: its raylet and processes live on), and ends bitwise equal to the static run.
- A plain job on a node that is cut off is retried as preempted, once per cut, never beside its
  earlier run: a short cut (the node stays in the cluster) and a long one (Ray declares the node
  dead) each end the run on the cut-off node before the retry starts, and nothing of it runs on
  when the link heals.
- A plain DDP script as a torchrun gang spans hosts: each worker of each gang is told rank 0's
  host as the main node (and the interface it reaches it through, as gloo would bind
  loopback); the gang grows onto a third host when a slot is added and shrinks to the others
  when a host is cut off, each time from the script's checkpoint.
- Workers that cannot reach the coordinator (a service told a loopback address) say where they
  tried, and the job fails after a few of them instead of starting more forever.

One Ray cluster and one service serve the module's tests; the cluster's health checks declare a
silent node dead after 15 s (1 s period, 2 s timeout, 5 misses: the README's advice) and the
service fences after 3 s (`--ray-fence-seconds 3`).
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import httpx
import pytest
import torch

from conftest import read_jsonl, start_server, stop_server
from dyntrain.service.client import Client
from dyntrain.service.executors.ray_address import driver_node_ip
from dyntrain.service.store import Store
from dyntrain.testing.hosts import HostBed
from dyntrain.testing.pgtemp import PostgresUnavailable, start_postgres
from dyntrain.testing.raycluster import LocalRayCluster
from dyntrain.testing.wait import wait_until
from test_elastic_e2e import assert_exactly_once, max_param_diff

from .test_controller import LEDGER

pytestmark = pytest.mark.slow
HOSTS = 5
HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
          "RAY_health_check_failure_threshold": "5"}
FENCE_S = 3
#: each node's custom resources: a spot slot everywhere, a `solo` slot on hosts 1 and 3
RESOURCES = {1: {"dyntrain_ce_spot": 1, "dyntrain_ce_solo": 1}, 2: {"dyntrain_ce_spot": 1},
             3: {"dyntrain_ce_spot": 1, "dyntrain_ce_solo": 1},
             4: {"dyntrain_ce_keep": 1}}  # host 4: no service, never cut (the replicas' test)


class Cluster:
    """The module's bed, Ray cluster and service, and what the tests ask of them."""

    def __init__(self, bed: HostBed, ray: LocalRayCluster, url: str, token: str, state) -> None:
        self.bed, self.ray, self.url, self.token, self.state = bed, ray, url, token, state
        self.cut: set[int] = set()  # hosts cut off since their node started

    def partition(self, i: int) -> None:
        """Cut host i off; its node is started afresh the next time a test asks for it (Ray
        may have declared it dead while its processes live on)."""
        self.cut.add(i)
        self.bed.partition(i)

    def client(self) -> Client:
        return Client(self.url, token=self.token)

    def node(self, i: int) -> None:
        """A live Ray node on host i (started again if a fault ended the last one, or if the
        host was cut off since: a node Ray declared dead stays dead though its process runs)."""
        name = f"host{i}"
        known = self.ray.nodes.get(name)
        if known is not None and known.proc.poll() is None and i not in self.cut:
            return
        if known is not None:  # a node that was cut off: the host starts afresh, like a reboot
            self.ray.stop_node(name)
            self.bed.lose(i)
            self.bed.heal(i)
        self.cut.discard(i)
        self.ray.add_node(name, 1, RESOURCES[i], host=self.bed.host(i))

    def running(self, i: int, marker: str) -> list[int]:
        """The processes of host i whose command line holds ``marker``."""
        found = []
        for pid in self.bed.host(i).pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(pid)
            except OSError:
                continue
        return found


@pytest.fixture(scope="module")
def cluster(hostbed, tmp_path_factory):
    logs = tmp_path_factory.mktemp("ray-hosts")
    ray = LocalRayCluster(head_host=hostbed.host(0), health=HEALTH)
    server = None
    try:
        ray.start()
        for i in (1, 2):
            ray.add_node(f"host{i}", 1, RESOURCES[i], host=hostbed.host(i))
        token = secrets.token_hex(16)
        state = hostbed.shared / "state"
        server, url = start_server(
            state, logs / "server.log", "--host", hostbed.host(0).address, "--token", token,
            "--executor", "ray", "--ray-address", ray.address,
            "--ray-fence-seconds", str(FENCE_S), popen=hostbed.host(0).popen, env=ray.env())
        found = Cluster(hostbed, ray, url, token, state)
        with found.client() as client:
            for name in ("spot", "solo"):
                client.create_compute_environment(
                    name=name, capacity_type="SPOT", price_per_slot_hour=0.1,
                    slot={"cpus": 1, "gpus": 0, "memory_mib": 128}, min_slots=0,
                    desired_slots=0, max_slots=16)
                client.create_job_queue(name=name, compute_environments=[name])
        yield found
    finally:
        if server is not None:
            stop_server(server)
        ray.close()


def world(run) -> int:
    """The job's world size after its latest membership change (0 before the first)."""
    try:
        events = read_jsonl(run / "events.jsonl")
    except (FileNotFoundError, ValueError):
        return 0
    return events[-1]["world_after"] if events else 0


def explain(client: Client, job_id: str) -> str:
    """How a job is doing: its status, the coordinator's last words and its last log lines."""
    job = client.get_job(job_id)
    said = [e["payload"].get("message") for e in client.events(job_id)
            if e["kind"] == "coordinator"][-8:]
    lines = [x["line"] for x in client.logs(job_id)["lines"]][-12:]
    return (f"job {job_id} {job['status']} ({job['status_reason']}); coordinator: {said}; "
            f"log: {lines}")


def wait_job(client: Client, job_id: str, condition, what: str, timeout: float):
    """``wait_until`` that says how the job is doing when it times out."""
    try:
        return wait_until(condition, what, timeout)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; {explain(client, job_id)}") from None


def ended(client: Client, job_id: str, timeout: float) -> dict:
    return wait_job(client, job_id, lambda: (j := client.get_job(job_id))["status"] in (
        "SUCCEEDED", "FAILED") and j, "the job to end", timeout)


#: run on a host: does the coordinator at ARGV[1] hold the job's keys, seen without and with
#: the attempt's secret ARGV[2]?
STORE_PROBE = """import datetime, sys
import torch.distributed as dist
from dyntrain.elastic.protocol import JOB_INFO
host, port = sys.argv[1].rsplit(":", 1)
store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=60))
print(store.check([JOB_INFO]), dist.PrefixStore(sys.argv[2], store).check([JOB_INFO]))
"""


def test_elastic_job_spans_hosts_grows_on_a_join_shrinks_on_a_partition_and_matches_static(
        cluster, static_ledger):
    c = cluster
    gate = c.bed.shared / "elastic.slow"  # while it exists each chunk takes 0.05 s longer
    gate.touch()
    with c.client() as client:
        job = client.submit(queue="spot", workers={"min": 1, "max": 3},
                            resources={"cpus": 1, "memory_mib": 128},
                            command=[sys.executable, LEDGER, "--slow-while", str(gate)])
        run = c.state / "runs" / "jobs" / job["id"]

        def grows_to(size: int, what: str, timeout: float = 240) -> None:
            wait_job(client, job["id"], lambda: world(run) == size, what, timeout)

        grows_to(2, "the job to train on hosts 1 and 2")
        # its coordinator listens on host 0's address; another host finds the job's keys
        # there under the attempt's secret only
        coordinator = json.loads((run / "coordinator.json").read_text())["address"]
        assert coordinator.startswith(f"{c.bed.host(0).address}:"), coordinator
        secret = json.loads((run / "coordinator.secret").read_text())["secret"]
        probe = c.bed.host(1).run([sys.executable, "-c", STORE_PROBE, coordinator, secret])
        assert probe.stdout.split() == ["False", "True"], probe.stderr[-2000:]
        c.node(3)  # capacity joins
        grows_to(3, "the job to grow onto host 3")
        # one worker on each host, in one group: each reached the coordinator on host 0 and
        # its peers at the address it advertised (its own host's)
        for i in (1, 2, 3):
            assert len(c.running(i, LEDGER)) == 1, f"host{i}: {c.running(i, LEDGER)}"
        c.partition(2)  # host 2 is cut off; its raylet and worker live on
        try:
            grows_to(2, "the job to re-form without host 2", 120)
            # the worker on the cut-off host is killed there by its actor (the fence)
            wait_until(lambda: not c.running(2, LEDGER), "the cut-off worker to be killed", 60)
        finally:
            c.bed.heal(2)
        gate.unlink()
        final = ended(client, job["id"], 300)
        history = client.get_job(job["id"])["attempt_history"]
    assert final["status"] == "SUCCEEDED", final["status_reason"]
    assert (final["attempts"], final["preemptions"], len(history)) == (1, 0, 1), history
    changes = [(e["event"], e["world_before"], e["world_after"])
               for e in read_jsonl(run / "events.jsonl")]
    grown = changes.index(("join", 2, 3))
    assert changes[grown + 1][1:] == (3, 2), changes  # the next change: host 2's worker cut off
    assert_exactly_once(run)
    assert max_param_diff(static_ledger, run) == 0.0


PLAIN = """import json, os, socket, sys, time
log, gate = sys.argv[1], sys.argv[2]
attempt = os.environ["DYNTRAIN_JOB_ATTEMPT"]
def note(what):
    with open(log, "a") as f:
        f.write(json.dumps({"attempt": attempt, "host": socket.gethostname(), "what": what,
                            "t": time.time()}) + "\\n")
note("start")
while not os.path.exists(gate):
    note("beat")
    time.sleep(0.05)
note("end")
"""


def test_a_plain_job_on_a_cut_off_node_is_retried_once_per_cut_and_never_runs_twice(cluster):
    c = cluster
    for i in (1, 3):  # the two nodes with a solo slot
        c.node(i)
    log, gate = c.bed.shared / "plain.jsonl", c.bed.shared / "plain.gate"
    with c.client() as client:
        job = client.submit(queue="solo", resources={"cpus": 1, "memory_mib": 128},
                            command=[sys.executable, "-c", PLAIN, str(log), str(gate)])

        def notes(attempt: int, what: str) -> list[dict]:
            rows = read_jsonl(log) if log.exists() else []
            return [n for n in rows if n["attempt"] == str(attempt) and n["what"] == what]

        def host_of(attempt: int) -> int:
            first = wait_job(client, job["id"], lambda: notes(attempt, "beat"),
                             f"attempt {attempt} to run", 240)[0]
            return int(re.fullmatch(r"host(\d)", first["host"]).group(1))

        # a short cut: the node stays in the cluster (Ray declares it dead after 15 s); its
        # actor kills the run once cut off for 3 s, and that exit, read when the link is
        # back, is a loss: the job is retried at once
        short = host_of(1)
        c.partition(short)
        try:
            wait_until(lambda: not c.running(short, str(log)), "the fence to end attempt 1", 60)
        finally:
            c.bed.heal(short)
        # a long cut: Ray declares the node dead; the service waits out the fence first
        long = host_of(2)
        c.partition(long)
        try:
            host_of(3)
            assert not c.running(long, str(log))
        finally:
            c.bed.heal(long)
        gate.touch()
        final = ended(client, job["id"], 120)
        assert final["status"] == "SUCCEEDED", final["status_reason"]
        # three runs, two of them preemptions (not counted against its one allowed attempt)
        assert (final["attempts"], final["preemptions"]) == (1, 2), final
        reasons = [a["reason"] or "" for a in client.get_job(job["id"])["attempt_history"]]
    assert len(reasons) == 3, reasons
    assert reasons[0].startswith("preempted: lost: cut off from the Ray cluster: no connection "
                                 f"to its GCS at {c.ray.address} for "), reasons
    # node or actor dead; cut while its actor was still starting, the reason names the worker
    assert re.match(r"preempted: lost: (worker \S+: )?its Ray ", reasons[1]), reasons
    # never two runs at once: each run's last sign of life came before the next one started
    for attempt in (1, 2):
        last_beat = max(n["t"] for n in notes(attempt, "beat"))
        assert last_beat < notes(attempt + 1, "start")[0]["t"], attempt
    assert [n["attempt"] for n in read_jsonl(log) if n["what"] == "end"] == ["3"]
    # the healed hosts run nothing of the earlier runs: none finishes late
    assert not c.running(short, str(log)) and not c.running(long, str(log))


def test_workers_that_cannot_reach_the_coordinator_fail_the_job_saying_where_they_tried(
        cluster, tmp_path):
    c = cluster
    for i in (1, 3):
        c.node(i)
    token = secrets.token_hex(16)
    server, url = start_server(  # a second service, told an address no other host reaches
        c.bed.shared / "state-loopback", tmp_path / "server.log", "--host",
        c.bed.host(0).address, "--token", token, "--executor", "ray", "--ray-address",
        c.ray.address, "--coordinator-host", "127.0.0.1", popen=c.bed.host(0).popen,
        env=c.ray.env())
    try:
        with Client(url, token=token) as client:
            client.create_compute_environment(
                name="spot", capacity_type="SPOT", price_per_slot_hour=0.1,
                slot={"cpus": 1, "gpus": 0, "memory_mib": 128}, min_slots=0, desired_slots=0,
                max_slots=16)
            client.create_job_queue(name="spot", compute_environments=["spot"])
            job = client.submit(queue="spot", workers={"min": 1, "max": 2},
                                resources={"cpus": 1, "memory_mib": 128},
                                environment={"DYNTRAIN_CONNECT_TIMEOUT": "5"},
                                command=[sys.executable, LEDGER])
            final = ended(client, job["id"], 180)
            workers = len({x["worker"] for x in client.logs(job["id"])["lines"]})
    finally:
        stop_server(server)
    # a try per worker it may have, not a loop ("2 worker(s) failed before the job trained",
    # or "every worker is gone" when they fail one at a time); the reason says where they tried
    assert final["status"] == "FAILED"
    assert "cannot reach the coordinator at 127.0.0.1:" in final["status_reason"], final
    assert workers <= 3, workers


PLAIN_DDP = str(Path(__file__).resolve().parent.parent / "scripts" / "plain_ddp.py")


def test_a_torchrun_gang_spans_hosts_grows_and_shrinks_without_a_cut_off_host(cluster):
    """A plain DDP script (no dyntrain import) as a torchrun gang on hosts whose hostnames
    resolve to loopback: each worker of each gang is told its gang's main node (rank 0's
    host's address, which every member reaches: not the service's, not 127.0.0.1) and the
    interface it reaches it through. The gang grows onto a third host when the environment
    offers a third slot, and when a host is cut off shrinks to the others; each gang resumes
    from the script's own checkpoint. (A shrink by capacity taken back is the same restart,
    tested on the local executor: here it would cost one more gang of cold processes.)"""
    c = cluster
    for i in (1, 2, 3):
        c.node(i)
    folder, pause = c.bed.shared / "ddp", c.bed.shared / "ddp.pause"
    pause.touch()  # no epoch starts while it exists
    address = {f"host{i}": c.bed.host(i).address for i in (1, 2, 3)}

    def gang(size: int, after: int = -1) -> tuple[int, list[dict]] | None:
        """The newest gang (restart count above ``after``) of ``size`` workers whose every
        rank started: (restart, envs)."""
        for found in sorted(folder.glob(f"env-r*-rank{size - 1}.json"), reverse=True,
                            key=lambda p: int(p.name.split("-")[1][1:])):
            restart = int(found.name.split("-")[1][1:])
            ranks = [folder / f"env-r{restart}-rank{r}.json" for r in range(size)]
            if restart > after and all(p.exists() for p in ranks) and not (
                    folder / f"env-r{restart}-rank{size}.json").exists():
                return restart, [json.loads(p.read_text()) for p in ranks]
        return None

    def epochs() -> list[dict]:
        checkpoint = folder / "checkpoint.pt"
        return torch.load(checkpoint, weights_only=True)["history"] if checkpoint.exists() \
            else []

    def formed(client: Client, job_id: str, size: int, after: int, what: str):
        """Wait for the next gang of ``size``, check what its workers were told, let it
        train an epoch, then hold it between epochs; (restart, hosts)."""
        restart, envs = wait_job(client, job_id, lambda: gang(size, after), what, 240)
        hosts = [e["host"] for e in envs]
        assert len(set(hosts)) == size, envs
        for rank, env in enumerate(envs):
            # rank 0's host is the main node; every worker is a node of its own
            assert env["MASTER_ADDR"] == address[hosts[0]] != "127.0.0.1", envs
            assert env["MASTER_PORT"] == envs[0]["MASTER_PORT"], envs
            assert (env["RANK"], env["GROUP_RANK"], env["LOCAL_RANK"]) == (str(rank),) * 2 + (
                "0",), env
            assert env["GLOO_SOCKET_IFNAME"], env
        pause.unlink()  # the gang trains across the hosts
        wait_job(client, job_id, lambda: any(
            h["restart"] == restart and h["world_size"] == size for h in epochs()),
            f"an epoch of gang {restart}", 120)
        pause.touch()
        return restart, hosts

    with c.client() as client:
        client.update_compute_environment("spot", max_slots=2)
        try:
            job = client.submit(queue="spot", workers={"min": 2, "max": 3},
                                launcher="torchrun", resources={"cpus": 1, "memory_mib": 128},
                                command=[sys.executable, PLAIN_DDP, "--epochs", "6",
                                         "--checkpoint-dir", str(folder), "--epoch-seconds",
                                         "1", "--pause-while", str(pause)])
            first, _ = formed(client, job["id"], 2, -1, "a gang on two hosts")
            client.update_compute_environment("spot", max_slots=3)  # grow
            grown, hosts = formed(client, job["id"], 3, first, "a gang on three hosts")
            cut = int(hosts[1][-1])  # rank 1's host: the gang shrinks to the other two
            c.partition(cut)
            try:
                _, envs = wait_job(client, job["id"], lambda: gang(2, grown),
                                   "a gang without the cut-off host", 240)
            finally:
                c.bed.heal(cut)
            assert f"host{cut}" not in [e["host"] for e in envs], envs
            assert envs[0]["MASTER_ADDR"] == address[envs[0]["host"]], envs
            pause.unlink()
            final = ended(client, job["id"], 240)
        finally:
            client.update_compute_environment("spot", max_slots=16)
        reasons = [a["reason"] or "" for a in client.get_job(job["id"])["attempt_history"]]
    assert final["status"] == "SUCCEEDED", (final["status_reason"], reasons)
    history = epochs()
    assert [h["epoch"] for h in history] == list(range(1, 7)), history
    assert {(h["restart"], h["world_size"]) for h in history} >= {(first, 2), (grown, 3)}
    assert all(h["resumed_from"] > 0 for h in history if h["restart"] > first), history
    assert "restart: 2 -> 3 workers (capacity added)" in reasons, reasons
    # the lost host restarted the gang: neither a failed attempt nor a preemption (a gang that
    # could not start on a node the earlier tests' cuts left starting is one, and says so).
    # Whichever notices the cut first restarts it: the worker's exit (its node lost), or a
    # scheduling pass that finds the node's capacity gone (on a loaded machine it may be first)
    assert any(re.fullmatch(r"restart: worker w\d died \(its node was lost\)", r)
               or r == "restart: 3 -> 2 workers (capacity taken back)" for r in reasons), reasons
    assert final["attempts"] == 1, final
    assert final["preemptions"] == sum(r.startswith("preempted: ") for r in reasons), reasons


def test_a_service_attaches_its_driver_to_the_raylet_of_its_own_address(hostbed):
    """Hosts that share a process table see every raylet of the machine; the driver is told
    the address this host reaches the GCS from, so it attaches to its own host's node."""
    gcs = f"{hostbed.host(0).address}:6379"
    out = hostbed.host(2).run([sys.executable, "-c", "import sys; from dyntrain.service."
                               "executors.ray_address import driver_node_ip as f; "
                               "print(f(sys.argv[1]))", gcs], check=True)
    assert out.stdout.strip() == hostbed.host(2).address
    for address in ("auto", "ray://10.1.2.3:10001", "127.0.0.1:6379"):
        assert driver_node_ip(address) is None, address


# ---- three service replicas on three hosts -----------------------------------------------------

#: put first on a replica's PYTHONPATH: its whole process's wall clock is DYNTRAIN_CLOCK_OFFSET
#: seconds off (the hosts' clocks disagree; the lease must not care)
SKEW = """import os, time
_offset = float(os.environ.get("DYNTRAIN_CLOCK_OFFSET", "0"))
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _offset
time.time_ns = lambda: _time_ns() + int(_offset * 1e9)
"""
SKEWED = {2: -3 * 3600.0, 3: 3 * 3600.0}  # host 1's clock is right, the others hours off
TAKEOVER_S = 15.0
LEASE_TTL_S = 5.0  # the default


class ReplicaSet:
    """`dyntrain server --replica` on hosts 1-3, one PostgreSQL (outside, on the bed's gateway),
    one state directory in the bed's shared folder, the module's Ray cluster."""

    def __init__(self, c: Cluster, db: str, logs: Path) -> None:
        self.c, self.db, self.logs = c, db, logs
        self.state = c.bed.shared / "state-replicas"
        self.token = secrets.token_hex(16)
        self.procs: dict[int, subprocess.Popen] = {}
        self.urls: dict[int, str] = {}
        self.aws = c.bed.shared / "aws-credentials"
        self.aws.write_text(f"[ha]\naws_access_key_id = ha\naws_secret_access_key = "
                            f"{self.token}\n")
        skew = c.bed.shared / "skew"
        skew.mkdir(exist_ok=True)
        (skew / "sitecustomize.py").write_text(SKEW)
        self.skew = skew

    def env(self, i: int) -> dict:
        env = self.c.ray.env()
        if i in SKEWED:
            env["PYTHONPATH"] = str(self.skew)
            env["DYNTRAIN_CLOCK_OFFSET"] = str(SKEWED[i])
        return env

    def start(self, i: int) -> None:
        host = self.c.bed.host(i)
        self.procs[i], self.urls[i] = start_server(
            self.state, self.logs / f"replica-{i}.log", "--replica", "--db", self.db,
            "--host", host.address, "--token", self.token, "--executor", "ray",
            "--ray-address", self.c.ray.address, "--ray-fence-seconds", str(FENCE_S),
            "--aws-credentials", str(self.aws), popen=host.popen, env=self.env(i))

    def health(self, i: int) -> dict | None:
        try:
            return httpx.get(f"{self.urls[i]}/health", timeout=1).json()
        except (httpx.HTTPError, ValueError):
            return None

    def leader(self, among) -> int | None:
        return next((i for i in among if (self.health(i) or {}).get("leader")), None)

    def wait_leader(self, among, timeout: float = 60) -> int:
        return wait_until(lambda: self.leader(among), "a replica to lead", timeout, 0.1,
                          until=lambda i: i is not None)

    def client(self, *among: int) -> Client:
        return Client(",".join(self.urls[i] for i in among), token=self.token)

    def log(self, i: int) -> str:
        return (self.logs / f"replica-{i}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def replica_set(cluster, tmp_path):
    c = cluster
    try:
        pg = start_postgres(address=c.bed.gateway)  # the hosts reach the machine there
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL not available: {exc}")
    found = None
    try:
        for i in (1, 2, 3, 4):
            c.node(i)
        found = ReplicaSet(c, pg.url, tmp_path)
        yield found
    finally:
        if found is not None:
            found.stop()
            try:  # the jobs' workers and every event, for a failure's reader
                store = Store(found.db)
                rows = [repr(w) for w in store.workers.list_workers(active=False)]
                rows += [repr(e) for e in store.logs.list_events(None, limit=10**6)]
                (tmp_path / "db.txt").write_text("\n".join(rows))
                store.close()
            except Exception as exc:
                (tmp_path / "db.txt").write_text(repr(exc))
            if (found.state / "runs").exists():  # what the jobs left, for a failure's reader
                shutil.copytree(found.state / "runs", tmp_path / "runs", dirs_exist_ok=True)
        for i in (1, 2, 3):
            c.bed.heal(i)
        pg.stop()


KEEP = """import json, os, sys, time
log, gate = sys.argv[1], sys.argv[2]
def note(what):
    with open(log, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "what": what, "t": time.time()}) + "\\n")
note("start")
while not os.path.exists(gate):
    time.sleep(0.05)
note("end")
"""


@pytest.mark.skip(reason="product gap: when the leader's host, which also runs one of the "
                  "elastic job's workers, is cut off mid-step, the workers on the other hosts "
                  "stay in that step's collective and never re-attach to the new leader's "
                  "coordinator, which starts the job afresh (no checkpoint yet); after the "
                  "second takeover the job stays RUNNING once its last worker finished")
def test_replicas_on_three_hosts_survive_a_partition_that_heals_and_a_lost_host(
        replica_set, static_ledger):
    """Three replicas on hosts 1-3 (two of them with clocks hours off), Ray nodes on hosts
    1-4: an elastic job on hosts 1-3, a plain job on host 4, a job queued behind it. The
    leader's host is cut off and healed: another leads within 15 s, the old one finds its
    lease gone and stops acting. Then the new leader's host is lost: the last replica leads
    within 15 s; the elastic job ends bitwise the static run's, the plain job ran once, the
    queued jobs start, boto3 at the survivor sees it all."""
    r, c = replica_set, replica_set.c
    # the skew reaches a replica's whole process
    probe = c.bed.host(3).run([sys.executable, "-c", "import time; print(time.time())"],
                              env=r.env(3))
    assert abs(float(probe.stdout) - time.time() - SKEWED[3]) < 60, probe
    r.start(1)
    assert r.wait_leader([1]) == 1  # the first replica leads, then the others join
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(r.start, (2, 3)))
    gate, keep_log, keep_gate = (c.bed.shared / n for n in ("ha.slow", "ha-keep.jsonl",
                                                            "ha-keep.gate"))
    gate.touch()
    with r.client(2, 3, 1) as client:  # any replica takes every request
        for name, slots in (("spot", 16), ("keep", 1)):
            client.create_compute_environment(
                name=name, capacity_type="SPOT", price_per_slot_hour=0.1,
                slot={"cpus": 1, "gpus": 0, "memory_mib": 128}, min_slots=0,
                desired_slots=0, max_slots=slots)
            client.create_job_queue(name=name, compute_environments=[name])
        elastic = client.submit(queue="spot", workers={"min": 1, "max": 3},
                                resources={"cpus": 1, "memory_mib": 128},
                                command=[sys.executable, LEDGER, "--slow-while", str(gate)])["id"]
        plain = client.submit(queue="keep", resources={"cpus": 1, "memory_mib": 128},
                              command=[sys.executable, "-c", KEEP, str(keep_log),
                                       str(keep_gate)])["id"]
        queued = [client.submit(queue="keep", resources={"cpus": 1, "memory_mib": 128},
                                command=[sys.executable, "-c", "pass"])["id"]]
        run = r.state / "runs" / "jobs" / elastic
        wait_job(client, elastic, lambda: world(run) == 3 and keep_log.exists(),
                 "the elastic job on hosts 1-3 and the plain job on host 4", 240)
        assert r.health(1)["epoch"] == 1 and r.leader((1, 2, 3)) == 1  # never taken early

        # a partition that heals: the leader's host is cut off, its processes alive
        c.partition(1)
        cut = time.monotonic()
        try:
            second = r.wait_leader((2, 3), TAKEOVER_S + 30)
            took = time.monotonic() - cut
        finally:
            c.bed.heal(1)
        assert LEASE_TTL_S - 1.5 < took < TAKEOVER_S, f"the takeover took {took:.1f} s"
        assert r.health(second)["epoch"] == 2
        wait_until(lambda: "stops acting" in r.log(1), "the old leader to stop acting", 60)
        assert r.health(1) == {**r.health(1), "leader": False, "epoch": 2}
        assert r.procs[1].poll() is None, r.log(1)[-3000:]
        wait_job(client, elastic, lambda: "re-attach to its coordinator" in r.log(second),
                 "the new leader to host the elastic job's coordinator", 60)

        # the new leader's host is lost: cut off, every process SIGKILLed
        c.cut.add(second)
        c.bed.lose(second)
        lost = time.monotonic()
        survivors = [1, next(i for i in (2, 3) if i != second)]
        queued.append(client.submit(queue="keep", resources={"cpus": 1, "memory_mib": 128},
                                    command=[sys.executable, "-c", "pass"])["id"])
        third = r.wait_leader(survivors, TAKEOVER_S + 30)  # the healed one may lead again
        took_again = time.monotonic() - lost
        assert took_again < TAKEOVER_S, f"the second takeover took {took_again:.1f} s"
        assert [r.health(i)["epoch"] for i in survivors] == [3, 3]
        assert [r.health(i)["leader"] for i in survivors].count(True) == 1
        wait_job(client, elastic, lambda: "re-attach to its coordinator" in r.log(third),
                 "the last replica to host the elastic job's coordinator", 60)
        gate.unlink()
        keep_gate.touch()
        final = {j: ended(client, j, 300) for j in (elastic, plain, *queued)}
        history = client.get_job(elastic)["attempt_history"]
    assert all(r.procs[i].poll() is None for i in survivors)
    for job in final.values():
        assert job["status"] == "SUCCEEDED", job["status_reason"]
        assert (job["attempts"], job["preemptions"]) == (1, 0), job
    assert len(history) == 1, history
    notes = read_jsonl(keep_log)
    assert [n["what"] for n in notes] == ["start", "end"], notes  # once, adopted twice
    events = read_jsonl(run / "events.jsonl")
    assert [e["event"] for e in events].count("reattach") == 2, events
    assert_exactly_once(run)
    assert max_param_diff(static_ledger, run) == 0.0
    # boto3 at the survivor that stood by (SigV4 wants the server's clock near the client's)
    batch = boto3.client("batch", endpoint_url=r.urls[1], region_name="eu-west-1",
                         aws_access_key_id="ha", aws_secret_access_key=r.token)
    described = batch.describe_jobs(jobs=list(final))["jobs"]
    assert {j["jobId"]: j["status"] for j in described} == dict.fromkeys(final, "SUCCEEDED")
    store = Store(r.db)
    try:  # one term per leader, in order: the old leader never took it back
        terms = [(e.payload["replica"], e.payload["epoch"])
                 for e in store.logs.list_events(None, limit=10**6) if e.kind == "service.leader"]
    finally:
        store.close()
    names = {i: r.urls[i].removeprefix("http://") for i in (1, 2, 3)}
    assert terms == [(names[1], 1), (names[second], 2), (names[third], 3)], terms
    for i in survivors:
        assert "Traceback" not in r.log(i), r.log(i)[-3000:]
