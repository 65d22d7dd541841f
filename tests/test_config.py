"""TrainConfig validates on construction and derives step counts and a settings fingerprint."""

from __future__ import annotations

import dataclasses
import re

import pytest

from dyntrain.elastic.config import TrainConfig
from dyntrain.errors import ConfigError, DyntrainError


def test_config_error_is_a_dyntrain_error_and_a_value_error() -> None:
    assert issubclass(ConfigError, DyntrainError)
    assert issubclass(ConfigError, ValueError)
    with pytest.raises(DyntrainError):
        TrainConfig(global_batch=10, chunk_size=3)
    with pytest.raises(ValueError):
        TrainConfig(global_batch=10, chunk_size=3)


def test_valid_config_and_num_chunks() -> None:
    cfg = TrainConfig(global_batch=64, chunk_size=8)
    assert cfg.num_chunks == 8
    assert TrainConfig(global_batch=8, chunk_size=8).num_chunks == 1
    assert TrainConfig(global_batch=9, chunk_size=1).num_chunks == 9


@pytest.mark.parametrize(
    ("global_batch", "chunk_size", "divisors"),
    [
        (10, 3, {1, 2, 5, 10}),
        (64, 12, {1, 2, 4, 8, 16, 32, 64}),
        (30, 7, {1, 2, 3, 5, 6, 10, 15, 30}),
        (6, 8, {1, 2, 3, 6}),  # chunk larger than the whole batch
        (7, 2, {1, 7}),
    ],
)
def test_batch_not_multiple_of_chunk(global_batch: int, chunk_size: int, divisors: set) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(global_batch=global_batch, chunk_size=chunk_size)
    message = str(info.value)
    numbers = [int(n) for n in re.findall(r"\d+", message)]
    assert global_batch in numbers
    assert chunk_size in numbers
    # it suggests a smaller chunk size that actually divides the global batch
    assert any(n in divisors and n <= chunk_size for n in numbers), message


def test_divisor_suggestion_is_a_usable_chunk_size() -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(global_batch=64, chunk_size=12)
    message = str(info.value)
    # the largest divisor of 64 not above 12 is 8 (worked out by hand)
    assert "8" in re.findall(r"\d+", message)
    TrainConfig(global_batch=64, chunk_size=8)  # the suggestion is accepted


@pytest.mark.parametrize(
    "kwargs",
    [
        {"global_batch": 0, "chunk_size": 1},
        {"global_batch": -8, "chunk_size": 2},
        {"global_batch": 8, "chunk_size": 0},
        {"global_batch": 8, "chunk_size": -2},
        {"global_batch": 8, "chunk_size": 2, "epochs": 0},
        {"global_batch": 8, "chunk_size": 2, "epochs": -1},
        {"global_batch": 8, "chunk_size": 2, "max_steps": 0},
        {"global_batch": 8, "chunk_size": 2, "max_steps": -5},
        {"global_batch": 8, "chunk_size": 2, "checkpoint_every_steps": 0},
        {"global_batch": 8, "chunk_size": 2, "checkpoint_every_seconds": 0.0},
        {"global_batch": 8, "chunk_size": 2, "checkpoint_every_seconds": -1.5},
        {"global_batch": 8, "chunk_size": 2, "keep_checkpoints": 0},
    ],
)
def test_non_positive_values_rejected(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        TrainConfig(**kwargs)


def test_optional_values_accept_none_and_positive() -> None:
    cfg = TrainConfig(
        global_batch=8,
        chunk_size=2,
        max_steps=1,
        checkpoint_every_steps=1,
        checkpoint_every_seconds=0.5,
        keep_checkpoints=1,
    )
    assert cfg.max_steps == 1
    TrainConfig(global_batch=8, chunk_size=2, max_steps=None, checkpoint_every_steps=None)


@pytest.mark.parametrize("backend", ["auto", "gloo", "nccl"])
def test_backend_accepted(backend: str) -> None:
    assert TrainConfig(global_batch=4, chunk_size=2, backend=backend).backend == backend


@pytest.mark.parametrize("backend", ["mpi", "", "GLOO", "nccl "])
def test_backend_rejected(backend: str) -> None:
    with pytest.raises(ConfigError, match="backend"):
        TrainConfig(global_batch=4, chunk_size=2, backend=backend)


def test_config_is_frozen() -> None:
    cfg = TrainConfig(global_batch=4, chunk_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.global_batch = 8  # type: ignore[misc]


def test_steps_per_epoch_drops_the_remainder() -> None:
    cfg = TrainConfig(global_batch=32, chunk_size=8)
    assert cfg.steps_per_epoch(32) == 1
    assert cfg.steps_per_epoch(63) == 1
    assert cfg.steps_per_epoch(64) == 2
    assert cfg.steps_per_epoch(1000) == 31  # 31 * 32 = 992


@pytest.mark.parametrize("dataset_size", [0, 1, 31])
def test_dataset_smaller_than_a_global_batch(dataset_size: int) -> None:
    cfg = TrainConfig(global_batch=32, chunk_size=8)
    with pytest.raises(ConfigError) as info:
        cfg.steps_per_epoch(dataset_size)
    assert str(dataset_size) in str(info.value)
    assert "32" in str(info.value)
    with pytest.raises(ConfigError):
        cfg.total_steps(dataset_size)


def test_total_steps_with_epochs_and_max_steps() -> None:
    # 100 samples, batch 32 -> 3 steps per epoch
    assert TrainConfig(global_batch=32, chunk_size=8, epochs=1).total_steps(100) == 3
    assert TrainConfig(global_batch=32, chunk_size=8, epochs=4).total_steps(100) == 12
    assert TrainConfig(global_batch=32, chunk_size=8, epochs=4, max_steps=5).total_steps(100) == 5
    assert TrainConfig(global_batch=32, chunk_size=8, epochs=4, max_steps=12).total_steps(100) == 12
    # max_steps above what the epochs give does not extend the run
    assert TrainConfig(global_batch=32, chunk_size=8, epochs=2, max_steps=50).total_steps(100) == 6


_BASE = dict(
    global_batch=32,
    chunk_size=8,
    epochs=2,
    max_steps=None,
    seed=0,
    checkpoint_every_steps=None,
    checkpoint_every_seconds=None,
    keep_checkpoints=3,
    backend="auto",
    exact_reduction=True,
    noise_scale=False,
    noise_ema=0.95,
    noise_every=4,
    grad_clip_norm=None,
    overlap=True,
    exact_ring=True,
    balance=True,
    bucket_mb=4.0,
    shard_level=0,
    shard_redundancy=2,
)

# One changed value per field; every field of TrainConfig must be listed here.
_CHANGES = {
    "global_batch": 64,
    "chunk_size": 4,
    "epochs": 3,
    "max_steps": 10,
    "seed": 1,
    "checkpoint_every_steps": 5,
    "checkpoint_every_seconds": 30.0,
    "keep_checkpoints": 2,
    "backend": "gloo",
    "exact_reduction": False,
    "noise_scale": True,
    "noise_ema": 0.9,
    "noise_every": 2,
    "grad_clip_norm": 1.0,
    "overlap": False,
    "exact_ring": False,
    "balance": False,
    "bucket_mb": 1.0,
    "shard_level": 1,
    "shard_redundancy": 3,
}


def test_changes_cover_every_field() -> None:
    assert {f.name for f in dataclasses.fields(TrainConfig)} == set(_CHANGES) == set(_BASE)


def test_fingerprint_equal_for_equal_configs() -> None:
    a, b = TrainConfig(**_BASE), TrainConfig(**_BASE)
    assert a == b
    assert a.fingerprint() == b.fingerprint()
    assert isinstance(a.fingerprint(), str) and len(a.fingerprint()) == 16
    # keyword order and defaults make no difference
    c = TrainConfig(chunk_size=8, global_batch=32, epochs=2)
    assert c.fingerprint() == a.fingerprint()


@pytest.mark.parametrize("field", sorted(_CHANGES))
def test_fingerprint_differs_when_a_field_differs(field: str) -> None:
    base = TrainConfig(**_BASE)
    changed = TrainConfig(**{**_BASE, field: _CHANGES[field]})
    assert changed != base
    assert changed.fingerprint() != base.fingerprint()


def test_fingerprints_pairwise_distinct() -> None:
    prints = {TrainConfig(**_BASE).fingerprint()}
    for field, value in _CHANGES.items():
        prints.add(TrainConfig(**{**_BASE, field: value}).fingerprint())
    assert len(prints) == len(_CHANGES) + 1


def test_fingerprint_equal_for_int_and_float_seconds() -> None:
    a = TrainConfig(global_batch=8, chunk_size=2, checkpoint_every_seconds=30)
    b = TrainConfig(global_batch=8, chunk_size=2, checkpoint_every_seconds=30.0)
    assert a == b
    assert a.fingerprint() == b.fingerprint()
