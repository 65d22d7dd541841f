"""A worker process that closes its channel and exits ends with its own exit code.

A daemon thread that is inside a torch store call when the interpreter finalises makes the
process abort (``terminate called without an active exception``, SIGABRT): Python ends such a
thread when it next takes the GIL, and the unwinding meets a C++ frame that may not throw. The
channel's watcher polls the store all the time, so ``close`` must end it before returning.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from conftest import DYNTRAIN, SCRIPTS
from dyntrain.elastic import protocol as p
from dyntrain.elastic.worker.channel import JobOver, WorkerChannel

WORKER = """
import sys
from dyntrain.elastic import protocol as p
from dyntrain.elastic.worker.channel import WorkerChannel
# no pause between polls: the watcher is inside a store call nearly all the time
ch = WorkerChannel(sys.argv[1], "w0", heartbeat_interval=0.0, watch_interval=0.0)
ch.watch(0)
ch.send(p.Left(0, 3))
ch.close()
sys.exit(0)
"""


@pytest.fixture()
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=30))


def test_close_ends_the_watcher_and_report_still_delivers(store):
    before = set(threading.enumerate())
    ch = WorkerChannel(f"127.0.0.1:{store.port}", "w0", heartbeat_interval=0.0,
                       watch_interval=0.0)
    ch.watch(0)
    watchers = [t for t in set(threading.enumerate()) - before if t.name == "dyntrain-watcher"]
    ch.close()
    assert watchers and not watchers[0].is_alive()
    ch.send(p.Result(0, {"val_accuracy": 0.5}))  # what ElasticTrainer.report does after fit()
    ch.flush()
    assert store.check([p.inbox_key("w0", 0)])


@pytest.mark.slow
def test_a_worker_that_closes_its_channel_exits_cleanly(store):
    # before the fix about half of such exits aborted (exit -6; 15 of 30)
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", WORKER, f"127.0.0.1:{store.port}"],
                              capture_output=True, text=True, timeout=120)
        assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
        assert proc.returncode == 0, proc.stderr[-2000:]


def _finished_job(store: dist.TCPStore, tmp_path) -> str:
    """The store of a coordinator whose job has just finished (what a late joiner finds)."""
    store.set(p.JOB_INFO, json.dumps({"out_dir": str(tmp_path / "run"), "job": "j1"}))
    store.set(p.GEN_LATEST, "3")
    store.set(p.JOB_STATE, p.JobVerdict(p.JobState.DONE).encode())
    return f"127.0.0.1:{store.port}"


def test_a_worker_that_joins_a_finished_job_says_so_and_fails(store, tmp_path):
    proc = subprocess.run(
        [*DYNTRAIN, "worker", "--coordinator", _finished_job(store, tmp_path),
         str(SCRIPTS / "ledger_train.py")],
        capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]  # the CLI's one-line errors
    assert "the job had already finished when this worker joined it" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_channel_tells_a_late_joiner_from_a_waiting_member(store, tmp_path):
    address = _finished_job(store, tmp_path)
    ch = WorkerChannel(address, "w-late", heartbeat_interval=0.0)
    try:
        with pytest.raises(JobOver) as late:
            ch.wait_generation(-1, lambda: False)
        assert late.value.at_join and late.value.status.state is p.JobState.DONE
    finally:
        ch.close()
    store.set(p.JOB_STATE, p.JobVerdict(p.JobState.RUNNING).encode())
    ch = WorkerChannel(address, "w-waiting", heartbeat_interval=0.0)
    try:
        assert ch._scan(3) == 3  # running: it waits for a generation
        store.set(p.JOB_STATE, p.JobVerdict(p.JobState.DONE).encode())
        with pytest.raises(JobOver) as waited:
            ch.wait_generation(3, lambda: False)
        assert not waited.value.at_join
    finally:
        ch.close()
