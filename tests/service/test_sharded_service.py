"""The batch service runs a sharded GPT job elastically: a real `dyntrain server`
runs `dyntrain.workloads.gpt --shard 3` on a spot environment whose capacity grows and is taken
back while the job trains (1 -> 3 workers: the joiners receive their shards; 3 -> 2: a preempted
worker leaves, or is killed after the grace period), then one of the two is SIGKILLed (with
`r = 2` the survivor holds every shard: no checkpoint reload), and the trained model is bitwise
the unsharded static run's.

The job runs the workload through tests/scripts/gpt_held.py, which slows each chunk while a file
exists (outside the arithmetic), so that the job is still training when the workers the test
waits for have started, however loaded the machine; the file goes once the crash is seen. It also
prints the sharding level each worker's trainer was built with: the flags reached every worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import SCRIPTS, read_jsonl, start_server, stop_server
from dyntrain.service.client import Client
from dyntrain.testing.jobs import pinned_env
from dyntrain.testing.wait import wait_until
from test_elastic_e2e import world_sizes

pytestmark = pytest.mark.slow

#: the sharding level run through the service: 3, which shards the optimizer state, the reduced
#: gradients and the parameters (levels 1 and 2 are its subsets, each bitwise through joins, kills,
#: leaves and chaos in tests/test_sharded.py; the service passes ``--shard N`` through unchanged).
#: It clips by the GPT workload's default global norm (1.0), like the static run below.
LEVELS = ["3"]

#: tiny GPT (~250k parameters, 32-byte samples, 4 chunks per step), 60 steps
GPT = ["--model", "tiny", "--d-model", "96", "--seq-len", "32", "--global-batch", "8",
       "--chunk-size", "2", "--max-steps", "60", "--warmup-steps", "4", "--val-every", "20",
       "--val-samples", "8", "--checkpoint-every", "20"]
SLOT = {"cpus": 0.25, "gpus": 0, "memory_mib": 512}


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    """The unsharded reference, `python -m dyntrain.workloads.gpt` alone (no coordinator) with a
    job's default numerics (as the service pins them in every worker), started at once so that
    it trains while the server starts and the first job is held slow: a function that waits for
    it and returns its run folder."""
    out = tmp_path_factory.mktemp("static")
    env = pinned_env(DYNTRAIN_OUT=str(out))
    env.pop("DYNTRAIN_COORDINATOR", None)
    with open(out / "output.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dyntrain.workloads.gpt", *GPT], env=env,
                                stdout=log, stderr=subprocess.STDOUT)

    def finished() -> Path:
        assert proc.wait(timeout=300) == 0, (out / "output.log").read_text()[-3000:]
        return out

    yield finished
    if proc.poll() is None:  # a test failed before it waited
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """(url, state directory) of a `dyntrain server` shared by the module's tests."""
    tmp = tmp_path_factory.mktemp("sharded-service")
    proc, url = start_server(tmp / "state", tmp / "server.log")
    yield url, tmp / "state"
    assert stop_server(proc) == 0
    assert "Traceback" not in (tmp / "server.log").read_text()


def members(run) -> list[str]:
    """The workers of the run's newest world, from its membership events."""
    now: list[str] = []
    for e in read_jsonl(run / "events.jsonl"):
        if e["event"] in ("start", "join", "resume", "reattach"):
            now += [w for w in e["workers"] if w not in now]
        else:
            now = [w for w in now if w not in e["workers"]]
    return now


def pid_of(state, worker: str) -> int:
    """The pid the local executor's supervisor journal gives ``worker`` (a session leader)."""
    for journal in (state / "executor" / "workers").glob("supervisor-*.started"):
        for line in journal.read_text().splitlines():
            if (entry := json.loads(line))["id"] == worker:
                return entry["pid"]
    raise AssertionError(f"{worker} is in no supervisor's journal")


@pytest.mark.parametrize("level", LEVELS)
def test_a_sharded_gpt_job_grows_shrinks_and_loses_a_worker_on_the_service_bitwise_static(
        static, service, level, tmp_path):
    url, state = service
    hold = tmp_path / "hold"
    hold.touch()
    with Client(url) as client:
        ce, queue = f"spot-{level}", f"sharded-{level}"
        client.create_compute_environment(name=ce, capacity_type="SPOT", slot=SLOT,
                                          min_slots=0, desired_slots=1, max_slots=3)
        client.create_job_queue(name=queue, compute_environments=[ce])
        job = client.submit(queue=queue, workers={"min": 1, "max": 3}, resources=SLOT,
                            command=[sys.executable, str(SCRIPTS / "gpt_held.py"), str(hold),
                                     *GPT, "--shard", level, "--shard-redundancy", "2"])
        run = state / "runs" / "jobs" / job["id"]

        def sizes() -> list[int]:
            return world_sizes(run) if (run / "metrics.jsonl").exists() else []

        def ended() -> dict | None:
            now = client.get_job(job["id"])
            return now if now["status"] in ("SUCCEEDED", "FAILED") else None

        def seen(condition, what: str, timeout: float):
            """``condition`` once true; fails at once (with the reason) if the job ended."""
            def check():
                if (done := ended()) is not None:
                    raise AssertionError(f"the job ended ({done['status']}: "
                                         f"{done['status_reason']}) before {what}: {sizes()}")
                return condition()
            return wait_until(check, what, timeout, poll=0.2)

        seen(lambda: sizes() == [1], "the job to train on one worker", 180)
        client.update_compute_environment(ce, desired_slots=3)  # capacity appears
        seen(lambda: 3 in sizes(), "the job to grow to 3 workers", 180)
        client.update_compute_environment(ce, desired_slots=2)  # and some is taken back
        seen(lambda: sizes()[-1] == 2 and len(members(run)) == 2,
             "the job to shrink to 2 workers", 180)
        victim = members(run)[-1]
        os.killpg(pid_of(state, victim), signal.SIGKILL)  # a crash: r = 2, nothing lost
        seen(lambda: any(e["event"] == "crash" and victim in e["workers"]
                         for e in read_jsonl(run / "events.jsonl")),
             f"the job to train on without {victim}", 180)
        hold.unlink()  # seen them all: let it finish at full speed
        final = wait_until(ended, "the job to end", 240, poll=0.2)
    assert final["status"] == "SUCCEEDED", final["status_reason"]
    # growing, shrinking and a lost worker are not failed attempts; the shrink is a preemption
    assert final["attempts"] == 1 and final["preemptions"] == 1, final
    assert final["command"][-4:] == ["--shard", level, "--shard-redundancy", "2"]
    trainers = {w for e in read_jsonl(run / "events.jsonl") if e["event"] in ("start", "join")
                for w in e["workers"]}
    assert len(trainers) >= 3, trainers
    for log in (run / "logs").iterdir():
        text = log.read_text()
        assert "Traceback" not in text, (log.name, text[-3000:])
        if log.stem in trainers:  # the flags reached every worker that trained
            assert f"gpt_held: sharded at level {level}\n" in text, (log.name, text[-3000:])
            trainers.remove(log.stem)
    assert not trainers, f"no log of {trainers}"

    trained = world_sizes(run)
    assert trained[0] == 1 and trained[trained.index(3) + 1] == 2, trained
    changes = [(e["event"], e.get("world_before"), e.get("world_after"))
               for e in read_jsonl(run / "events.jsonl")]
    assert changes[0] == ("start", 0, 1), changes
    assert any(c[0] == "join" and c[2] == 3 for c in changes), changes
    assert any(c[0] in ("leave", "crash") and c[1] == 3 and c[2] == 2 for c in changes), changes
    assert any(c[0] == "crash" and c[1] == 2 for c in changes), changes
    assert not any(c[0] == "resume" for c in changes), changes  # r = 2: no checkpoint reload
    assert read_jsonl(run / "metrics.jsonl")[-1]["step"] == 60

    ours = torch.load(run / "final.pt", weights_only=True)
    theirs = torch.load(static() / "final.pt", weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "not bitwise equal"
