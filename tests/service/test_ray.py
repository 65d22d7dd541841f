"""The Ray executor and the job service on a real throw-away Ray cluster (a head and worker nodes,
each its own `ray start`), one cluster shared by every test of this module.

Executor level: workers are processes on Ray nodes, one detached actor each, started where their
compute environment's nodes are, with the spec's environment and working directory; their output
comes back into the log file the controller reads; exits and signals are reported once; a
restarted executor finds its actors again, reads the exits it missed and ends actors nobody owns.

Service level (a real `dyntrain server --executor ray` process): plain and array jobs run on the
nodes of their environments with their output in the store; a SIGKILLed service restarts without
losing or repeating a job; an elastic job grows onto a node that joins, re-forms on the survivors
when that node is lost abruptly (its raylet SIGKILLed, as a spot reclaim) and ends bitwise equal
to a static run.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import start_server, stop_server
from dyntrain.cli.main import main
from dyntrain.elastic.worker.address import machine_addresses
from dyntrain.service.client import Client
from dyntrain.service.core.executor import ExecutorError, StartError, WorkerSpec
from dyntrain.service.core.model import Resources
from dyntrain.service.executors.ray import RayExecutor
from dyntrain.service.executors.ray_address import coordinator_address
from dyntrain.service.executors.ray_nodes import import_ray
from dyntrain.testing.jobs import pinned_env
from dyntrain.testing.wait import wait_until

from .test_cli_service import PY, ROOT, _env
from .test_controller import LEDGER, expected_counts
from .test_elastic_restart import rows


@pytest.fixture(scope="module")
def ray_cluster():
    """A throw-away Ray cluster shared by this module's tests: a head without CPUs and two worker
    nodes, each its own `ray start`, standing in for hosts of a spot and an on-demand
    environment. The two worker nodes start at once."""
    from dyntrain.testing.raycluster import LocalRayCluster

    cluster = LocalRayCluster()
    try:
        cluster.start()
        with ThreadPoolExecutor(max_workers=2) as pool:
            started = [pool.submit(cluster.add_node, "spot-1", 3, {"dyntrain_ce_spot": 3}),
                       pool.submit(cluster.add_node, "ondemand-1", 2,
                                   {"dyntrain_ce_ondemand": 2})]
        for node in started:
            node.result()
        yield cluster
    finally:
        cluster.close()


SLOT = Resources(1.0, 0, 128)


def spec(tmp_path: Path, wid: str, code: str, env: str = "spot", cwd=None, **extra) -> WorkerSpec:
    return WorkerSpec("job", 1, wid, [sys.executable, "-c", code], extra, SLOT, cwd,
                      str(tmp_path / "logs" / f"{wid}.log"), env)


def exits_of(ex: RayExecutor, ids: set[str], timeout: float = 60.0,
             seen: dict | None = None) -> dict:
    """Poll until the exits of ``ids`` are in; ``seen`` keeps every exit polled (each is
    reported once), also those of other workers."""
    found = {} if seen is None else seen

    def missing() -> set[str]:
        found.update((e.worker_id, e) for e in ex.poll())
        return ids - set(found)

    wait_until(missing, f"the exits of {sorted(ids)}", timeout, 0.2,
               until=lambda left: not left)
    return found


def named(ex: RayExecutor) -> set[str]:
    return {n.rsplit(":", 1)[-1] for n in ex.actors.names()}


@pytest.fixture
def executor(ray_cluster, tmp_path):
    ex = RayExecutor(tmp_path / "state", ray_cluster.address)
    yield ex
    ex.shutdown()


@pytest.mark.slow
def test_workers_run_on_their_environments_nodes_with_output_exit_and_signals(executor,
                                                                              tmp_path):
    ex = executor
    assert ex.slots({"spot": SLOT, "ondemand": Resources(2.0, 0, 128), "none": SLOT}) == {
        "spot": 3, "ondemand": 1, "none": 0}  # 2 CPUs hold one 2-CPU slot
    work = tmp_path / "work"
    work.mkdir()
    talk = ("import os, sys; print('hello from', os.getcwd(), os.environ['GREETING'], "
            "os.environ['CUDA_VISIBLE_DEVICES'] == '', flush=True); sys.exit(3)")
    sleeper = "import time; print('up', flush=True); time.sleep(600)"
    results = ex.start_many([spec(tmp_path, "w-talk", talk, cwd=str(work), GREETING="hi"),
                             spec(tmp_path, "w-sleep", sleeper, env="ondemand"),
                             spec(tmp_path, "w-nocwd", "pass", cwd=str(tmp_path / "gone"))])
    assert [r.ref for r in results[:2]] == ["dyntrain:job:1:w-talk", "dyntrain:job:1:w-sleep"]
    seen: dict = {}
    nocwd = f"no working directory {tmp_path / 'gone'} on node "
    if isinstance(results[2], StartError):  # the actor answered within start_many's wait
        assert str(results[2]).startswith(nocwd), results[2]
    else:  # it answered later: exit code 127, the cause in its log
        late = exits_of(ex, {"w-nocwd"}, seen=seen)["w-nocwd"]
        assert late.exit_code == 127 and nocwd in late.reason, late
        assert nocwd in (tmp_path / "logs" / "w-nocwd.log").read_text()
        ex.release(["w-nocwd"])
    assert ex.alive("w-sleep")
    with pytest.raises(ExecutorError, match="already exists"):
        ex.start(spec(tmp_path, "w-sleep", "pass"))

    sleep_log = tmp_path / "logs" / "w-sleep.log"
    wait_until(lambda: sleep_log.exists() and "up" in sleep_log.read_text(),
               "output from w-sleep", 60)
    ex.signal("w-sleep", "TERM")
    found = exits_of(ex, {"w-talk", "w-sleep"}, seen=seen)
    assert found["w-talk"].exit_code == 3 and not found["w-talk"].lost
    assert found["w-sleep"].signal == 15 and found["w-sleep"].exit_code is None
    # every line of output is in the log file on this host before the exit is reported
    assert (tmp_path / "logs" / "w-talk.log").read_text() == f"hello from {work} hi True\n"
    assert ex.poll() == []  # each exit once
    assert named(ex) == {"w-talk", "w-sleep"}  # kept until the service stored the exits
    ex.release(["w-talk", "w-sleep"])
    wait_until(lambda: named(ex), "every actor to end", 30, until=lambda left: not left)


@pytest.mark.slow
def test_a_restarted_executor_adopts_reads_missed_exits_and_ends_actors_nobody_owns(
        ray_cluster, tmp_path):
    gate = tmp_path / "gate"
    wait_gate = (f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
                 "print('through the gate', flush=True)")

    def up(wid: str) -> str:  # the command's first line: a marker that it runs
        return f"open({str(tmp_path / f'up-{wid}')!r}, 'w').close()\n"

    first = RayExecutor(tmp_path / "state", ray_cluster.address)
    specs = {s.worker_id: s for s in (
        spec(tmp_path, "w-runs", up("w-runs") + wait_gate),
        spec(tmp_path, "w-ends", up("w-ends") + "print('done early', flush=True)"),
        spec(tmp_path, "w-orphan", up("w-orphan") + wait_gate),
        spec(tmp_path, "w-unstored", up("w-unstored") + wait_gate, env="ondemand"))}
    handles = {h.worker_id: h for h in first.start_many(list(specs.values()))}
    wait_until(lambda: all((tmp_path / f"up-{wid}").exists() for wid in specs),
               "the workers' commands to run", 120)
    first.shutdown()  # the service dies: no exit is reported, no actor released

    second = RayExecutor(tmp_path / "state", ray_cluster.address)
    try:
        wait_until(lambda: second.find("w-ends") is not None and
                   second.actors.status(handles["w-ends"].ref)[1].get("exit_code") is not None,
                   "w-ends to have ended", 120)
        assert second.adopt(handles["w-runs"], specs["w-runs"]) is True
        assert second.adopt(handles["w-ends"], specs["w-ends"]) is False  # ended meanwhile
        assert second.find("w-never") is None
        found = second.find("w-unstored")  # started, but its handle was never stored
        assert found == handles["w-unstored"]
        assert second.adopt(found, specs["w-unstored"]) is True
        assert second.sweep() == ["w-orphan"]  # no record owns it
        ended = exits_of(second, {"w-ends"})
        assert ended["w-ends"].exit_code == 0
        assert (tmp_path / "logs" / "w-ends.log").read_text() == "done early\n"
        gate.touch()
        found = exits_of(second, {"w-runs", "w-unstored"})
        assert {e.exit_code for e in found.values()} == {0}
        assert (tmp_path / "logs" / "w-runs.log").read_text() == "through the gate\n"
        second.release(["w-ends", "w-runs", "w-unstored"])
        wait_until(lambda: named(second), "every actor to end", 30,
                   until=lambda left: not left)
        assert not (tmp_path / "logs" / "w-orphan.log").exists() or \
            "gate" not in (tmp_path / "logs" / "w-orphan.log").read_text()
    finally:
        second.shutdown()


def server_error(capsys, *args: str) -> list[str]:
    """What `dyntrain server ARGS` prints when it fails (its exit code is 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["server", "--port", "0", *args])
    assert stopped.value.code == 2
    out = capsys.readouterr()
    return (out.out + out.err).strip().splitlines()


def test_without_ray_or_a_cluster_the_server_says_so_in_one_line(monkeypatch, tmp_path,
                                                                 capsys):
    import ray  # noqa: F401  (imported for real first: the patch below hides it, then restores it)

    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
        with pytest.raises(ExecutorError, match=r"pip install 'dyntrain\[ray\]'"):
            import_ray()
        assert server_error(capsys, "--executor", "ray", "--state-dir", str(tmp_path / "a")) == [
            "dyntrain: error: --executor ray needs Ray: pip install 'dyntrain[ray]'"]
    with socket_nobody_listens() as address:
        lines = server_error(capsys, "--executor", "ray", "--ray-address", address,
                             "--state-dir", str(tmp_path / "b"))
    assert len(lines) == 1 and lines[0].startswith(
        f"dyntrain: error: no Ray cluster at {address} ("), lines


def test_job_coordinators_listen_at_an_address_other_hosts_reach():
    # the address Ray gave this host's node, as long as it is not loopback
    assert coordinator_address("10.1.2.3", "10.1.2.3:6380") == "10.1.2.3"
    assert coordinator_address("127.0.0.1", "127.0.0.1:6380") == "127.0.0.1"  # one machine
    # a head started without --node-ip-address where the hostname resolves to 127.0.1.1: the
    # address this host reaches the (non-loopback) GCS from
    mine = machine_addresses()
    if not mine:
        pytest.skip("this machine has no address but loopback")
    assert coordinator_address("127.0.1.1", f"{mine[0]}:6380") == mine[0]


class socket_nobody_listens:
    """An address on 127.0.0.1 whose port nothing listens on (bound, not listening)."""

    def __enter__(self) -> str:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        self.sock.close()


SMALL = {"cpus": 1, "memory_mib": 128}


def ray_server(ray_cluster, state, log):
    return start_server(state, log, "--executor", "ray", "--ray-address", ray_cluster.address)


def environments(client: Client, cpus: float = 1) -> None:
    slot = {"cpus": cpus, "gpus": 0, "memory_mib": 128}
    for name, kind in (("spot", "SPOT"), ("ondemand", "ON_DEMAND")):
        client.create_compute_environment(name=name, capacity_type=kind,
                                          price_per_slot_hour=0.1, slot=slot, min_slots=0,
                                          desired_slots=0, max_slots=16)
    client.create_job_queue(name="q", compute_environments=["spot", "ondemand"])
    client.create_job_queue(name="spot", compute_environments=["spot"])


def lines(client: Client, job_id: str) -> list[str]:
    return [x["line"] for x in client.logs(job_id)["lines"]]


def ended(client: Client, job_id: str, timeout: float = 120) -> dict:
    return wait_until(lambda: client.get_job(job_id), f"job {job_id} to end", timeout,
                      until=lambda j: j["status"] in ("SUCCEEDED", "FAILED"))


@pytest.mark.slow
def test_plain_and_array_jobs_run_on_ray_nodes_and_survive_a_service_sigkill(ray_cluster,
                                                                           tmp_path):
    state = tmp_path / "state"
    gates = {name: tmp_path / f"gate-{name}" for name in ("down", "up")}

    def gated(name: str) -> list[str]:  # one line per run in its marker, then waits for its gate
        marker, gate = tmp_path / f"ran-{name}", gates[name]
        return [PY, "-c", f"import os, time\nopen({str(marker)!r}, 'a').write('ran\\n')\n"
                f"print('waiting', flush=True)\n"
                f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
                "print('through', flush=True)"]

    server, url = ray_server(ray_cluster, state, tmp_path / "server-1.log")
    try:
        with Client(url) as client:
            environments(client)
            assert {c["name"]: c["available_slots"] for c in
                    client.list_compute_environments()} == {"spot": 3, "ondemand": 2, "ray": 0}
            plain = client.submit(queue="q", resources=SMALL, command=[
                PY, "-c", "import os; print('plain on', os.environ['DYNTRAIN_JOB_ID'])"])
            array = client.submit(queue="q", resources=SMALL, array_size=3, command=[
                PY, "-c", "import os; print('child', os.environ['AWS_BATCH_JOB_ARRAY_INDEX'])"])
            assert ended(client, plain["id"])["status"] == "SUCCEEDED"
            # it ran once; a worker whose Ray actor died while starting (it may, on a loaded
            # machine) is retried and leaves the service's note of why before the command's line
            said = lines(client, plain["id"])
            assert [x for x in said if not x.startswith("dyntrain: ")] == [
                f"plain on {plain['id']}"], said
            assert all("its Ray actor failed while starting" in x for x in said
                       if x.startswith("dyntrain: ")), said
            assert ended(client, array["id"])["status"] == "SUCCEEDED"
            for i in range(3):
                assert lines(client, f"{array['id']}:{i}") == [f"child {i}"]

            down = client.submit(queue="q", resources=SMALL, command=gated("down"))
            up = client.submit(queue="q", resources=SMALL, command=gated("up"))
            for job in (down, up):
                wait_until(lambda j=job: lines(client, j["id"]), "both jobs to run", 120,
                           until=lambda seen: seen == ["waiting"])
        server.kill()  # SIGKILL: no exit is stored, no actor released
        server.wait()
        gates["down"].touch()  # ends while no service watches
        server, url = ray_server(ray_cluster, state, tmp_path / "server-2.log")
        with Client(url) as client:
            assert ended(client, down["id"])["status"] == "SUCCEEDED"
            assert client.get_job(up["id"])["status"] == "RUNNING"
            gates["up"].touch()
            final = {j["id"]: ended(client, j["id"]) for j in (down, up)}
            for job in (down, up):
                assert lines(client, job["id"]) == ["waiting", "through"]
    finally:
        stop_server(server)
    for job in final.values():
        assert job["status"] == "SUCCEEDED" and job["attempts"] == 1, job
        assert job["preemptions"] == 0
    for name in gates:  # nothing ran twice
        assert (tmp_path / f"ran-{name}").read_text() == "ran\n"
    recovered = (tmp_path / "server-2.log").read_text()
    assert "re-adopted 1 running worker(s)" in recovered, recovered


EPOCHS = 80  # 480 steps of the exactly-once ledger workload (>= 96 s while slowed)
LEDGER_RUN = [PY, LEDGER, "--epochs", str(EPOCHS)]


def world(run) -> int:
    """The job's world size after its latest membership change (0 before the first)."""
    events = rows(run / "events.jsonl")
    return events[-1]["world_after"] if events else 0


@pytest.mark.slow
def test_elastic_job_grows_onto_a_joining_node_and_reforms_when_it_is_lost(ray_cluster,
                                                                           tmp_path):
    static = subprocess.Popen(LEDGER_RUN, env=pinned_env(_env(), DYNTRAIN_OUT=str(tmp_path /
                                                                            "static")),
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=ROOT)
    gate = tmp_path / "slow"  # while it exists each step takes >= 0.2 s: the job cannot end
    gate.touch()              # before the test saw the node join and go
    state = tmp_path / "state"
    server, url = ray_server(ray_cluster, state, tmp_path / "server.log")
    try:
        with Client(url) as client:
            environments(client, cpus=1.5)  # spot-1 (3 CPUs) holds two such workers
            job = client.submit(queue="spot", command=LEDGER_RUN + ["--slow-while", str(gate)],
                                workers={"min": 1, "max": 3},
                                resources={"cpus": 1.5, "memory_mib": 128})
            run = state / "runs" / "jobs" / job["id"]
            # spot-1 holds two workers (the second may join the first a little later)
            wait_until(lambda: world(run), "the job to train on two workers", 180,
                       until=lambda w: w == 2)
            ray_cluster.add_node("spot-2", 2, {"dyntrain_ce_spot": 1})  # capacity joins
            wait_until(lambda: world(run), "the job to grow onto the new node", 180,
                       until=lambda w: w == 3)
            ray_cluster.kill_raylet("spot-2")  # the node is reclaimed
            wait_until(lambda: world(run), "the job to re-form on the survivors", 120,
                       until=lambda w: w == 2)
            gate.unlink()
            final = ended(client, job["id"], 300)
    finally:
        stop_server(server)
        ray_cluster.stop_node("spot-2")
    assert final["status"] == "SUCCEEDED", final["status_reason"]
    assert final["attempts"] == 1
    worlds = [(e["event"], e["world_before"], e["world_after"])
              for e in rows(run / "events.jsonl")]
    grown = worlds.index(("join", 2, 3))
    assert worlds[grown + 1][1:] == (3, 2), worlds  # the next change: the lost node's worker
    assert static.wait(timeout=180) == 0
    ours = torch.load(run / "final.pt", weights_only=True)
    theirs = torch.load(tmp_path / "static" / "final.pt", weights_only=True)
    assert torch.equal(ours["counts"], expected_counts(EPOCHS))  # every sample once per epoch
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "not bitwise equal"
