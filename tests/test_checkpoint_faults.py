"""A checkpoint that cannot be written does not end the run: the run folder's ``checkpoints/``
on a file system of its own (a tmpfs) is made read-only while a job trains, and writable again.
The periodic checkpoint that falls in between is not written; the worker says so, with the cause,
in its log and through the coordinator on the launcher's terminal, and trains on; the next due
checkpoint is written, nothing half-written is left behind, and the model is the static run's to
the bit. A forced checkpoint (the last step's, or the state to resume from when every worker
leaves) that cannot be written is an error naming the step and the cause."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import torch

from conftest import DYNTRAIN, ROOT, read_jsonl
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.runs.checkpoints import FOLDER, latest_valid_checkpoint, list_checkpoints
from dyntrain.elastic.runs.storage import open_store
from dyntrain.elastic.sharding.strategy import Replicated
from dyntrain.elastic.state import TrainingParts
from dyntrain.elastic.worker.writer import RunWriter
from dyntrain.testing.wait import wait_until
from test_gpt_workload import SMALL, static_small
from test_sharded import _same_final

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")

WARNING = re.compile(r"checkpoint of step (\d+) not written \((.*)\); training goes on")


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    return static_small(tmp_path_factory)


@pytest.fixture
def checkpoint_disk(tmp_path):
    """A run folder whose ``checkpoints/`` is a tmpfs of its own, and a function that makes it
    writable (True) or read-only (False); unmounted even when the test fails."""
    out = tmp_path / "run"
    where = out / FOLDER
    where.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(where)], check=True)

    def writable(yes: bool) -> None:
        subprocess.run(["mount", "-o", f"remount,{'rw' if yes else 'ro'}", str(where)],
                       check=True)

    try:
        yield out, writable
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _last_step(out) -> int:
    rows = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    return max((r["step"] for r in rows if "step" in r), default=0)


def _warning(out):
    for log in sorted((out / "logs").glob("worker-*.log")):
        if m := WARNING.search(log.read_text(errors="replace")):
            return m
    return None


@pytest.mark.slow
@pytest.mark.parametrize("level", ["0", "1"])
def test_a_checkpoint_the_disk_refuses_is_said_and_the_training_goes_on(
        checkpoint_disk, static, level):
    out, writable = checkpoint_disk
    log = out.parent / "run.log"
    # SMALL: 20 steps, a checkpoint every 4; half a second a step leaves the test seconds to
    # make the disk writable again before the last step's checkpoint, which must be written
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [*DYNTRAIN, "run", "--workers", "2:2", "--nproc", "2", "--out", str(out), "-m",
             "dyntrain.workloads.gpt", *SMALL, "--shard", level, "--step-delay", "0.5"],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: _last_step(out) >= 5, "step 5 (the checkpoint of step 4 written)")
        writable(False)
        failed = wait_until(lambda: _warning(out), "a worker saying a checkpoint was not written")
        writable(True)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    step = int(failed.group(1))
    assert step % 4 == 0 and 8 <= step < 20, failed.group(0)
    assert "Read-only file system" in failed.group(2)
    # the coordinator relayed it to the launcher's terminal, naming the worker
    assert re.search(rf"\S+: checkpoint of step {step} not written \(.*Read-only", log.read_text())
    store = open_store(str(out), "out")
    newest, _, _ = latest_valid_checkpoint(store)
    assert newest == 20
    # only committed checkpoints are left: no part of the refused one, no staging folder
    names = sorted(p.name for p in (out / FOLDER).iterdir())
    assert names == sorted(name.rpartition("/")[2] for _, name in list_checkpoints(store)), names
    _same_final(static, out)
    assert (out / "result.json").read_text() == (static / "result.json").read_text()


def test_a_forced_checkpoint_that_cannot_be_written_is_an_error_naming_the_step(
        checkpoint_disk, capsys):
    out, writable = checkpoint_disk
    model = torch.nn.Linear(3, 2)
    parts = TrainingParts(model, torch.optim.SGD(model.parameters(), lr=0.1))
    writer = RunWriter(open_store(str(out), "out"), TrainConfig(8, 2, checkpoint_every_steps=2),
                       parts, steps_per_epoch=10, sharding=Replicated(parts.optimizer))
    writer.maybe_checkpoint(2)
    writable(False)
    writer.maybe_checkpoint(4)  # periodic: said, and nothing raised
    said = capsys.readouterr().err
    assert re.search(r"worker alone: checkpoint of step 4 not written \(.*Read-only", said), said
    with pytest.raises(OSError, match=r"checkpoint of step 6 not written: .*Read-only"):
        writer.maybe_checkpoint(6, force=True)
    writable(True)
    writer.maybe_checkpoint(8)
    assert [s for s, _ in list_checkpoints(open_store(str(out), "out"))] == [2, 8]
