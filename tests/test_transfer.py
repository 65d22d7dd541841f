"""State hand-over to joiners: skeleton + flat tensors, several senders, no pickled big tensors."""

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from dyntrain.elastic.collective import transfer
from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.transfer import (
    broadcast_state,
    join_state,
    split_state,
    state_bytes,
)


def sample_state() -> dict:
    gen = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(300, 100, generator=gen), "b": torch.randn(7, generator=gen)},
        "optimizer": {"state": {0: {"exp_avg": torch.randn(200, 100, generator=gen),
                                    "exp_avg_sq": torch.rand(200, 100, generator=gen),
                                    "step": torch.tensor(3.0)},
                                1: {"count": torch.arange(40000, dtype=torch.int64)}},
                      "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
        "step": 12,
        "rng": (torch.get_rng_state(), [1, 2]),
    }


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_split_keeps_small_values_and_flattens_large_tensors_by_part_and_dtype():
    state = sample_state()
    skeleton, groups = split_state(state)
    names = {(top, dtype) for top, dtype, _ in groups}
    assert names == {("model", torch.float32), ("optimizer", torch.float32),
                     ("optimizer", torch.int64)}
    assert isinstance(skeleton["model"]["b"], torch.Tensor)  # small: rides in the skeleton
    assert "__flat__" in skeleton["model"]["w"]
    flats = {f"{top}/{str(dtype).removeprefix('torch.')}": torch.cat([t.reshape(-1) for t in ts])
             for top, dtype, ts in groups}
    skeleton["__flat_sizes__"] = {f"{top}/{str(dtype).removeprefix('torch.')}":
                                  [t.numel() for t in ts] for top, dtype, ts in groups}
    assert_same(join_state(skeleton, flats), state)
    assert state_bytes(state) > 4 * (300 * 100 + 2 * 200 * 100)


def test_broadcast_state_from_two_holders_in_pieces_to_two_receivers(monkeypatch):
    """Four gloo ranks in threads: ranks 0 and 2 hold the state and share the sending (pieces
    far smaller than the buffers, so both send); ranks 1 and 3 receive it bit for bit."""
    monkeypatch.setattr(transfer, "PIECE_BYTES", 8192)
    store, world, results = dist.HashStore(), 4, {}

    def member(rank: int) -> None:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("t", store), rank, world,
                                   timedelta(seconds=60))
        group = Group(pg, rank, world, torch.device("cpu"))
        state = sample_state() if rank in (0, 2) else None
        results[rank] = broadcast_state(group, state, 2, [0, 2], lambda: False)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    for rank in range(world):  # holders keep their state (they received identical pieces)
        assert_same(results[rank], sample_state())


def test_broadcast_state_never_writes_into_a_holders_live_tensors(monkeypatch):
    """A holder takes part in the broadcasts of pieces it does not send with scratch buffers:
    its own tensors are only read. (Made visible by holders whose bytes differ, which the
    runtime never has: each keeps its own, and the receiver gets the senders' pieces.)"""
    monkeypatch.setattr(transfer, "PIECE_BYTES", 8192)
    store, world, results = dist.HashStore(), 3, {}
    states = {0: sample_state(), 1: sample_state(), 2: None}
    states[1]["model"]["w"].add_(1.0)

    def member(rank: int) -> None:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("t", store), rank, world,
                                   timedelta(seconds=60))
        group = Group(pg, rank, world, torch.device("cpu"))
        results[rank] = broadcast_state(group, states[rank], 0, [0, 1], lambda: False)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2]
    expected = sample_state()
    assert_same(results[0], expected)
    expected["model"]["w"].add_(1.0)
    assert_same(results[1], expected)
    received = results[2]["model"]["w"].reshape(-1)
    ones = sample_state()["model"]["w"].reshape(-1)
    step = 8192 // 4
    for piece, start in enumerate(range(0, received.numel(), step)):
        sender_shift = 1.0 if piece % 2 else 0.0  # pieces alternate between holders 0 and 1
        assert torch.equal(received[start:start + step], ones[start:start + step] + sender_shift)
