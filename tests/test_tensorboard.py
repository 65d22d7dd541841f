"""TensorBoard event files in run folders, read back with TensorBoard's own event reader."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT, SCRIPTS, read_jsonl, run_cli
from dyntrain.elastic.runs import tensorboard
from dyntrain.elastic.runs.rows import EventKind, EventRow, MetricsRow, NoiseScale
from dyntrain.elastic.runs.storage import LocalStore, open_store
from dyntrain.extras import MissingExtra

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_board(folder):
    """Every scalar series ({tag: [(step, value)]}) and text event ([(step, text)]) in
    ``folder``, as TensorBoard reads them."""
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
               for tag in acc.Tags()["scalars"]}
    texts = []
    for tag in acc.Tags()["tensors"]:
        for e in acc.Tensors(tag):
            texts += [(e.step, t.decode()) for t in e.tensor_proto.string_val]
    return scalars, texts


@pytest.mark.slow
def test_a_run_with_a_join_mirrors_its_rows_into_tensorboard(tmp_path):
    """A real `dyntrain run` of the ledger script that grows from 1 to 2 workers: every metrics
    row's loss, learning rate, samples/s and world size is a scalar at the row's step, and the
    start and the join are text events at the step each world started from."""
    out = tmp_path / "run"
    proc = run_cli(["run", "--workers", "1:2", "--nproc", "1", "--events", "step=30:join=1",
                    "--tensorboard", "--out", out, SCRIPTS / "ledger_train.py", "--epochs", "12",
                    "--step-delay", "0.002"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    events = read_jsonl(out / "events.jsonl")
    scalars, texts = read_board(out / "tensorboard")
    assert [r["step"] for r in rows] == list(range(1, 12 * 6 + 1))
    for tag, field in [("train/loss", "loss"), ("train/lr", "lr"),
                       ("train/samples_per_s", "samples_per_s"),
                       ("train/world_size", "world_size")]:
        assert [s for s, _ in scalars[tag]] == [r["step"] for r in rows], tag
        assert [v for _, v in scalars[tag]] == pytest.approx([r[field] for r in rows],
                                                             rel=1e-6), tag
    assert {v for _, v in scalars["train/world_size"]} == {1.0, 2.0}
    assert [v for _, v in scalars["train/lr"]] == [16.0] * len(rows)  # the first group's lr
    assert [k for k, _ in enumerate(texts)] == list(range(len(events)))
    for (step, text), event in zip(texts, events, strict=True):
        assert step == event["start_step"]
        assert text.startswith(f"{event['event']} ") and (
            f"world {event['world_before']} -> {event['world_after']}") in text, text
    assert [e["event"] for e in events] == ["start", "join"]


@pytest.mark.slow
def test_a_resumed_run_appends_and_no_tensorboard_writes_none(tmp_path):
    """A script trained alone into a folder, then again with more epochs (it resumes): both
    event files are there and TensorBoard reads them as one run from step 1 to the end;
    ``--no-tensorboard`` (here: ``tensorboard=False`` alone) writes no folder."""
    out, off = tmp_path / "run", tmp_path / "off"
    with ThreadPoolExecutor(max_workers=1) as pool:  # the --no-tensorboard run meanwhile
        unmirrored = pool.submit(run_cli, ["run", "--no-tensorboard", "--out", off,
                                           SCRIPTS / "ledger_train.py", "--epochs", "2"])
        env = {**os.environ, "DYNTRAIN_OUT": str(out)}
        env.pop("DYNTRAIN_COORDINATOR", None)
        for epochs in ("4", "6"):
            subprocess.run([sys.executable, str(SCRIPTS / "ledger_train.py"), "--epochs",
                            epochs], env=env, check=True, timeout=240, cwd=ROOT,
                           capture_output=True)
        proc = unmirrored.result()
    assert len(list((out / "tensorboard").iterdir())) == 2
    scalars, _ = read_board(out / "tensorboard")
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 6 * 6 + 1))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert (off / "metrics.jsonl").exists() and not (off / "tensorboard").exists()


def test_validation_noise_and_membership_rows_become_scalars_and_text(tmp_path):
    """The mirror alone: validation fields under val/, the noise scale under noise/, a
    membership change as text at the step its world started from."""
    board = tensorboard.TensorBoardMirror(LocalStore(tmp_path))
    board.metrics(MetricsRow(step=3, loss=0.5, lr=0.1, world_size=2, samples_per_s=100.0,
                             time=1000.0, noise=NoiseScale(12.5, 9.0, 0.2, 2.5),
                             validation={"val_accuracy": 0.75, "val_seconds": 0.01}))
    board.event(EventRow(EventKind.LEAVE, ("w1",), world_before=2, world_after=1,
                         generation=3, start_step=3, latency_s=0.25))
    board.close()
    scalars, texts = read_board(tmp_path / "tensorboard")
    assert scalars["val/accuracy"] == [(3, 0.75)]
    assert scalars["noise/b_simple"] == [(3, 12.5)]
    assert scalars["noise/trace_sigma"] == [(3, 2.5)]
    assert scalars["train/lr"] == [(3, pytest.approx(0.1))]
    assert texts == [(3, "leave w1: world 2 -> 1 (generation 3, steps redone 0, "
                         "latency 0.250 s)")]


def test_an_object_store_run_folder_gets_the_event_files(tmp_path):
    """On an fsspec store (here ``memory://``) the events are written locally and uploaded to
    the folder's ``tensorboard/`` when the writer closes."""
    store = open_store("memory://tb-test/run")
    board = tensorboard.TensorBoardMirror(store)
    board.metrics(MetricsRow(step=1, loss=2.0, time=1000.0))
    board.close()
    names = [n for n in store.list("tensorboard") if "tfevents" in n]
    assert len(names) == 1
    local = tmp_path / "copy"
    local.mkdir()
    (local / names[0].rpartition("/")[2]).write_bytes(store.get(names[0]))
    assert read_board(local)[0]["train/loss"] == [(1, 2.0)]


def test_asking_for_tensorboard_without_it_is_one_line(monkeypatch):
    monkeypatch.setattr(tensorboard, "available", lambda: False)
    assert tensorboard.wanted(None) is False and tensorboard.wanted(False) is False
    with pytest.raises(MissingExtra) as err:
        tensorboard.wanted(True, "--tensorboard")
    assert str(err.value) == ("--tensorboard needs tensorboard, which is not installed: "
                              "pip install 'dyntrain[tensorboard]'")
    assert json.dumps(str(err.value)).count("\\n") == 0
