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

from conftest import ROOT
from dyntrain.elastic.runs import checkpoints, linefile
from dyntrain.elastic.runs.checkpoint_file import encode_checkpoint
from dyntrain.elastic.runs.folder import RunFolderMismatch
from dyntrain.elastic.runs.log import read_metrics
from dyntrain.elastic.runs.storage import StorageError, open_store
from dyntrain.lab.noise import load_noise
from dyntrain.testing.wait import wait_until
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


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_files_are_put_listed_read_and_deleted(s3, kind, tmp_path):
    url = f"s3://{s3.bucket('files')}/run" if kind == "s3" else str(tmp_path / "run")
    store = open_store(url)
    store.check()
    store.put("run.json", b"{}")
    store.put_many({"logs/a.log": b"a", "logs/b.log": b"bb", "logs/x/c.log": b"c"})
    assert store.list() == {"run.json": 2}
    assert store.list("logs") == {"logs/a.log": 1, "logs/b.log": 2}
    assert store.list_folders() == ["logs"] and store.list_folders("logs") == ["logs/x"]
    assert store.list_folders("absent") == []
    assert store.get("logs/b.log") == b"bb" and store.get("run.json", 1, 2) == b"}"
    assert store.exists("run.json") and not store.exists("final.pt")
    with pytest.raises(FileNotFoundError):
        store.get("final.pt")
    store.delete(["logs/a.log", "logs/missing.log"])
    assert store.list("logs") == {"logs/b.log": 2}
    assert store.where("final.pt") == f"{url}/final.pt"


def test_line_files_are_segments_read_back_in_order_across_writers(s3):
    store = open_store(f"s3://{s3.bucket('lines')}/run")
    first = linefile.open_lines(store, "metrics.jsonl", flush_seconds=60, segment_bytes=100)
    for step in range(1, 11):
        first.write(json.dumps({"step": step, "b_simple": 10.0 * step}))
    first.flush()  # what a reader sees before the writer closes
    assert [json.loads(x)["step"] for x in linefile.read_lines(store, "metrics.jsonl")] == \
        list(range(1, 11))
    first.write(json.dumps({"step": 11, "b_simple": 110.0}))
    first.close()
    second = linefile.open_lines(store, "metrics.jsonl")  # a resumed run: segments after those
    second.write(json.dumps({"step": 12, "b_simple": 120.0}), urgent=True)
    wait_until(lambda: len(linefile.read_lines(store, "metrics.jsonl")) == 12,
               "the urgent line to be uploaded by the writer's thread", 30)
    second.close()
    rows = [json.loads(x) for x in linefile.read_lines(store, "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, 13))
    # segments closed at 100 bytes or more (4 rows of 30 bytes); the second writer's own
    keys = s3.keys("lines", "run/")
    assert sorted(keys) == [f"run/metrics.jsonl.d/{n:08d}.jsonl" for n in (1, 2, 3, 4)]
    assert keys["run/metrics.jsonl.d/00000004.jsonl"] == len(json.dumps(rows[-1])) + 1
    # byte offsets run across the segments as if they were one file
    whole = linefile.read_bytes(store, "metrics.jsonl")
    assert linefile.read_bytes(store, "metrics.jsonl", 150, 100) == whole[150:250]
    assert linefile.size(store, "metrics.jsonl") == len(whole)
    # the lab reads the run folder's metrics by URL
    noise = load_noise("s3://lines/run")
    assert noise.steps == list(range(1, 13)) and noise.name == "run"
    assert noise.path == "s3://lines/run/metrics.jsonl"


def test_lines_refused_by_the_store_are_kept_and_written_once_it_accepts(s3):
    """A bucket that is not there yet: the writer says so once, keeps the lines, and writes
    them all at a later flush."""
    store = open_store("s3://late-bucket/run")
    told = []
    lines = linefile.open_lines(store, "events.jsonl", flush_seconds=60, on_error=told.append)
    lines.write('{"n": 1}')
    lines.flush()
    lines.write('{"n": 2}')
    lines.flush()
    assert len(told) == 1 and told[0].startswith("cannot write events.jsonl now (tried again "
                                                 "every 60 s): ")
    s3.bucket("late-bucket")
    lines.close()
    assert told[1:] == ["events.jsonl is written again"]
    assert linefile.read_lines(store, "events.jsonl") == ['{"n": 1}', '{"n": 2}']


def state_of(size: int, value: float) -> dict:
    return {"w": torch.full((size,), value), "step": torch.tensor(1)}


def test_only_committed_checkpoints_are_seen_and_a_damaged_one_is_skipped(s3):
    store = open_store(f"s3://{s3.bucket('ckpts')}/run")
    for step in (1, 2, 3):
        where = checkpoints.save_checkpoint(store, step, state_of(1000, float(step)), keep=2,
                                          part_bytes=1500)
    assert where == "s3://ckpts/run/checkpoints/ckpt-000000003.commit"
    assert [s for s, _ in checkpoints.list_checkpoints(store)] == [2, 3]  # pruned as on disk
    parts = sorted(k for k in s3.keys("ckpts", "run/checkpoints/") if ".part" in k)
    per_step = -(-len(encode_checkpoint(state_of(1000, 1.0))) // 1500)
    assert per_step > 1 and len(parts) == 2 * per_step
    assert all("ckpt-000000001" not in k for k in parts)  # pruned with its record
    assert torch.equal(checkpoints.read_ref(where)["w"], torch.full((1000,), 3.0))
    damaged = next(k for k in parts if "ckpt-000000003" in k)
    s3.client().put_object(Bucket="ckpts", Key=damaged, Body=b"x" * 1500)
    skipped = []
    step, found, state = checkpoints.latest_valid_checkpoint(store, lambda *a: skipped.append(a))
    assert (step, found) == (2, "s3://ckpts/run/checkpoints/ckpt-000000002.commit")
    assert torch.equal(state["w"], torch.full((1000,), 2.0))
    assert skipped == [(where, f"part {damaged.rpartition('/')[2]}: checksum mismatch")]
    s3.client().delete_object(Bucket="ckpts", Key=damaged)
    assert "is missing" in _skip_reason(store)


def _skip_reason(store) -> str:
    skipped = []
    checkpoints.latest_valid_checkpoint(store, lambda *a: skipped.append(a[1]))
    return skipped[0]


SAVE = """
import sys, torch
from dyntrain.elastic.runs.checkpoints import save_checkpoint
from dyntrain.elastic.runs.storage import open_store
save_checkpoint(open_store(sys.argv[1]), int(sys.argv[2]),
                {"w": torch.full((5_000_000,), 2.0)}, part_bytes=64 << 10)
"""


def test_a_writer_killed_mid_upload_leaves_the_previous_checkpoint_newest(s3, tmp_path):
    url = f"s3://{s3.bucket('killed')}/run"
    store = open_store(url)
    checkpoints.save_checkpoint(store, 1, state_of(10, 1.0))
    # 20 MB in 64 KiB parts: about 300 uploads, killed once the first has landed
    writer = subprocess.Popen([sys.executable, "-c", SAVE, url, "2"], cwd=ROOT,
                              env=s3.env(), start_new_session=True)
    try:
        wait_until(lambda: writer.poll() is not None or any(
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
    step, where, state = checkpoints.latest_valid_checkpoint(store)
    assert (step, where) == (1, f"{url}/checkpoints/ckpt-000000001.commit")
    assert checkpoints.newest_step(store) == 1
    checkpoints.save_checkpoint(store, 3, state_of(10, 3.0))  # the next save removes the orphans
    assert not [k for k in s3.keys("killed", "run/checkpoints/") if "ckpt-000000002" in k]


def test_an_unusable_store_is_one_line_naming_it(s3):
    with pytest.raises(StorageError, match=r"^s3://no-such-bucket/run: bucket "
                                           r"'no-such-bucket' does not exist \(endpoint http"):
        open_store("s3://no-such-bucket/run").check()
    with pytest.raises(StorageError, match=r"^nosuchprotocol://x/y: not a usable storage URL "
                                           r"\(Protocol not known: nosuchprotocol\)$"):
        open_store("nosuchprotocol://x/y")


def test_a_script_alone_writes_and_resumes_a_run_folder_on_s3(s3, capsys):
    """``ElasticTrainer`` without a coordinator, its output folder a URL (``DYNTRAIN_OUT``)."""
    from test_runfolder import trainer

    url = f"s3://{s3.bucket('alone')}/run"
    first = trainer(url, epochs=2)
    first.fit()
    first.report(accuracy=0.5)
    store = open_store(url)
    assert json.loads(store.get("result.json")) == {"accuracy": 0.5}
    assert [r.step for r in read_metrics(store)] == list(range(1, 9))
    assert store.exists("final.pt") and store.exists("run.json")
    again = trainer(url, epochs=2)
    again.fit()
    shown = capsys.readouterr().out
    assert f"resuming from step 8 ({url}/checkpoints/ckpt-000000008.commit)" in shown
    assert f"model in {url}/final.pt" in shown and again.step == 8
    with pytest.raises(RunFolderMismatch, match=rf"^{url} holds a run started with other "
                                                r"settings: optimizer lr 0.1 -> 0.05"):
        trainer(url, epochs=2, lr=0.05).fit()


# ---- dyntrain run --out s3://... --------------------------------------------------------------

DIGITS = ["-m", "dyntrain.workloads.digits", "--epochs", "4"]  # 88 steps, a checkpoint every 20
SHORT = ["-m", "dyntrain.workloads.digits", "--epochs", "1"]  # 22 steps


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


# ---- the service ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_service_job_keeps_its_run_folder_on_s3(s3, tmp_path):
    """An elastic job submitted with DYNTRAIN_OUT=s3://... : its workers and the service's
    coordinator write the run folder there; the service keeps only the logs; the dashboard
    reads the job's metrics and checkpoints from the bucket."""
    import httpx

    from conftest import start_server, stop_server
    from dyntrain.service.client import ApiError, Client

    url = f"s3://{s3.bucket('service-runs')}/job"
    state = tmp_path / "state"
    server, api = start_server(state, tmp_path / "server.log")  # this process's environment
    try:
        with Client(api) as client:
            with pytest.raises(ApiError, match=r"DYNTRAIN_OUT='/tmp/x': a job's run folder "
                                                  r"can only be moved to an object store"):
                client.submit(queue="default", command=[sys.executable, *DIGITS],
                              environment={"DYNTRAIN_OUT": "/tmp/x"})
            with pytest.raises(ApiError, match=r"DYNTRAIN_OUT: nosuch://b/x: not a usable "
                                               r"storage URL"):
                client.submit(queue="default", command=[sys.executable, *DIGITS],
                              environment={"DYNTRAIN_OUT": "nosuch://b/x"})
            job = client.submit(queue="default", command=[sys.executable, *SHORT],
                                workers={"min": 1, "max": 1}, environment={"DYNTRAIN_OUT": url},
                                resources={"cpus": 0.5, "memory_mib": 256})
            final = wait_until(lambda: (j := client.get_job(job["id"]))["status"] in
                               ("SUCCEEDED", "FAILED") and j, "the job to end", 240)
            assert final["status"] == "SUCCEEDED", final["status_reason"]
            page = httpx.get(f"{api}/ui/jobs/{job['id']}", timeout=30).text
            series = httpx.get(f"{api}/ui/data/jobs/{job['id']}/series", timeout=30).json()
    finally:
        stop_server(server)
    store = open_store(url)
    assert json.loads(store.get("result.json"))["steps"] == 22
    assert [s for s, _ in checkpoints.list_checkpoints(store)] == [20, 22]
    assert json.loads(store.get("coordinator.json"))["job"] == f"{job['id']}/attempt-1"
    assert torch.load(__import__("io").BytesIO(store.get("final.pt")), weights_only=True)
    assert [r.step for r in read_metrics(store)] == list(range(1, 23))
    # the hosted coordinator's TensorBoard events (on by default: tensorboard is installed here)
    assert len([n for n in store.list("tensorboard") if ".tfevents." in n]) == 1
    assert "ckpt-000000022.commit" in page
    assert series["rows"]["step"] == list(range(1, 23))
    local = state / "runs" / "jobs" / job["id"]
    assert sorted(p.name for p in local.iterdir()) == ["coordinator.json", "coordinator.secret",
                                                       "logs"]


# ---- sharded checkpoints (torch's DCP format) on an object store ------------------------------


def _dcp_folders(store) -> dict[int, str]:
    """The committed DCP checkpoints: step -> the folder of their files, from the records."""
    return {step: json.loads(store.get(name))["folder"]
            for step, name in checkpoints.list_checkpoints(store)}


@pytest.mark.slow
def test_sharded_checkpoints_go_to_s3_from_every_member_and_resume_a_crash_elsewhere(
        s3, tmp_path, tmp_path_factory):
    """At level 2 every member uploads its share of each checkpoint into its generation's
    folder and the leader commits it last; torch reads one straight from the bucket; with the
    newest checkpoints gone or damaged, a level-3 job of 3 resumes from an older one on S3, a
    SIGKILL with ``r = 1`` rolls it back to the one it wrote there, and it ends bitwise the
    unsharded static run."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from conftest import run_cli
    from test_gpt_workload import SMALL, static_small
    from test_sharded import _same_final

    static = static_small(tmp_path_factory)  # level 0, full-format checkpoints
    url = f"s3://{s3.bucket('sharded')}/run"
    gpt = ["-m", "dyntrain.workloads.gpt", *SMALL]
    run_cli(["run", "--workers", "2", "--nproc", "2", "--out", url, *gpt, "--shard", "2"],
            check=True)
    store = open_store(url)
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "final.pt").write_bytes(store.get("final.pt"))
    _same_final(static, tmp_path / "final")
    folders = _dcp_folders(store)
    assert sorted(folders) == [12, 16, 20]  # 3 kept, the older pruned with their files
    assert store.list_folders("checkpoints") == [f"checkpoints/{f}" for f in folders.values()]
    for step, folder in folders.items():
        assert folder.startswith(f"ckpt-{step:09d}.g") and folder.endswith(".dcp")
        files = store.list(f"checkpoints/{folder}")
        assert {n.rpartition("/")[2] for n in files} == {".metadata", "__0_0.distcp",
                                                         "__1_0.distcp"}
        shares = [files[f"checkpoints/{folder}/__{rank}_0.distcp"] for rank in (0, 1)]
        assert min(shares) > 0.4 * sum(shares), shares  # r = 2: each member wrote about half
    # torch's own reader, straight from the bucket: the static run's state at step 20
    got: dict = {}
    _load_state_dict(got, storage_reader=FsspecReader(f"{url}/checkpoints/{folders[20]}"),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    _, _, ref = checkpoints.latest_valid_checkpoint(open_store(str(static)))
    assert got["step"] == ref["step"] == 20
    assert all(torch.equal(got["model"][k], v) for k, v in ref["model"].items())
    for k, v in ref["optimizer"]["state"].items():
        assert all(torch.equal(v[key], got["optimizer"]["state"][str(k)][key]) for key in v)

    # step 20's record gone (as if its commit never happened), a file of step 16's damaged
    store.delete(["checkpoints/ckpt-000000020.dcp", "final.pt"])
    damaged = f"checkpoints/{folders[16]}/__1_0.distcp"
    size = len(data := store.get(damaged))
    store.put(damaged, data[:-100])
    skipped = []
    step, where, _ = checkpoints.latest_valid_checkpoint(
        store, on_skip=lambda w, why: skipped.append((w, why)))
    assert step == 12 and where == f"{url}/checkpoints/ckpt-000000012.dcp"
    assert skipped == [(f"{url}/checkpoints/ckpt-000000016.dcp",
                        f"file __1_0.distcp has {size - 100} of {size} bytes")]

    proc = run_cli(["run", "--workers", "2:3", "--nproc", "3", "--out", url, "--events",
                    "step=18:kill=1", *gpt, "--shard", "3", "--shard-redundancy", "1"],
                   check=True)
    out = proc.stdout + proc.stderr
    assert f"from step 12 (checkpoint {url}/checkpoints/ckpt-000000012.dcp" in out, out
    assert "lost the optimizer state of" in out and "(shard_redundancy 1)" in out, out
    assert "resuming from the newest checkpoint (step 16)" in out, out
    assert f"from step 16 (checkpoint {url}/checkpoints/ckpt-000000016.dcp" in out, out
    (tmp_path / "final" / "final.pt").write_bytes(store.get("final.pt"))
    _same_final(static, tmp_path / "final")
    folders = _dcp_folders(store)
    assert sorted(folders) == [12, 16, 20]
    # the first launch's folders of steps 16 and 20 (damaged, uncommitted) are gone
    assert store.list_folders("checkpoints") == [f"checkpoints/{f}" for f in folders.values()]
    names = {n.rpartition("/")[2] for n in store.list(f"checkpoints/{folders[20]}")}
    assert names == {".metadata", "__0_0.distcp", "__1_0.distcp"}  # the 2 left after the kill
    # as `dyntrain` and the dashboard list them: each the bytes of all its files
    listed = checkpoints.describe_checkpoints(store)
    assert [(c.step, c.name) for c in listed] == [
        (s, f"ckpt-{s:09d}.dcp") for s in (20, 16, 12)]
    assert listed[0].size_bytes == sum(store.list(f"checkpoints/{folders[20]}").values())
    assert listed[0].written_at > 0


def test_a_dcp_commit_record_that_does_not_check_out_is_skipped_with_its_reason(s3):
    """Bad input in the bucket: a record that is not JSON, one naming another step's folder,
    one naming a file outside its folder; none is read, each skip says why."""
    store = open_store(f"s3://{s3.bucket('dcp-bad')}/run")
    store.put("checkpoints/ckpt-000000008.dcp", b"not json")
    store.put("checkpoints/ckpt-000000012.dcp", json.dumps(
        {"format": 1, "folder": "ckpt-000000008.g1.ab.dcp", "files": {}}).encode())
    store.put("checkpoints/ckpt-000000016.dcp", json.dumps(
        {"format": 1, "folder": "ckpt-000000016.g1.ab.dcp",
         "files": {"../x": {"size": 1, "sha256": "0"}}}).encode())
    skipped = []
    assert checkpoints.latest_valid_checkpoint(
        store, on_skip=lambda where, why: skipped.append(why)) is None
    assert skipped[0] == "not a commit record (bad file entry '../x')"
    assert skipped[1] == ("not a commit record (folder 'ckpt-000000008.g1.ab.dcp' is not this "
                          "step's)")
    assert skipped[2].startswith("not a commit record (Expecting value")
