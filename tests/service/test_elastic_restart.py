"""An elastic job outlives a SIGKILLed `dyntrain server`.

A real server process runs a real elastic digits job on two workers; the server is SIGKILLed
while the job trains and started again on the same state directory. The workers train on
meanwhile (the leader writes a newer checkpoint), re-attach to the restarted service's
coordinator (same port), and the job finishes with `final.pt` bitwise equal to a static
one-process run: no checkpoint reload, no step lost or applied twice (every step has exactly one
metrics row), one attempt, no preemption. So that the job cannot end before the service is back
however slowly the server starts on a loaded machine, its workers are SIGSTOPped once they have
shown that they train on, and SIGCONTed when the new server answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
import torch

from conftest import read_jsonl
from dyntrain.service.client import Client
from dyntrain.testing.jobs import pinned_env
from dyntrain.testing.wait import wait_until

from .test_cli_service import PY, ROOT, _env, start_server, stop_server

# 88 steps of >= 40 ms (4 chunks of 10 ms per worker), a checkpoint every 20
DIGITS = [PY, "-m", "dyntrain.workloads.digits", "--epochs", "4"]
STEP_DELAY = ["--step-delay", "0.01"]  # sleeps only: the same math without it


def newest_checkpoint(run) -> int:
    return max((int(p.stem.split("-")[-1]) for p in (run / "checkpoints").glob("ckpt-*.dtck")),
               default=0)


def rows(path) -> list[dict]:
    return read_jsonl(path)  # a line still being written waits


@pytest.mark.slow
def test_elastic_job_trains_through_a_service_sigkill_and_reattaches(tmp_path):
    static = subprocess.Popen(DIGITS, env=pinned_env(_env(), DYNTRAIN_OUT=str(tmp_path / "static")),
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=ROOT)
    state = tmp_path / "state"
    server, url = start_server(state, tmp_path / "server-1.log")
    try:
        with Client(url) as client:
            job = client.submit(queue="default", command=DIGITS + STEP_DELAY,
                                workers={"min": 2, "max": 2},
                                resources={"cpus": 0.5, "memory_mib": 256})
        run = state / "runs" / "jobs" / job["id"]
        wait_until(lambda: len(rows(run / "metrics.jsonl")) >= 5, "the job to train", 120)
        server.kill()  # SIGKILL: the coordinator and its store die with the service
        server.wait()
        killed_at = len(rows(run / "metrics.jsonl"))
        before = newest_checkpoint(run)
        wait_until(lambda: newest_checkpoint(run) > before,
                   "a checkpoint written while the service is down", 120)
        workers = [json.loads(line)["pid"]  # the supervisor's journal of what it started
                   for p in (state / "executor" / "workers").glob("supervisor-*.started")
                   for line in p.read_text().splitlines()]
        assert len(workers) == 2
        for pid in workers:
            os.killpg(pid, signal.SIGSTOP)
        server, url = start_server(state, tmp_path / "server-2.log")
        for pid in workers:
            os.killpg(pid, signal.SIGCONT)
        with Client(url) as client:
            final = wait_until(lambda: (j := client.get_job(job["id"]))["status"] in
                               ("SUCCEEDED", "FAILED") and j, "the job to end", 180)
    finally:
        stop_server(server)
    assert final["status"] == "SUCCEEDED", final["status_reason"]
    assert final["attempts"] == 1 and final["preemptions"] == 0
    assert "re-attach to its coordinator" in (tmp_path / "server-2.log").read_text()

    events = rows(run / "events.jsonl")
    assert [e["event"] for e in events] == ["start", "reattach"], events
    reattach = events[1]
    assert reattach["steps_redone"] <= 1 and reattach["origin"] == "members"
    assert reattach["start_step"] > killed_at  # it trained on while the service was down
    steps = [r["step"] for r in rows(run / "metrics.jsonl")]
    assert sorted(steps) == list(range(1, 89)), "every step once, none lost, none redone"
    for log in (run / "logs").iterdir():
        assert "Traceback" not in log.read_text(), log

    assert static.wait(timeout=120) == 0
    ours = torch.load(run / "final.pt", weights_only=True)
    theirs = torch.load(tmp_path / "static" / "final.pt", weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "not bitwise equal"


def test_a_coordinator_shows_nothing_to_a_client_without_the_jobs_secret(tmp_path):
    """The port of an elastic job's coordinator is open (workers on other hosts reach it), but
    every key lives under the attempt's secret: a stranger finds none, the job's workers (the
    secret in their environment) read them, and a restarted service keeps the secret."""
    from datetime import timedelta

    import torch.distributed as dist

    from dyntrain.elastic import protocol as p
    from dyntrain.service.engine.elastic_host import SECRET_FILE, ElasticHost
    from dyntrain.service.store import Store

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    run = tmp_path / "run"
    host = ElasticHost(store, "job", run, 1, 2, expected=1, attempt=3)
    try:
        port = int(host.address.rsplit(":", 1)[1])
        stranger = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                 timeout=timedelta(seconds=10))
        assert not stranger.check([p.JOB_INFO])
        assert stranger.num_keys() >= 1  # the keys are there, under a prefix it cannot name
        secret = json.loads((run / SECRET_FILE).read_text())
        assert secret["job"] == "job/attempt-3" and len(secret["secret"]) == 32
        assert (run / SECRET_FILE).stat().st_mode & 0o777 == 0o600
        worker = dist.PrefixStore(secret["secret"], stranger)
        assert json.loads(worker.get(p.JOB_INFO))["job"] == "job/attempt-3"
    finally:
        host.close()
    again = ElasticHost(store, "job", run, 1, 2, expected=1, attempt=3, recovering=["job-a3-w0"])
    try:
        assert again.secret == secret["secret"]  # re-attaching workers still hold the key
    finally:
        again.close()
