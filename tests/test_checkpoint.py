"""Checkpoints round-trip a real training state, reject damage, and survive a crashed write."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from dyntrain.elastic.runs.checkpoint_file import (
    MAGIC,
    CorruptCheckpoint,
    atomic_write_bytes,
    checkpoint_path,
    dumps,
    latest_valid_checkpoint,
    list_checkpoints,
    loads,
    read_checkpoint,
    save_checkpoint,
)

_side_effects: list[str] = []


def _record(what: str) -> str:
    _side_effects.append(what)
    return what


class _Evil:
    """Unpickling this would run ``_record``: what a malicious checkpoint would do."""

    def __reduce__(self):
        return (_record, ("code ran during load",))


def _training_state() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model(torch.randn(16, 4)).pow(2).mean().backward()
    opt.step()
    sched.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": torch.get_rng_state(),
        "step": 7,
        "loss": 0.25,
        "position": (1, 3),
        "name": "run-a",
    }


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


def test_round_trip_of_a_training_state(tmp_path: Path) -> None:
    state = _training_state()
    assert state["optimizer"]["state"], "SGD momentum buffers should exist after one step"
    path = save_checkpoint(tmp_path / "ckpts", 7, state)
    assert path == checkpoint_path(tmp_path / "ckpts", 7)
    assert path.name == "ckpt-000000007.dtck"
    assert path.read_bytes().startswith(MAGIC)
    loaded = read_checkpoint(path)
    _assert_same(state, loaded)
    assert loaded["rng"].dtype == torch.uint8
    assert loaded["model"]["1.num_batches_tracked"].item() == 1
    torch.set_rng_state(loaded["rng"])
    first = torch.rand(3)
    torch.set_rng_state(state["rng"])
    assert torch.equal(first, torch.rand(3))


def test_loads_refuses_unsafe_pickles() -> None:
    data = dumps({"x": _Evil()})
    with pytest.raises(pickle.UnpicklingError):
        loads(data)
    assert _side_effects == []


def test_read_checkpoint_refuses_unsafe_payload_with_valid_checksum(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 1, {"x": _Evil()})
    with pytest.raises(CorruptCheckpoint, match=r"^ckpt-000000001\.dtck: payload cannot be loaded"):
        read_checkpoint(path)
    assert _side_effects == []


def test_loads_refuses_a_payload_that_is_not_a_dict() -> None:
    with pytest.raises(TypeError, match="expected a dict"):
        loads(dumps([1, 2]))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda data: data[:-10], "truncated"),
        (lambda data: data[:5], "truncated"),
        (lambda data: data[: len(MAGIC) + 20], "truncated"),
        (lambda data: b"", "truncated"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]), "checksum mismatch"),
        (lambda data: data[:200] + bytes([data[200] ^ 0x01]) + data[201:], "checksum mismatch"),
        (lambda data: b"NOTACKPT1\n" + data[len(MAGIC) :], "bad magic"),
        (lambda data: data + b"junk", "unexpected bytes"),
    ],
    ids=["tail", "in-magic", "in-header", "empty", "last-byte", "mid-byte", "magic", "extra"],
)
def test_damaged_files_raise_corrupt_checkpoint(tmp_path: Path, damage, reason: str) -> None:
    path = save_checkpoint(tmp_path, 3, _training_state())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CorruptCheckpoint) as info:
        read_checkpoint(path)
    message = str(info.value)
    assert message.startswith("ckpt-000000003.dtck: ")
    assert reason in message
    assert "\n" not in message
    assert info.value.path == path
    assert isinstance(pickle.loads(pickle.dumps(info.value)), CorruptCheckpoint)


def test_latest_valid_falls_back_past_a_corrupt_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {"step": step})
    newest = checkpoint_path(tmp_path, 30)
    newest.write_bytes(newest.read_bytes()[:-3])
    skipped: list[tuple[Path, str]] = []
    result = latest_valid_checkpoint(tmp_path, on_skip=lambda p, why: skipped.append((p, why)))
    assert result is not None
    step, path, state = result
    assert (step, path, state) == (20, checkpoint_path(tmp_path, 20), {"step": 20})
    assert len(skipped) == 1
    assert skipped[0][0] == newest
    assert "truncated" in skipped[0][1]


def test_latest_valid_returns_newest_when_all_intact(tmp_path: Path) -> None:
    for step in (1, 2):
        save_checkpoint(tmp_path, step, {"step": step})
    result = latest_valid_checkpoint(tmp_path, on_skip=lambda p, why: pytest.fail(why))
    assert result is not None
    assert result[0] == 2
    assert result[2] == {"step": 2}


def test_latest_valid_is_none_when_nothing_usable(tmp_path: Path) -> None:
    assert latest_valid_checkpoint(tmp_path / "missing") is None
    assert latest_valid_checkpoint(tmp_path) is None
    checkpoint_path(tmp_path, 1).write_bytes(b"garbage")
    skipped: list[Path] = []
    assert latest_valid_checkpoint(tmp_path, on_skip=lambda p, why: skipped.append(p)) is None
    assert skipped == [checkpoint_path(tmp_path, 1)]


def test_keep_prunes_the_oldest(tmp_path: Path) -> None:
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, {"step": step}, keep=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000004.dtck",
        "ckpt-000000005.dtck",
    ]


def test_keep_never_prunes_the_file_just_written(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 30, {"step": 30})
    path = save_checkpoint(tmp_path, 20, {"step": 20}, keep=1)
    assert read_checkpoint(path) == {"step": 20}
    assert [step for step, _ in list_checkpoints(tmp_path)] == [20, 30]


def test_keep_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, 1, {}, keep=0)
    assert list_checkpoints(tmp_path) == []


def test_list_checkpoints_ignores_other_files(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 12, {})
    save_checkpoint(tmp_path, 3, {})
    big = save_checkpoint(tmp_path, 1_234_567_890, {})
    for name in (
        ".ckpt-000000099.dtck.abc123.tmp",
        "ckpt-000000099.dtck.tmp",
        "ckpt-000000099.dtck~",
        "ckpt-99.dtck",
        "ckpt-00000000x.dtck",
        "notes.txt",
    ):
        (tmp_path / name).write_bytes(b"x")
    assert list_checkpoints(tmp_path) == [
        (3, checkpoint_path(tmp_path, 3)),
        (12, checkpoint_path(tmp_path, 12)),
        (1_234_567_890, big),
    ]
    assert list_checkpoints(tmp_path / "missing") == []


def test_save_leaves_other_writers_tmp_files_alone(tmp_path: Path) -> None:
    foreign = tmp_path / ".ckpt-000000005.dtck.other.tmp"
    foreign.write_bytes(b"in progress")
    for step in range(1, 4):
        save_checkpoint(tmp_path, step, {}, keep=1)
    assert foreign.read_bytes() == b"in progress"


def test_checkpoint_path_rejects_negative_steps(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        checkpoint_path(tmp_path, -1)


def test_atomic_write_replaces_and_leaves_no_tmp(tmp_path: Path) -> None:
    target = tmp_path / "file.bin"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_crash_during_write_keeps_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    previous = save_checkpoint(tmp_path, 1, {"step": 1})
    before = previous.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("simulated crash")

    monkeypatch.setattr(os, failing, crash)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, 2, {"step": 2})
    monkeypatch.undo()

    assert previous.read_bytes() == before
    assert read_checkpoint(previous) == {"step": 1}
    assert not checkpoint_path(tmp_path, 2).exists()
    assert [p.name for p in tmp_path.iterdir()] == [previous.name]
    assert latest_valid_checkpoint(tmp_path)[0] == 1
