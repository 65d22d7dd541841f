"""BatchNorm running stats replayed from per-chunk rows match sequential forwards, for any world."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dyntrain.elastic.step.buffers import BatchNormChunkStats
from dyntrain.elastic.step.chunks import assign_chunks

CHUNK = 4


def _model(momentum: float | None) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 5, 3),
        nn.BatchNorm2d(5, momentum=momentum),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(5 * 4 * 4, 6),
        nn.BatchNorm1d(6, momentum=momentum),
        nn.ReLU(),
        nn.Linear(6, 2),
    )


def _chunks(num_chunks: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # a different scale and offset per chunk so that the chunk order matters
    return [
        torch.randn(CHUNK, 3, 6, 6, generator=gen) * (1 + c) + 0.5 * c for c in range(num_chunks)
    ]


def _bn_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _buffers(model: nn.Module) -> list[torch.Tensor]:
    return [b.clone() for b in model.buffers()]


def _warm_up(model: nn.Module, steps: int) -> None:
    """Move the buffers away from their defaults (and num_batches_tracked away from 0)."""
    model.train()
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for _ in range(steps):
            model(torch.randn(CHUNK, 3, 6, 6, generator=gen) * 2 - 1)


def _worker_step(
    model: nn.Module, stats: BatchNormChunkStats, chunks: range, xs: list[torch.Tensor],
    num_chunks: int,
) -> torch.Tensor:
    """What one worker does in a step: its own rows of a zero table, as the stepper does."""
    model.train()
    stats.begin_step()
    table = torch.zeros(num_chunks, stats.width)
    for c in chunks:
        stats.before_chunk()
        model(xs[c]).sum().backward()
        stats.record_chunk(table[c])
    stats.before_chunk()
    return table


def _one_worker(model: nn.Module, xs: list[torch.Tensor]) -> None:
    stats = BatchNormChunkStats(model)
    table = _worker_step(model, stats, range(len(xs)), xs, len(xs))
    stats.finish_step(table)


def _sequential(model: nn.Module, xs: list[torch.Tensor]) -> None:
    model.train()
    with torch.no_grad():
        for x in xs:
            model(x)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("warm", [0, 3])
@pytest.mark.parametrize("num_chunks", [1, 2, 5])
def test_one_worker_matches_sequential_forwards(
    momentum: float | None, warm: int, num_chunks: int
) -> None:
    base = _model(momentum)
    _warm_up(base, warm)
    start_count = [int(m.num_batches_tracked) for m in _bn_modules(base)]
    assert start_count == [warm, warm]
    xs = _chunks(num_chunks, seed=num_chunks)

    replayed, reference = copy.deepcopy(base), copy.deepcopy(base)
    _one_worker(replayed, xs)
    _sequential(reference, xs)

    for got, want, m0 in zip(
        _bn_modules(replayed), _bn_modules(reference), _bn_modules(base), strict=True
    ):
        assert torch.allclose(got.running_mean, want.running_mean, rtol=1e-5, atol=1e-6)
        assert torch.allclose(got.running_var, want.running_var, rtol=1e-5, atol=1e-6)
        assert int(got.num_batches_tracked) == warm + num_chunks
        assert int(want.num_batches_tracked) == warm + num_chunks
        # the step did move the statistics (the comparison is not between two untouched copies)
        assert not torch.allclose(got.running_mean, m0.running_mean)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_several_steps_match_sequential(momentum: float | None) -> None:
    base = _model(momentum)
    replayed, reference = copy.deepcopy(base), copy.deepcopy(base)
    for step in range(3):
        xs = _chunks(4, seed=100 + step)
        _one_worker(replayed, xs)
        _sequential(reference, xs)
    for got, want in zip(_bn_modules(replayed), _bn_modules(reference), strict=True):
        assert torch.allclose(got.running_mean, want.running_mean, rtol=1e-5, atol=1e-6)
        assert torch.allclose(got.running_var, want.running_var, rtol=1e-5, atol=1e-6)
        assert int(got.num_batches_tracked) == 12


def test_chunk_order_matters_for_the_reference() -> None:
    """Sanity check of the setup: replaying in another order gives other (non-close) stats."""
    base = _model(0.1)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    xs = _chunks(4, seed=5)
    _one_worker(a, xs)
    _one_worker(b, xs[::-1])
    assert not torch.allclose(_bn_modules(a)[0].running_mean, _bn_modules(b)[0].running_mean)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize(("num_chunks", "world_size"), [(5, 2), (5, 3), (6, 3), (3, 4), (1, 2)])
def test_world_size_independence_is_bitwise(
    momentum: float | None, num_chunks: int, world_size: int
) -> None:
    base = _model(momentum)
    _warm_up(base, 2)
    xs = _chunks(num_chunks, seed=7)

    single = copy.deepcopy(base)
    _one_worker(single, xs)
    expected = _buffers(single)

    workers = [copy.deepcopy(base) for _ in range(world_size)]
    stats = [BatchNormChunkStats(w) for w in workers]
    blocks = assign_chunks(num_chunks, world_size)
    tables = [
        _worker_step(w, s, block, xs, num_chunks)
        for w, s, block in zip(workers, stats, blocks, strict=True)
    ]
    # each worker filled only its own rows
    for table, block in zip(tables, blocks, strict=True):
        for c in range(num_chunks):
            assert bool(table[c].abs().sum() > 0) == (c in block)
    total = torch.stack(tables).sum(dim=0)  # the all-reduce
    for w, s in zip(workers, stats, strict=True):
        s.finish_step(total)
        got = _buffers(w)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert torch.equal(g, e)


def test_worker_buffers_without_the_table_would_differ() -> None:
    """Without the replay, a worker's buffers depend on which chunks it ran."""
    base = _model(0.1)
    xs = _chunks(4, seed=3)
    single = copy.deepcopy(base)
    _one_worker(single, xs)
    partial = copy.deepcopy(base)
    _sequential(partial, xs[:2])
    assert not torch.allclose(
        _bn_modules(single)[0].running_mean, _bn_modules(partial)[0].running_mean
    )


def test_width_counts_mean_and_var_of_every_tracked_module() -> None:
    assert BatchNormChunkStats(_model(0.1)).width == 2 * 5 + 2 * 6


def test_model_without_batchnorm_is_a_no_op() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2))
    stats = BatchNormChunkStats(model)
    assert stats.modules == []
    assert stats.width == 0
    before = [p.clone() for p in model.state_dict().values()]
    stats.begin_step()
    table = torch.zeros(3, 0)
    for c in range(3):
        stats.before_chunk()
        model(torch.randn(2, 4))
        stats.record_chunk(table[c])
    stats.finish_step(table)
    after = list(model.state_dict().values())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_untracked_batchnorm_is_ignored() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Linear(4, 3),
        nn.BatchNorm1d(3, track_running_stats=False),
        nn.Linear(3, 5),
        nn.BatchNorm1d(5),
    )
    stats = BatchNormChunkStats(model)
    assert stats.modules == [model[3]]
    assert stats.width == 10

    only_untracked = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, track_running_stats=False))
    empty = BatchNormChunkStats(only_untracked)
    assert empty.width == 0
    empty.begin_step()
    empty.before_chunk()
    only_untracked(torch.randn(4, 4))
    empty.finish_step(torch.zeros(2, 0))

    # the tracked module still matches sequential forwards
    xs = [torch.randn(4, 4) + c for c in range(3)]
    reference = copy.deepcopy(model)
    model.train()
    stats.begin_step()
    table = torch.zeros(3, stats.width)
    for c, x in enumerate(xs):
        stats.before_chunk()
        model(x)
        stats.record_chunk(table[c])
    stats.finish_step(table)
    _sequential(reference, xs)
    assert torch.allclose(model[3].running_mean, reference[3].running_mean, atol=1e-6)
    assert torch.allclose(model[3].running_var, reference[3].running_var, atol=1e-5)
    assert int(model[3].num_batches_tracked) == 3
