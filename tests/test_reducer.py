"""Bucketed reduction during backward: real gloo groups (one thread per worker, one process)
give bitwise the result of the one-worker flat path, with overlap on and off.

The threads share torch's global generator, which the stepper seeds per chunk, so the model's
dropout is off here (``test_stepper`` covers dropout across world sizes)."""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.reducer import Bucket, plan_buckets
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.step.stepper import ChunkStepper
from test_stepper import assert_same, dataset, loss_fn, make_worker

CPU = torch.device("cpu")


def test_buckets_take_parameters_last_first_within_the_cap():
    assert plan_buckets([1, 2, 3, 4], cap=6) == [Bucket(0, 4, (3,)), Bucket(4, 10, (2, 1, 0))]
    # a parameter larger than the cap gets a bucket of its own
    assert plan_buckets([10, 1], cap=4) == [Bucket(0, 1, (1,)), Bucket(1, 11, (0,))]
    assert plan_buckets([], cap=4) == []
    with pytest.raises(ValueError):
        plan_buckets([1], cap=0)


def no_dropout_worker():
    parts = make_worker()
    parts.model.drop.p = 0.0
    return parts


def reference(steps: int, config: TrainConfig):
    """The flat path on one worker: compute, apply."""
    parts = no_dropout_worker()
    stepper = ChunkStepper(config, parts, dataset(), loss_fn, CPU)
    for step in range(steps):
        stepper.apply(stepper.compute(step, stepper.my_chunks(0, 1)))
    return parts


def run_group(world: int, steps: int, config: TrainConfig, chunks_of=None,
              ring: bool = False) -> list:
    """``steps`` steps on ``world`` thread workers over real gloo; returns each one's parts and
    whether each all-reduce was started while backward still ran."""
    store = dist.HashStore()
    results: list = [None] * world
    # the initial parameters come from the global generator: made here, not in the threads
    replicas = [no_dropout_worker() for _ in range(world)]
    errors: list[BaseException] = []

    def worker(rank: int) -> None:
        try:
            parts = replicas[rank]
            stepper = ChunkStepper(config, parts, dataset(), loss_fn, CPU)
            pg = dist.ProcessGroupGloo(dist.PrefixStore("pg/", store), rank, world,
                                       timedelta(seconds=60))
            group = Group(pg, rank, world, CPU, ring=ring)
            during: list[bool] = []
            def watch(launch):
                def watched(*tensors):
                    during.append(stepper._live is not None)
                    return launch(*tensors)
                return watched

            group.allreduce_async = watch(group.allreduce_async)
            group.exact_sum_async = watch(group.exact_sum_async)
            for step in range(steps):
                plan = ([chunks_of(step, r) for r in range(world)] if chunks_of
                        else [stepper.my_chunks(r, world) for r in range(world)])
                red = stepper.start(step, plan[rank], group, max(map(len, plan)))
                stepper.finish(red, False, False, lambda: False)
            results[rank] = (parts, during, len(stepper.buckets))
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


@pytest.mark.parametrize("overlap, ring", [(True, True), (True, False), (False, True)])
def test_bucketed_reduction_matches_the_one_worker_flat_path(overlap, ring):
    # tiny buckets: several per step, and the unused layer's bucket waits for the end
    config = TrainConfig(global_batch=40, chunk_size=5, overlap=overlap, bucket_mb=2e-4)
    expected = reference(4, config)
    results = run_group(3, 4, config, ring=ring)
    for parts, during, buckets in results:
        assert_same(expected, parts)
        assert buckets >= 4
        assert len(during) == 4 * (buckets + 1)  # one all-reduce per bucket, one for the tail
        assert any(during) == overlap  # started while backward still ran


def test_ring_sends_one_chunk_gradients_as_float32_and_matches():
    # two chunks, two workers: each sends its own float32 gradient, never a float64 copy
    config = TrainConfig(global_batch=10, chunk_size=5, bucket_mb=2e-4)
    expected = reference(4, config)
    sent: list[torch.dtype] = []
    send = dist.ProcessGroupGloo.send

    def recording_send(self, tensors, *args):
        sent.append(tensors[0].dtype)
        return send(self, tensors, *args)

    dist.ProcessGroupGloo.send = recording_send
    try:
        results = run_group(2, 4, config, ring=True)
    finally:
        dist.ProcessGroupGloo.send = send
    for parts, _, _ in results:
        assert_same(expected, parts)
    assert sent and set(sent) == {torch.float32}


def test_bucketed_reduction_with_uneven_and_empty_shares():
    # rank 1 gets nothing on even steps; rank 0 all but one chunk on odd steps
    config = TrainConfig(global_batch=40, chunk_size=5, bucket_mb=2e-4)

    def chunks_of(step, rank):
        split = [range(0, 8), range(8, 8)] if step % 2 == 0 else [range(0, 7), range(7, 8)]
        return split[rank]

    expected = reference(4, config)
    for parts, _, _ in run_group(2, 4, config, chunks_of, ring=True):
        assert_same(expected, parts)


@pytest.mark.parametrize("size", [3, 4])
@pytest.mark.parametrize("reuse", [False, True])
def test_the_exact_ring_adds_float32_terms_in_float64(size, reuse):
    """One chunk per member: every member sends its float32 gradient as it is, and each sum is
    the float64 sum of the float32 terms rounded once, which float32 additions along the ring
    would miss (terms of very different sizes); with the ring thread's reused hop buffers
    (``Scratch``) as with fresh ones, over several buckets of different sizes."""
    from dyntrain.elastic.collective.ring import Scratch, exact_ring_sum
    from test_gradshard import _run_members

    def term(rank: int, n: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 * rank + n)
        return torch.randn(n, generator=g) * 10.0 ** (4 * (rank % 3) - 4)

    sizes = [1000, 7, 2049]
    expected = [sum(term(r, n).double() for r in range(size)).float() for n in sizes]

    def body(group):
        scratch = Scratch() if reuse else None
        out = []
        for n in sizes:
            result = torch.empty(n)
            exact_ring_sum(group.pg, group.rank, group.size, term(group.rank, n), result,
                           scratch=scratch)
            out.append(result)
        return out

    for got in _run_members(size, body):
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    # float32 along the way would round differently
    naive = [sum((term(r, n) for r in range(size)), torch.zeros(n)) for n in sizes]
    assert not all(torch.equal(a, b) for a, b in zip(naive, expected, strict=True))
