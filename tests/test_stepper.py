"""The step math is world-size independent: simulated workers in one process, no networking."""

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.runs.checkpoint_file import dumps, loads
from dyntrain.elastic.state import TrainingParts, capture_state, restore_state
from dyntrain.elastic.step.stepper import ChunkStepper


class BNDropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(16, 3)
        self.unused = nn.Linear(2, 2)  # never gets a gradient: must not break the flat buffer

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def make_worker(seed=0, scaler=False):
    torch.manual_seed(seed)
    model = BNDropNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaler else None
    return TrainingParts(model, opt, sched, grad_scaler)


def dataset():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 6, generator=gen)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def train(world_sizes, steps=6, scaler=False, config=None, make=None, ds=None, loss=loss_fn,
          device=None):
    """Run ``steps`` steps; world_sizes[i] is the world size during step i. ``make()`` builds
    one replica (default: ``make_worker``) on ``device``, ``ds`` is the data set (default:
    ``dataset()``)."""
    config = config or TrainConfig(global_batch=40, chunk_size=5)
    # same seed, same initial parameters: one fresh replica per possible worker
    make = make or (lambda: make_worker(scaler=scaler))
    replicas = [make() for _ in range(max(world_sizes))]
    ds = ds if ds is not None else dataset()
    device = device or torch.device("cpu")
    steppers = [ChunkStepper(config, r, ds, loss, device) for r in replicas]
    for step in range(steps):
        world = world_sizes[step]
        flats = [steppers[r].compute(step, steppers[r].my_chunks(r, world)) for r in range(world)]
        total = torch.stack(flats).sum(0)
        for r in range(world):
            steppers[r].apply(total.clone())
        # Workers outside this step's world catch up the way joiners do: by state transfer.
        payload = dumps(capture_state(replicas[0], step + 1, steppers[0].steps_per_epoch))
        for r in range(world, len(replicas)):
            assert restore_state(replicas[r], loads(payload)) == step + 1
    return replicas[0]


def assert_same(a: TrainingParts, b: TrainingParts, atol=0.0):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for key in sa:
        if sa[key].is_floating_point():
            torch.testing.assert_close(sa[key], sb[key], atol=atol, rtol=atol and 1e-5, msg=key)
        else:
            assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("worlds", [[2] * 6, [3] * 6, [8] * 6, [1, 3, 2, 4, 3, 5]])
def test_any_world_sequence_matches_one_worker(worlds):
    assert_same(train([1] * 6), train(worlds))


def test_float32_reduction_agrees_to_summation_order():
    """Without exact reduction the all-reduce moves float32: close, but not bitwise equal."""
    config = TrainConfig(global_batch=40, chunk_size=5, exact_reduction=False)
    one, three = train([1] * 6, config=config), train([3] * 6, config=config)
    assert_same(one, three, atol=1e-6)


def test_batchnorm_buffers_are_bitwise_identical_across_world_sizes():
    config = TrainConfig(global_batch=40, chunk_size=5, exact_reduction=False)
    # Even when parameters may differ by summation order (float32 reduction), one step from the
    # same parameters leaves bitwise-equal buffers in any world size.
    one, three = train([1], steps=1, config=config), train([3], steps=1, config=config)
    for name in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        assert torch.equal(one.model.state_dict()[name], three.model.state_dict()[name]), name
    assert int(one.model.bn.num_batches_tracked) == 8  # one forward per chunk


def test_more_workers_than_chunks_still_matches():
    config = TrainConfig(global_batch=10, chunk_size=5)  # 2 chunks, 4 workers: 2 idle
    assert_same(train([1] * 4, steps=4, config=config), train([4] * 4, steps=4, config=config))


def test_grad_scaler_path_matches_across_world_sizes():
    assert_same(train([1] * 5, steps=5, scaler=True), train([3] * 5, steps=5, scaler=True))


def test_result_differs_when_global_batch_differs():
    """The fixed global batch is what makes runs comparable: changing it changes the result."""
    a = train([1] * 4, steps=4, config=TrainConfig(global_batch=40, chunk_size=5))
    b = train([1] * 4, steps=4, config=TrainConfig(global_batch=20, chunk_size=5))
    diff = (a.model.fc1.weight - b.model.fc1.weight).abs().max()
    assert diff > 1e-4


def test_gradient_is_the_global_batch_mean():
    """Summed chunk gradients equal the gradient of the mean loss over the whole global batch."""
    config = TrainConfig(global_batch=40, chunk_size=5)
    parts = make_worker()
    parts.model.drop.p = 0.0
    ds = dataset()
    stepper = ChunkStepper(config, parts, ds, loss_fn, torch.device("cpu"))
    flat = stepper.compute(0, stepper.my_chunks(0, 1))
    n = parts.model.fc2.weight.numel()
    offset = stepper.offsets[4]  # fc1, bn, then fc2
    assert stepper.params[4] is parts.model.fc2.weight
    got = flat[offset : offset + n].view_as(parts.model.fc2.weight).float()

    ref = copy.deepcopy(parts.model)
    idx = stepper.batch_indices(0)
    ref.zero_grad()
    # Per-chunk BatchNorm: the reference runs chunk by chunk too, averaging the chunk means.
    loss = sum(loss_fn(ref, (ds.tensors[0][c], ds.tensors[1][c])) for c in idx.split(5)) / 8
    loss.backward()
    torch.testing.assert_close(got, ref.fc2.weight.grad, atol=1e-6, rtol=1e-5)


def test_loss_and_flags_travel_in_the_tail():
    config = TrainConfig(global_batch=40, chunk_size=5)
    parts = make_worker()
    stepper = ChunkStepper(config, parts, dataset(), loss_fn, torch.device("cpu"))
    flat = stepper.compute(0, stepper.my_chunks(0, 1))
    stepper.set_flags(flat, reform=True, leave=True)
    result = stepper.apply(flat)
    assert result.reform and result.leavers == 1
    assert 0.3 < result.loss < 3.0
