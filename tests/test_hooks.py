"""Public-API hooks: gradient clipping on the reduced gradient, the validation hook."""

import pytest
import torch

from dyntrain import ElasticTrainer, TrainConfig
from dyntrain.elastic.step.gradnorm import clip_flat_
from dyntrain.elastic.step.validation import Validation
from dyntrain.errors import ConfigError
from test_stepper import assert_same, dataset, loss_fn, make_worker, train


def test_clip_flat_scales_to_the_max_norm():
    g = torch.tensor([3.0, 4.0])
    assert clip_flat_(g, 1.0) == pytest.approx(5.0)
    assert torch.linalg.vector_norm(g) == pytest.approx(1.0, rel=1e-5)
    small = torch.tensor([0.3, 0.4])
    clip_flat_(small, 1.0)
    assert torch.equal(small, torch.tensor([0.3, 0.4]))  # below the bound: untouched


@pytest.mark.parametrize("scaler", [False, True])
def test_clipping_is_world_size_independent(scaler):
    config = TrainConfig(global_batch=40, chunk_size=5, grad_clip_norm=0.05)
    one = train([1] * 6, scaler=scaler, config=config)
    assert_same(one, train([1, 3, 2, 3, 2, 3], scaler=scaler, config=config))
    unclipped = train([1] * 6, scaler=scaler)
    with pytest.raises(AssertionError):  # the bound is tight enough to change training
        assert_same(one, unclipped)


def test_bad_clip_norm_is_a_config_error():
    with pytest.raises(ConfigError, match="grad_clip_norm"):
        TrainConfig(global_batch=8, chunk_size=4, grad_clip_norm=0)


def _fit(validation):
    parts = make_worker()
    config = TrainConfig(global_batch=40, chunk_size=5, epochs=2)  # 5 steps per epoch
    trainer = ElasticTrainer(config, parts.model, parts.optimizer, dataset(), loss_fn,
                             lr_scheduler=parts.lr_scheduler, device="cpu",
                             validation=validation)
    trainer.fit()
    return parts, trainer


def test_validation_hook_runs_when_due_and_does_not_change_training():
    seen = []

    def evaluate(model):
        seen.append(model.training)
        torch.rand(3)  # a careless evaluation that draws random numbers
        x, y = dataset().tensors
        return {"accuracy": float((model(x).argmax(1) == y).float().mean())}

    parts, trainer = _fit(Validation(evaluate, every_steps=3, every_epochs=1))
    assert [v["step"] for v in trainer.validations] == [3, 5, 6, 9, 10]
    assert seen == [False] * 5 and parts.model.training
    assert all(0 <= v["val_accuracy"] <= 1 and "val_seconds" in v for v in trainer.validations)
    plain, _ = _fit(None)
    assert_same(parts, plain)  # eval mode, no grad, generators restored: training unchanged


def test_validation_schedule():
    v = Validation(lambda m: 0.0, every_steps=None, every_epochs=2, at_end=False)
    assert [s for s in range(1, 25) if v.due(s, 5, 24)] == [10, 20]
    assert Validation(lambda m: 0.0).due(24, 5, 24)  # at the end by default
    with pytest.raises(ConfigError):
        Validation(lambda m: 0.0, every_steps=0)


def test_clipping_counts_in_the_fingerprint():
    base = TrainConfig(global_batch=8, chunk_size=4)
    assert base.fingerprint() != TrainConfig(global_batch=8, chunk_size=4,
                                             grad_clip_norm=1.0).fingerprint()
