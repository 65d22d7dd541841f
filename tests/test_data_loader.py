"""The chunk loader: per-sample seeding, plan changes, discards, no respawn, clear errors."""

import pickle
import time

import pytest
import torch
from torch import nn

from dyntrain import ElasticTrainer, TrainConfig
from dyntrain.data import (
    ChunkLoader,
    DataError,
    ImageDataset,
    ImageTransform,
    LoaderConfig,
    sample_seed,
)
from dyntrain.elastic.state import TrainingParts
from dyntrain.elastic.step.sampler import BatchOrder
from dyntrain.elastic.step.stepper import ChunkStepper
from dyntrain.testing.wait import wait_until
from dyntrain.workloads.digits_images import write_digits_images

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def digits_train(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    write_digits_images(root, size=12, per_class=4)
    return ImageDataset(str(root / "train"), ImageTransform(size=10, scale=(0.3, 1.0)))


# (step, chunks) as a trainer would ask: steady, a join (fewer chunks), a step recomputed after a
# crash with other chunks, a re-balanced assignment, and a step skipped ahead (a joiner).
PLAN = [(0, [0, 1, 2, 3]), (1, [0, 1, 2, 3]), (2, [0, 1]), (2, [0, 1, 2]), (3, [2, 3, 4]),
        (4, [2, 3, 4]), (6, [1])]


def run_plan(dataset, workers):
    order = BatchOrder(0, len(dataset), 20)
    loader = ChunkLoader(dataset, order, 4, 8, 7, CPU, LoaderConfig(workers=workers))
    pids = [w.pid for w in loader._it._workers] if workers else []
    got = {}
    for step, chunks in PLAN:
        loader.expect(step, chunks)
        for c in chunks:
            got[(step, c)] = loader.fetch(step, c, order.chunk(step, c, 4))
    assert [w.pid for w in loader._it._workers] == pids if workers else True  # no respawn
    assert all(w.is_alive() for w in loader._it._workers) if workers else True
    discarded = loader.discarded
    loader.close()
    return got, discarded, order


def test_chunks_do_not_depend_on_loader_processes_or_plan_changes(digits_train):
    inproc, _, order = run_plan(digits_train, 0)
    procs, discarded, _ = run_plan(digits_train, 2)
    assert discarded > 0  # prefetched chunks that the changed plan no longer needed
    assert inproc.keys() == procs.keys()
    for key, (x, y) in inproc.items():
        assert torch.equal(x, procs[key][0]) and torch.equal(y, procs[key][1]), key
        # the content is a pure function of the key: seeded per sample, whoever loads it
        step, chunk = key
        for pos, i in enumerate(order.chunk(step, chunk, 4).tolist()):
            torch.manual_seed(sample_seed(7, step, chunk, pos))
            sample, label = digits_train[i]
            assert torch.equal(sample, x[pos]) and label == y[pos]


def test_loading_in_process_leaves_the_generators_alone(digits_train):
    order = BatchOrder(0, len(digits_train), 20)
    loader = ChunkLoader(digits_train, order, 4, 2, 0, CPU, LoaderConfig(workers=0))
    torch.manual_seed(5)
    before = torch.get_rng_state()
    loader.expect(0, [0])
    loader.fetch(0, 0, order.chunk(0, 0, 4))
    assert torch.equal(before, torch.get_rng_state())


def test_corrupt_file_is_a_clear_error_not_a_hang(tmp_path):
    write_digits_images(tmp_path, size=12, per_class=2)
    victim = sorted((tmp_path / "train" / "0").iterdir())[1]
    victim.write_bytes(b"garbage")
    ds = ImageDataset(str(tmp_path / "train"), ImageTransform(size=8))
    order = BatchOrder(0, len(ds), 20)
    loader = ChunkLoader(ds, order, 20, 1, 0, CPU, LoaderConfig(workers=1, timeout=60))
    loader.expect(0, [0])
    start = time.monotonic()
    with pytest.raises(DataError, match=rf"step 0 chunk 0: cannot decode image .*{victim.name}"):
        loader.fetch(0, 0, order.chunk(0, 0, 20))
    assert time.monotonic() - start < 30
    loader.close()


class GatedSamples(torch.utils.data.Dataset):
    """Sample ``index`` * 10 as a 1-element tensor; sample ``gated`` waits until ``gate[0]`` is
    set (a loader process half-way through a chunk)."""

    def __init__(self, n, gated):
        self.n, self.gated = n, gated
        self.gate = torch.zeros(1, dtype=torch.int64).share_memory_()

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if index == self.gated:
            wait_until(lambda: bool(self.gate[0]), "the test to open the gate", 60, 0.002, 0.01)
        return torch.tensor([index * 10.0]), index


def test_a_plan_change_drops_requests_in_flight_in_the_loader_process():
    """A request the plan no longer wants is dropped by the loader process mid-chunk (the rest
    of it is never loaded), and the new plan's chunks come next, correct."""
    order = BatchOrder(0, 32, 8)
    gated = int(order.chunk(0, 1, 4)[0])
    data = GatedSamples(32, gated)
    loader = ChunkLoader(data, order, 4, 4, 5, CPU, LoaderConfig(workers=1, prefetch=3))
    loader.expect(0, [0, 1])  # requests (0, 0), (0, 1), (1, 0): (0, 1) stops at its first sample
    x, y = loader.fetch(0, 0, order.chunk(0, 0, 4))
    assert y.tolist() == order.chunk(0, 0, 4).tolist()
    loader.expect(1, [1])  # the plan changes: (0, 1) and (1, 0) are no longer wanted
    data.gate[0] = 1
    x, y = loader.fetch(1, 1, order.chunk(1, 1, 4))
    assert y.tolist() == order.chunk(1, 1, 4).tolist() and torch.equal(x[:, 0], y * 10.0)
    assert loader.dropped >= 1 and loader.discarded >= loader.dropped
    loader.close()


def test_a_request_dropped_by_a_stale_plan_read_is_asked_again(digits_train, monkeypatch):
    """A loader process that reads the plan while it changes may drop a chunk that is still
    wanted: the loader asks for it again and returns the same content."""
    order = BatchOrder(0, len(digits_train), 20)
    ref = ChunkLoader(digits_train, order, 4, 2, 7, CPU, LoaderConfig(workers=0))
    ref.expect(0, [0, 1])
    want = [ref.fetch(0, c, order.chunk(0, c, 4)) for c in (0, 1)]
    loader = ChunkLoader(digits_train, order, 4, 2, 7, CPU, LoaderConfig(workers=0))
    reads = []
    real = loader._plan.wanted

    def stale_once(step, chunk):  # the third read (mid-way through chunk 0) sees another plan
        reads.append((step, chunk))
        return len(reads) != 3 and real(step, chunk)

    monkeypatch.setattr(loader._plan, "wanted", stale_once)
    loader.expect(0, [0, 1])
    for c, (x, y) in zip((0, 1), want, strict=True):
        got = loader.fetch(0, c, order.chunk(0, c, 4))
        assert torch.equal(got[0], x) and torch.equal(got[1], y)
    assert loader.dropped == 1
    loader.close()


def test_small_tensors_leave_loader_processes_by_value_bitwise():
    from dyntrain.data.loader import BY_VALUE, _pack, _Small, _unpack

    batch = {"x": torch.randn(4, 3, 5).to(torch.bfloat16), "m": torch.tensor([True, False]),
             "s": torch.tensor(7), "big": torch.zeros(BY_VALUE // 4 + 1),
             "pair": (torch.arange(6).reshape(2, 3).t(), 3)}
    packed = _pack(batch)
    assert isinstance(packed["x"], _Small) and isinstance(packed["pair"][0], _Small)
    assert packed["big"] is batch["big"]  # large ones go through shared memory
    out = _unpack(pickle.loads(pickle.dumps(packed)), pin=False)
    for k in ("x", "m", "s", "big"):
        assert out[k].dtype == batch[k].dtype and torch.equal(out[k], batch[k]), k
    assert torch.equal(out["pair"][0], batch["pair"][0]) and out["pair"][1] == 3


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        return self.fc(self.drop(torch.relu(self.bn(self.conv(x))).mean((2, 3))))


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def fit(dataset, workers):
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    config = TrainConfig(global_batch=20, chunk_size=5, epochs=3, grad_clip_norm=0.5)
    trainer = ElasticTrainer(config, model, opt, dataset, _loss, device="cpu",
                             loader=LoaderConfig(workers=workers) if workers is not None else None)
    trainer.fit()
    return model, trainer


def test_training_through_loader_processes_equals_loading_in_process(digits_train):
    a, ta = fit(digits_train, 0)
    b, tb = fit(digits_train, 2)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k
    assert tb.stepper.loader._it is None  # fit() stopped the loader processes
    assert ta.last_result.grad_norm is not None


def test_exactly_once_with_prefetching_across_membership_changes():
    """Ledger: each sample's counter gets +1 per applied step holding it. Worlds change, and a
    step is computed, abandoned (a crash before the all-reduce) and recomputed in a new world,
    while loader processes prefetch along the old plan."""
    n, g = 48, 8
    config = TrainConfig(global_batch=g, chunk_size=2, epochs=3, seed=3)
    data = torch.utils.data.TensorDataset(torch.arange(n))
    replicas = []
    for _ in range(3):
        counts = nn.Parameter(torch.zeros(n))
        opt = torch.optim.SGD([counts], lr=float(g))
        replicas.append((counts, opt))

    def loss(model, batch):
        return -model.counts[batch[0]].mean()

    steppers = []
    for counts, opt in replicas:
        model = nn.Module()
        model.counts = counts
        stepper = ChunkStepper(config, TrainingParts(model, opt), data, loss, CPU)
        stepper.loader = ChunkLoader(data, BatchOrder(3, n, g), 2, 18, 3, CPU,
                                     LoaderConfig(workers=1, prefetch=3))
        steppers.append(stepper)
    worlds = {s: (1 if s < 4 else 3 if s < 9 else 2) for s in range(18)}
    for step in range(18):
        w = worlds[step]
        if step == 10:  # world 3 computes step 10, one worker dies before the all-reduce
            for r in range(3):
                steppers[r].compute(step, steppers[r].my_chunks(r, 3))
        flats = [steppers[r].compute(step, steppers[r].my_chunks(r, w)) for r in range(w)]
        total = torch.stack(flats).sum(0)
        for r in range(w):
            steppers[r].apply(total.clone())
        for r in range(w, 3):  # outside the world: catch up as a joiner does
            replicas[r][0].data.copy_(replicas[0][0].data)
    expected = torch.zeros(n)
    order = BatchOrder(3, n, g)
    for step in range(18):
        expected[order.indices(step)] += 1
    for counts, _ in replicas:
        assert torch.equal(counts.detach(), expected)
    assert sum(s.loader.discarded for s in steppers) > 0
    for s in steppers:
        s.loader.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loader_pins_and_copies_to_the_gpu(digits_train):
    cuda = torch.device("cuda")
    order = BatchOrder(0, len(digits_train), 20)
    loader = ChunkLoader(digits_train, order, 4, 2, 7, cuda, LoaderConfig(workers=2))
    assert loader._loader.pin_memory
    loader.expect(0, [0, 1])
    x, y = loader.fetch(0, 0, order.chunk(0, 0, 4))
    assert x.device.type == "cuda" and y.device.type == "cuda"
    cpu = ChunkLoader(digits_train, order, 4, 2, 7, CPU, LoaderConfig(workers=0))
    cpu.expect(0, [0])
    assert torch.equal(cpu.fetch(0, 0, order.chunk(0, 0, 4))[0], x.cpu())
    loader.close()


class _Collecting(torch.utils.data.Dataset):
    """Samples whose loading runs the cyclic garbage collector first, as any allocation may."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        import gc

        gc.collect()
        return torch.full((2,), float(i)), i


def test_a_loader_process_never_collects_the_trainers_garbage():
    """A forked loader process that collected an unreachable cycle inherited from the trainer
    ran its destructors there; a torch TCPStore server's aborts the process (its thread is not
    in the child: seen as 'DataLoader worker ... killed by signal: Aborted' in a test run). The
    loader collects such garbage before it forks."""
    import gc

    from torch.distributed import TCPStore

    class Cycle:
        pass

    gc.disable()  # the cycle stays garbage until the loader starts its processes
    try:
        held = Cycle()
        held.me, held.store = held, TCPStore("127.0.0.1", 0, is_master=True,
                                             wait_for_workers=False)
        del held
        order = BatchOrder(0, 40, 20)
        loader = ChunkLoader(_Collecting(), order, 4, 1, 0, CPU,
                             LoaderConfig(workers=1, timeout=60))
    finally:
        gc.enable()
    try:
        loader.expect(0, [0])
        x, y = loader.fetch(0, 0, order.chunk(0, 0, 4))
        assert y.tolist() == order.chunk(0, 0, 4).tolist() and x.shape == (4, 2)
    finally:
        loader.close()
