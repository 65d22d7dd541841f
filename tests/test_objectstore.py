"""Run folders on an object store: the storage layer, line files and committed checkpoints
against a real S3-compatible server (moto's, its own process, over HTTP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, wait_for
from dyntrain.elastic import ckptstore, linelog
from dyntrain.elastic.checkpoint import encode_checkpoint
from dyntrain.elastic.storage import StorageError, open_store
from dyntrain.lab.report import load_noise
from objectstore import start_s3_server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """One server for the module; this process reaches it through the environment."""
    import s3fs

    server = start_s3_server(tmp_path_factory.mktemp("moto") / "moto.log")
    patch = pytest.MonkeyPatch()
    for name, value in server.env().items():
        patch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()  # made with other credentials, if any
    try:
        yield server
    finally:
        patch.undo()
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def test_files_are_put_listed_read_and_deleted(s3):
    store = open_store(f"s3://{s3.bucket('files')}/run")
    store.check()
    store.put("run.json", b"{}")
    store.put_many({"logs/a.log": b"a", "logs/b.log": b"bb"})
    assert store.list() == {"run.json": 2}
    assert store.list("logs") == {"logs/a.log": 1, "logs/b.log": 2}
    assert store.get("logs/b.log") == b"bb" and store.get("run.json", 1, 2) == b"}"
    assert store.exists("run.json") and not store.exists("final.pt")
    with pytest.raises(FileNotFoundError):
        store.get("final.pt")
    store.delete(["logs/a.log", "logs/missing.log"])
    assert store.list("logs") == {"logs/b.log": 2}
    assert store.where("final.pt") == "s3://files/run/final.pt"


def test_line_files_are_segments_read_back_in_order_across_writers(s3):
    store = open_store(f"s3://{s3.bucket('lines')}/run")
    first = linelog.open_lines(store, "metrics.jsonl", flush_seconds=60, segment_bytes=100)
    for step in range(1, 11):
        first.write(json.dumps({"step": step, "b_simple": 10.0 * step}))
    first.flush()  # what a reader sees before the writer closes
    assert [json.loads(x)["step"] for x in linelog.read_lines(store, "metrics.jsonl")] == \
        list(range(1, 11))
    first.write(json.dumps({"step": 11, "b_simple": 110.0}))
    first.close()
    second = linelog.open_lines(store, "metrics.jsonl")  # a resumed run: segments after those
    second.write(json.dumps({"step": 12, "b_simple": 120.0}), urgent=True)
    wait_for(lambda: len(linelog.read_lines(store, "metrics.jsonl")) == 12,
             "the urgent line to be uploaded by the writer's thread", 30)
    second.close()
    rows = [json.loads(x) for x in linelog.read_lines(store, "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, 13))
    # segments closed at 100 bytes or more (4 rows of 30 bytes); the second writer's own
    keys = s3.keys("lines", "run/")
    assert sorted(keys) == [f"run/metrics.jsonl.d/{n:08d}.jsonl" for n in (1, 2, 3, 4)]
    assert keys["run/metrics.jsonl.d/00000004.jsonl"] == len(json.dumps(rows[-1])) + 1
    # byte offsets run across the segments as if they were one file
    whole = linelog.read_bytes(store, "metrics.jsonl")
    assert linelog.read_bytes(store, "metrics.jsonl", 150, 100) == whole[150:250]
    assert linelog.size(store, "metrics.jsonl") == len(whole)
    # the lab reads the run folder's metrics by URL
    noise = load_noise("s3://lines/run")
    assert noise.steps == list(range(1, 13)) and noise.name == "run"
    assert noise.path == "s3://lines/run/metrics.jsonl"


def state_of(size: int, value: float) -> dict:
    return {"w": torch.full((size,), value), "step": torch.tensor(1)}


def test_only_committed_checkpoints_are_seen_and_a_damaged_one_is_skipped(s3):
    store = open_store(f"s3://{s3.bucket('ckpts')}/run")
    for step in (1, 2, 3):
        where = ckptstore.save_checkpoint(store, step, state_of(1000, float(step)), keep=2,
                                          part_bytes=1500)
    assert where == "s3://ckpts/run/checkpoints/ckpt-000000003.commit"
    assert [s for s, _ in ckptstore.list_checkpoints(store)] == [2, 3]  # pruned as on disk
    parts = sorted(k for k in s3.keys("ckpts", "run/checkpoints/") if ".part" in k)
    per_step = -(-len(encode_checkpoint(state_of(1000, 1.0))) // 1500)
    assert per_step > 1 and len(parts) == 2 * per_step
    assert all("ckpt-000000001" not in k for k in parts)  # pruned with its record
    assert torch.equal(ckptstore.read_ref(where)["w"], torch.full((1000,), 3.0))
    damaged = next(k for k in parts if "ckpt-000000003" in k)
    s3.client().put_object(Bucket="ckpts", Key=damaged, Body=b"x" * 1500)
    skipped = []
    step, found, state = ckptstore.latest_valid_checkpoint(store, lambda *a: skipped.append(a))
    assert (step, found) == (2, "s3://ckpts/run/checkpoints/ckpt-000000002.commit")
    assert torch.equal(state["w"], torch.full((1000,), 2.0))
    assert skipped == [(where, f"part {damaged.rpartition('/')[2]}: checksum mismatch")]
    s3.client().delete_object(Bucket="ckpts", Key=damaged)
    assert "is missing" in _skip_reason(store)


def _skip_reason(store) -> str:
    skipped = []
    ckptstore.latest_valid_checkpoint(store, lambda *a: skipped.append(a[1]))
    return skipped[0]


SAVE = """
import sys, torch
from dyntrain.elastic.ckptstore import save_checkpoint
from dyntrain.elastic.storage import open_store
save_checkpoint(open_store(sys.argv[1]), int(sys.argv[2]),
                {"w": torch.full((5_000_000,), 2.0)}, part_bytes=64 << 10)
"""


def test_a_writer_killed_mid_upload_leaves_the_previous_checkpoint_newest(s3, tmp_path):
    url = f"s3://{s3.bucket('killed')}/run"
    store = open_store(url)
    ckptstore.save_checkpoint(store, 1, state_of(10, 1.0))
    # 20 MB in 64 KiB parts: about 300 uploads, killed once the first has landed
    writer = subprocess.Popen([sys.executable, "-c", SAVE, url, "2"], cwd=ROOT,
                              env=s3.env(), start_new_session=True)
    try:
        wait_for(lambda: writer.poll() is not None or any(
            "ckpt-000000002" in k for k in s3.keys("killed", "run/checkpoints/")),
            "the first part of step 2 to be uploaded", 120)
        os.killpg(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    keys = s3.keys("killed", "run/checkpoints/")
    assert writer.returncode == -signal.SIGKILL, "it finished before it was killed"
    assert "run/checkpoints/ckpt-000000002.commit" not in keys
    orphans = [k for k in keys if "ckpt-000000002" in k]
    assert orphans and all(".part" in k for k in orphans)
    step, where, state = ckptstore.latest_valid_checkpoint(store)
    assert (step, where) == (1, f"{url}/checkpoints/ckpt-000000001.commit")
    assert ckptstore.newest_step(store) == 1
    ckptstore.save_checkpoint(store, 3, state_of(10, 3.0))  # the next save removes the orphans
    assert not [k for k in s3.keys("killed", "run/checkpoints/") if "ckpt-000000002" in k]


def test_an_unusable_store_is_one_line_naming_it(s3):
    with pytest.raises(StorageError, match=r"^s3://no-such-bucket/run: bucket "
                                           r"'no-such-bucket' does not exist \(endpoint http"):
        open_store("s3://no-such-bucket/run").check()
    with pytest.raises(StorageError, match="not a usable storage URL|unknown|not"):
        open_store("nosuchprotocol://x/y").check()


# ---- dyntrain run --out s3://... --------------------------------------------------------------

DIGITS = ["-m", "dyntrain.workloads.digits", "--epochs", "4"]  # 88 steps, a checkpoint every 20


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant, from one /proc snapshot."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def committed_steps(s3, bucket: str, prefix: str) -> list[int]:
    return sorted(int(k.rpartition("ckpt-")[2].split(".")[0])
                  for k in s3.keys(bucket, f"{prefix}/checkpoints/") if k.endswith(".commit"))


@pytest.mark.slow
def test_a_run_on_s3_whose_processes_are_all_killed_resumes_bitwise_equal(s3, tmp_path):
    """`dyntrain run --out s3://...`: every process of the run (launcher, fork server,
    workers) is SIGKILLed at once; the same command resumes from the newest committed
    checkpoint and ends bitwise equal to a static one-process run."""
    static = subprocess.Popen([sys.executable, *DIGITS], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT,
                              env={**s3.env(), "DYNTRAIN_OUT": str(tmp_path / "static")})
    url = f"s3://{s3.bucket('runs')}/digits"
    command = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "2:2",
               "--out", url, *DIGITS, "--step-delay", "0.01"]
    env = s3.env(PYTHONUNBUFFERED="1")
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                 env=env)
    try:
        wait_for(lambda: first.poll() is not None or committed_steps(s3, "runs", "digits"),
                 "the first committed checkpoint", 180)
        tree = process_tree(first.pid)
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        assert len(tree) >= 3, "launcher and its workers"
    finally:
        first.kill()
        first.wait()
    killed_at = committed_steps(s3, "runs", "digits")[-1]
    assert killed_at < 88, (tmp_path / "first.log").read_text()[-3000:]
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"run folder {url}; local workers' logs in" in again.stdout

    store = open_store(url)
    events = [json.loads(x) for x in linelog.read_lines(store, "events.jsonl")]
    resumed = [e for e in events if e.get("origin") == "checkpoint"]
    assert resumed and resumed[-1]["start_step"] >= killed_at, events
    rows = [json.loads(x) for x in linelog.read_lines(store, "metrics.jsonl")]
    assert rows[-1]["step"] == 88 and {r["step"] for r in rows} >= set(range(killed_at + 1, 89))
    assert json.loads(store.get("result.json"))["steps"] == 88
    assert json.loads(store.get("run.json"))["setup"]["config"]["global_batch"] == 64
    assert {"logs/worker-w0.log", "logs/worker-w1.log"} <= set(store.list("logs"))
    assert static.wait(timeout=240) == 0
    same = subprocess.run([sys.executable, "-m", "dyntrain.cli.main", "compare", "--atol", "0",
                           url, tmp_path / "static"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert same.returncode == 0 and same.stdout.startswith("match: max |a-b| = 0 "), \
        same.stdout + same.stderr


@pytest.mark.parametrize("change, needle", [
    ("bucket", "dyntrain: error: s3://absent-bucket/run: bucket 'absent-bucket' does not exist "
               "(endpoint http"),
    ("key", "dyntrain: error: cannot read s3://present/run: access denied (The AWS Access Key "
            "Id you provided does not exist in our records.); check the credentials"),
    ("endpoint", "dyntrain: error: cannot read s3://present/run (endpoint http://127.0.0.1:9/): "
                 "EndpointConnectionError: Could not connect to the endpoint URL"),
], ids=["no-bucket", "bad-key", "no-endpoint"])
def test_an_unusable_run_folder_is_refused_in_one_line(s3, change, needle):
    if "present" not in s3.buckets:
        s3.bucket("present")
    url = "s3://absent-bucket/run" if change == "bucket" else "s3://present/run"
    env = s3.env(**({"AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG"} if change == "key" else {}),
                 **({"AWS_ENDPOINT_URL": "http://127.0.0.1:9/"} if change == "endpoint" else {}))
    proc = subprocess.run([sys.executable, "-m", "dyntrain.cli.main", "run", "--out", url,
                           *DIGITS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(needle) and proc.stderr.count("\n") == 1, proc.stderr
