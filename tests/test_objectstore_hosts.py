"""A job whose hosts share no disk keeps its run folder on an object store, and fresh hosts
resume it after every host of the job is lost.

Five hosts of a test bed (network namespaces, private disks): host 0 is the object store
(moto's S3 server on its address); hosts 1 and 2 run the job (the launcher and a local worker
on host 1, `dyntrain worker` on host 2) with `--out s3://...`; both are lost at once (link
down, SIGKILL of every process) after the first committed checkpoint; the same command on
hosts 3 and 4 resumes from the newest committed checkpoint and ends bitwise equal to a static
run. Skipped where network namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import DYNTRAIN, ROOT, OutputLines
from dyntrain.elastic.runs.log import read_events
from dyntrain.elastic.runs.storage import open_store
from dyntrain.testing.jobs import pinned_env
from dyntrain.testing.wait import wait_until
from objectstore import start_s3_server

HOSTS = 5
DIGITS = ["-m", "dyntrain.workloads.digits", "--epochs", "3"]  # 66 steps, a checkpoint every 20
STEPS = 66


@pytest.fixture(scope="module")
def s3(hostbed, tmp_path_factory):
    """The object store, on host 0's address; this process reaches it over the bridge."""
    import s3fs

    store_host = hostbed.host(0)
    server = start_s3_server(tmp_path_factory.mktemp("moto") / "moto.log",
                             host=store_host.address, popen=store_host.popen)
    patch = pytest.MonkeyPatch()
    for name, value in server.env().items():
        patch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield server
    finally:
        patch.undo()
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def committed(s3, bucket: str, prefix: str) -> list[int]:
    return sorted(int(k.rpartition("ckpt-")[2].split(".")[0])
                  for k in s3.keys(bucket, f"{prefix}/checkpoints/") if k.endswith(".commit"))


def start_job(bed, s3, launcher: int, joiner: int, url: str, log) -> tuple:
    """The launcher (and one local worker) on host ``launcher``, `dyntrain worker` on host
    ``joiner``; returns both processes once the worker was started."""
    env = s3.env(PYTHONUNBUFFERED="1")  # no address settings: workers find their own
    host = bed.host(launcher)
    run = host.popen([*DYNTRAIN, "run", "--host", host.address, "--workers", "2:2", "--nproc",
                      "1", "--out", url, *DIGITS, "--step-delay", "0.01"], env=env, cwd=ROOT,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = OutputLines(run)
    said = wait_until(lambda: run.poll() is not None or next(
        (line for line in lines.lines if "coordinator listening on" in line), None),
        f"the launcher on {host.name} to listen", 120)
    assert run.poll() is None, "\n".join(lines.lines)
    address = said.split("coordinator listening on ")[1].split(";")[0]
    worker = bed.host(joiner).popen([*DYNTRAIN, "worker", "--coordinator", address, *DIGITS,
                                     "--step-delay", "0.01"], env=env, cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT)
    return run, lines, worker


def files_on(disk) -> list[str]:
    return [name for _, _, names in os.walk(disk) for name in names]


@pytest.mark.slow
def test_fresh_hosts_resume_a_run_from_s3_after_every_host_is_lost(hosts, s3, tmp_path):
    static = subprocess.Popen([sys.executable, *DIGITS], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT,
                              env=pinned_env(DYNTRAIN_OUT=str(tmp_path / "static")))
    url = f"s3://{s3.bucket('hosts-run')}/digits"
    with open(tmp_path / "worker-1.log", "w") as log:
        run, lines, worker = start_job(hosts, s3, 1, 2, url, log)
    try:
        wait_until(lambda: run.poll() is not None or committed(s3, "hosts-run", "digits"),
                   "the first committed checkpoint", 180)
        lost = hosts.lose(1) + hosts.lose(2)
    finally:
        run.kill()
        worker.kill()
    run.wait()
    worker.wait()
    assert lost >= 3, "the launcher, its worker and the joined worker"
    at_loss = committed(s3, "hosts-run", "digits")[-1]
    assert at_loss < STEPS, "\n".join(lines.lines)

    with open(tmp_path / "worker-2.log", "w") as log:
        run, lines, worker = start_job(hosts, s3, 3, 4, url, log)
    try:
        assert run.wait(timeout=300) == 0, "\n".join(lines.lines)
        assert worker.wait(timeout=60) == 0, (tmp_path / "worker-2.log").read_text()[-3000:]
    finally:
        run.kill()
        worker.kill()
    store = open_store(url)
    events = read_events(store)
    assert [(e.kind, e.origin) for e in events] == [("start", "fresh"),
                                                    ("resume", "checkpoint")], events
    assert events[1].start_step == at_loss  # the newest committed checkpoint
    assert json.loads(store.get("result.json"))["steps"] == STEPS
    assert json.loads(store.get("run.json"))["setup"]["config"]["global_batch"] == 64
    said = next(line for line in lines.lines if "local workers' logs in" in line)
    assert f"run folder {url}; local workers' logs in /tmp/" in said  # host 3's own disk
    assert "logs/worker-w0.log" in store.list("logs")  # moved there when the launcher ended
    assert not hosts.host(3).path(said.rpartition(" in ")[2]).exists()
    # nothing of the run folder on any host's own disk
    for h in hosts.hosts[1:]:
        kept = [n for n in files_on(h.disk) if n.startswith("ckpt-")
                or n in ("final.pt", "metrics.jsonl", "events.jsonl", "run.json")]
        assert kept == [], (h.name, kept)
    assert static.wait(timeout=240) == 0
    same = subprocess.run([*DYNTRAIN, "compare", "--atol", "0", url, tmp_path / "static"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert same.returncode == 0 and same.stdout.startswith("match: max |a-b| = 0 "), \
        same.stdout + same.stderr
