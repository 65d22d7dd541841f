"""The recipe: ResNet v1 layout and zero gamma, the LR schedule, LARS, precision modes."""

import pytest
import torch
from torch import nn

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.state import TrainingParts
from dyntrain.errors import ConfigError
from dyntrain.recipes import (
    LARS,
    RECIPES,
    LRSchedule,
    Recipe,
    StaticLossScaler,
    param_groups,
    resnet50,
    small_resnet,
)
from dyntrain.recipes.resnet import BasicBlock, Bottleneck
from test_stepper import assert_same, train


def test_resnet50_is_the_articles_v1():
    m = resnet50()
    assert sum(p.numel() for p in m.parameters()) == 25_557_032  # as torchvision's resnet50
    first = m.layer2[0]
    assert first.conv1.stride == (1, 1) and first.conv2.stride == (2, 2)  # stride in the 3x3
    blocks = [b for b in m.modules() if isinstance(b, Bottleneck)]
    assert len(blocks) == 16 and all(b.bn3.weight.abs().sum() == 0 for b in blocks)
    assert all(b.bn1.weight.eq(1).all() for b in blocks)


def test_zero_gamma_blocks_start_as_identity():
    m = small_resnet(width=8, layers=(2, 2)).eval()
    block = m.layer1[1]
    assert isinstance(block, BasicBlock)
    x = torch.randn(2, 8, 6, 6).relu()
    assert torch.equal(block(x), x)
    assert small_resnet(zero_init_residual=False).layer1[0].bn2.weight.eq(1).all()


def test_lr_schedule_values_at_chosen_steps():
    s = RECIPES["resnet50-goyal"].schedule
    spe, total, g = 78, 7020, 16384  # ImageNet's 1,281,167 images at global batch 16384
    lr = [s.lr_at(k, g, spe, total) for k in (0, 390, 779, 780, 3900, 7020)]
    assert lr[0] == pytest.approx(0.001) and lr[3] == pytest.approx(6.4)
    assert lr[1] == pytest.approx(0.001 + 6.399 * 0.5)
    assert lr[2] == pytest.approx(0.001 + 6.399 * 779 / 780)
    assert lr[4] == pytest.approx(6.4 * 0.5**2)  # half way through the decay, power 2
    assert lr[5] == 0.0
    recipe = Recipe("t", model="small-resnet", global_batch=32, chunk_size=8, epochs=3,
                    schedule=LRSchedule(warmup_epochs=1), precision="fp32")
    model = small_resnet(width=4, layers=(1,))
    cfg = recipe.train_config()
    opt, sched, scaler, _ = recipe.build(model, 64, cfg)  # 2 steps/epoch, 6 steps
    seen = []
    for _ in range(6):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    assert scaler is None
    assert [row[0] for row in seen] == pytest.approx(
        [recipe.schedule.lr_at(k, 32, 2, 6) for k in range(6)])
    assert all(len(set(row)) == 1 for row in seen)
    restored = type(sched)(opt, recipe.schedule, 32, 2, 6)
    restored.load_state_dict(sched.state_dict())
    assert restored.last_epoch == 6


def test_param_groups_keep_decay_off_batchnorm_and_bias():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2))
    decay, plain = param_groups(m, 1e-4, decay_bn_and_bias=False)
    assert [p.shape for p in decay["params"]] == [(4, 3, 3, 3), (2, 4)]
    assert len(plain["params"]) == 4 and plain["weight_decay"] == 0.0 and not plain["lars"]
    assert len(param_groups(m, 1e-4, decay_bn_and_bias=True)) == 1


def test_lars_scales_each_layer_by_its_trust_ratio():
    w = nn.Parameter(torch.tensor([3.0, 4.0]))
    b = nn.Parameter(torch.tensor([1.0]))
    opt = LARS([{"params": [w], "lars": True}, {"params": [b], "lars": False,
                                                 "weight_decay": 0.0}],
               lr=0.1, momentum=0.0, weight_decay=0.01, eta=0.02)
    w.grad, b.grad = torch.tensor([0.6, 0.8]), torch.tensor([0.5])
    opt.step()
    trust = 0.02 * 5.0 / (1.0 + 0.01 * 5.0)
    expected = torch.tensor([3.0, 4.0]) - 0.1 * trust * (torch.tensor([0.6, 0.8])
                                                         + 0.01 * torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(w.detach(), expected)
    torch.testing.assert_close(b.detach(), torch.tensor([1.0 - 0.1 * 0.5]))


def test_static_loss_scaler_keeps_its_scale_and_skips_overflow_steps():
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    s = StaticLossScaler("cpu", 1024.0)
    for grad, expected in [(torch.tensor([1024.0, 2048.0]), [0.0, -1.0]),
                           (torch.tensor([float("inf"), 1.0]), [0.0, -1.0])]:
        s.scale(torch.ones(()))  # (a scaler starts when it first scales a loss)
        p.grad = grad
        s.step(opt)
        s.update()
        assert s.get_scale() == 1024.0
        assert p.detach().tolist() == expected


def test_bad_recipes_are_config_errors():
    with pytest.raises(ConfigError, match="precision"):
        Recipe("x", precision="fp8")
    with pytest.raises(ConfigError, match="not a multiple of chunk size"):
        Recipe("x", global_batch=100, chunk_size=32)
    with pytest.raises(ConfigError, match="unknown model"):
        Recipe("x", model="vgg")


def test_describe_prints_the_derived_numbers():
    text = RECIPES["resnet50-goyal"].describe(1_281_167)
    for piece in ("128 chunks of 128", "78 steps/epoch", "7020 steps", "6.4 peak",
                  "(780 steps)", "8 workers: 16 chunks", "96 workers: 1-2 chunks",
                  "loss scale 1024"):
        assert piece in text, piece


def _train(precision, channels_last, worlds):
    recipe = Recipe("t", model="small-resnet", model_args=(("width", 4), ("layers", (1,))),
                    global_batch=16, chunk_size=4, epochs=1, precision=precision,
                    channels_last=channels_last, schedule=LRSchedule(base_lr=2.0,
                                                                     warmup_epochs=0))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(48, 3, 6, 6, generator=gen)
    data = torch.utils.data.TensorDataset(x, (x.mean((1, 2, 3)) > 0).long())
    cfg = TrainConfig(global_batch=16, chunk_size=4, epochs=1)

    def make():
        torch.manual_seed(1)
        model = recipe.build_model(2)
        opt, sched, scaler, _ = recipe.build(model, len(data), cfg)
        return TrainingParts(model, opt, sched, scaler)

    return train(worlds, steps=len(worlds), config=cfg, make=make, ds=data,
                 loss=recipe.loss_fn("cpu"))


@pytest.mark.parametrize("precision,channels_last", [
    ("bf16", False), ("fp16", False), ("fp16-static", True), ("fp32", True)])
def test_every_precision_mode_is_world_size_independent(precision, channels_last):
    assert_same(_train(precision, channels_last, [1, 1, 1]),
                _train(precision, channels_last, [4, 2, 3]))
