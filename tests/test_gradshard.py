"""ZeRO-2's gradient reduction (``dyntrain.elastic.sharding.gradients``) on real gloo groups: every
owner of a tensor ends with the bits of its float64 sum rounded once, over uneven segments, in one
round or several (members with fewer chunks adding zeros), and no member is sent the sums of
tensors it does not own."""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dyntrain.elastic.collective.comm import create_group
from dyntrain.elastic.collective.reducer import plan_buckets
from dyntrain.elastic.collective.ring import ring_reduce_scatter
from dyntrain.elastic.sharding.gradients import SUMS, GradientShards

NUMELS = [5, 1, 7, 33, 4099, 2, 64, 3, 130]
# rank 0 is primary of nothing in some buckets, a bucket's one tensor has one primary
OWNERS = [(1, 2), (2, 0), (1, 0), (2, 1), (0, 1), (1, 2), (2, 0), (0, 2), (1, 0)]


def _run_members(size: int, body) -> list:
    """Run ``body(group)`` in ``size`` threads, each a member of one real gloo group."""
    store = dist.HashStore()
    results, errors = [None] * size, []

    def member(rank: int) -> None:
        try:
            group = create_group(store, 0, rank, size, "gloo", torch.device("cpu"),
                                 timedelta(seconds=60), lambda: False)
            try:
                results[rank] = body(group)
            finally:
                group.close(abandoned=False)
        except Exception as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


def _contribution(rank: int, chunk: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + chunk)
    return [torch.randn(n, generator=g) * 10.0 ** (t % 3) for t, n in enumerate(NUMELS)]


@pytest.mark.parametrize("chunks", [(1, 1, 1), (2, 1, 0)])
def test_every_owner_gets_the_float64_sum_rounded_once(chunks):
    size = len(chunks)
    buckets = plan_buckets(NUMELS, 200)
    assert len(buckets) > 2
    expected = [sum(_contribution(r, c)[t].double() for r in range(size)
                    for c in range(chunks[r])).float() for t in range(len(NUMELS))]

    def body(group):
        shards = GradientShards(buckets, NUMELS)
        offsets = shards.arrange(OWNERS, group.rank, size)
        grads = torch.zeros(sum(NUMELS))
        rounds = max(chunks)
        shards.begin(group, rounds)
        for c in range(rounds):
            if c < chunks[group.rank]:
                for t, g in enumerate(_contribution(group.rank, c)):
                    grads[offsets[t] : offsets[t] + NUMELS[t]] += g
            shards.add_round(group, grads, lambda: False)
        shards.finish(group, grads, lambda: False)
        sums = group.buffers.get(SUMS)
        return ({t: grads[offsets[t] : offsets[t] + NUMELS[t]].clone()
                 for t in range(len(NUMELS)) if group.rank in OWNERS[t]},
                shards.owned_numel(), None if sums is None else sums.numel())

    for rank, (owned, primary_numel, sums_numel) in enumerate(_run_members(size, body)):
        assert set(owned) == {t for t, o in enumerate(OWNERS) if rank in o}
        for t, got in owned.items():
            assert torch.equal(got, expected[t]), (rank, t)
        assert primary_numel == sum(n for n, o in zip(NUMELS, OWNERS, strict=True) if o[0] == rank)
        # several rounds: float64 sums of the tensors it is primary for only
        assert sums_numel == (primary_numel if max(chunks) > 1 else None)


def test_the_reduce_scatter_gives_each_member_its_own_uneven_segment():
    bounds = [0, 0, 7, 10]  # rank 0's segment is empty

    def body(group):
        contrib = torch.arange(10, dtype=torch.float32) * (group.rank + 1)
        return ring_reduce_scatter(group.pg, group.rank, group.size, contrib, bounds)

    whole = torch.arange(10, dtype=torch.float64) * 6
    for rank, got in enumerate(_run_members(3, body)):
        assert got.dtype == torch.float64
        assert torch.equal(got, whole[bounds[rank] : bounds[rank + 1]])
