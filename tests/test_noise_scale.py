"""Gradient noise scale: the estimators against problems whose per-example gradients are known."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from dyntrain.elastic.step.noise import (
    NoiseScaleTracker,
    chunk_gradient_sq_norms,
    noise_estimates,
)

B_SMALL, B_BIG = 8, 256


def least_squares_grads(n: int = 4096, d: int = 20, seed: int = 0) -> torch.Tensor:
    """Per-example gradients g_i = x_i (x_i . w - y_i) of 0.5 (x.w - y)^2 at a fixed w (float64)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w_star = torch.randn(d, generator=gen, dtype=torch.float64)
    y = x @ w_star + torch.randn(n, generator=gen, dtype=torch.float64)
    offset = torch.randn(d, generator=gen, dtype=torch.float64)
    w = w_star + 0.5 * offset / offset.norm()  # |w - w*| = 0.5, so B_simple is about 100
    return x * (x @ w - y)[:, None]


def exact_stats(g: torch.Tensor) -> tuple[float, float]:
    """|G|^2 and tr(Sigma) with Sigma the POPULATION covariance (denominator N)."""
    mean = g.mean(0)
    return float(mean.pow(2).sum()), float((g - mean).pow(2).sum(1).mean())


def step_norms(g: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per step (rows of ``idx``, B_BIG indices each): mean over its B_BIG / B_SMALL chunks of
    |chunk mean|^2, and |batch mean|^2 -- the two numbers the runtime observes per step."""
    steps = idx.shape[0]
    batch = g[idx]  # steps x B_BIG x d
    chunks = batch.view(steps, B_BIG // B_SMALL, B_SMALL, -1).mean(2)
    small = chunks.pow(2).sum(-1).mean(-1)
    big = batch.mean(1).pow(2).sum(-1)
    return small, big


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_exact_answer_sampling_with_replacement():
    g = least_squares_grads()
    n = g.shape[0]
    g2_true, trace_true = exact_stats(g)
    b_true = trace_true / g2_true
    assert 30 < b_true < 300  # between the two batch sizes: both measurements carry signal

    steps = 4000
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(n, (steps, B_BIG), generator=gen)  # i.i.d. with replacement
    small, big = step_norms(g, idx)

    tracker = NoiseScaleTracker(B_SMALL, B_BIG, ema=0.999)
    results = [tracker.update(s, b) for s, b in zip(small.tolist(), big.tolist(), strict=True)]
    g2_mean = sum(r.g2 for r in results) / steps
    trace_mean = sum(r.trace_sigma for r in results) / steps

    # Measured with these seeds (B_simple = 104.4): |G|^2 off by 0.35%, tr(Sigma) by 0.23%,
    # B_simple by 0.12% (means of the raw estimates), the smoothed B_simple (EMA 0.999) by 0.29%.
    assert rel(g2_mean, g2_true) < 0.05
    assert rel(trace_mean, trace_true) < 0.05
    assert rel(trace_mean / g2_mean, b_true) < 0.07
    assert results[-1].b_simple_ema is not None
    assert rel(results[-1].b_simple_ema, b_true) < 0.10


def test_exact_answer_epoch_permutations_with_population_correction():
    """The runtime's batches: consecutive slices of per-epoch permutations (no replacement)."""
    g = least_squares_grads(seed=3)
    n = g.shape[0]
    g2_true, trace_pop = exact_stats(g)
    trace_sample = trace_pop * n / (n - 1)  # what trace_sigma estimates without replacement

    gen = torch.Generator().manual_seed(4)
    epochs = 250
    idx = torch.cat([torch.randperm(n, generator=gen) for _ in range(epochs)]).view(-1, B_BIG)
    small, big = step_norms(g, idx)

    g2_sum = trace_sum = 0.0
    for s, b in zip(small.tolist(), big.tolist(), strict=True):
        g2, trace = noise_estimates(s, B_SMALL, b, B_BIG, population=n)
        g2_sum, trace_sum = g2_sum + g2, trace_sum + trace
    steps = idx.shape[0]
    # Measured: 0.23% off with the correction, 2.6% without it (the bias is B_simple / N).
    assert rel(g2_sum / steps, g2_true) < 0.015
    assert rel(trace_sum / steps, trace_sample) < 0.05


def _enumerated_expectations(g: torch.Tensor, b_small: int, b_big: int,
                             with_replacement: bool) -> tuple[float, float]:
    """Exact E[mean chunk |G_small|^2] and E[|G_big|^2] over every ordered batch."""
    n = g.shape[0]
    if with_replacement:
        batches = list(itertools.product(range(n), repeat=b_big))
    else:
        batches = list(itertools.permutations(range(n), b_big))
    idx = torch.tensor(batches)
    batch = g[idx]
    chunks = batch.view(len(batches), b_big // b_small, b_small, -1).mean(2)
    small = chunks.pow(2).sum(-1).mean(-1).mean()
    big = batch.mean(1).pow(2).sum(-1).mean()
    return float(small), float(big)


@pytest.mark.parametrize("b_small,b_big", [(1, 2), (1, 3), (2, 4)])
def test_estimators_exact_in_expectation_with_replacement(b_small, b_big):
    g = torch.randn(5, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    g2_true, trace_pop = exact_stats(g)
    small, big = _enumerated_expectations(g, b_small, b_big, with_replacement=True)
    g2, trace = noise_estimates(small, b_small, big, b_big)  # linear, so E[est] = est(E[.])
    assert g2 == pytest.approx(g2_true, rel=1e-12, abs=1e-12)
    assert trace == pytest.approx(trace_pop, rel=1e-12)


@pytest.mark.parametrize("b_small,b_big", [(1, 2), (1, 4), (2, 4)])
def test_estimators_exact_in_expectation_without_replacement(b_small, b_big):
    n = 5
    g = torch.randn(n, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    g2_true, trace_pop = exact_stats(g)
    small, big = _enumerated_expectations(g, b_small, b_big, with_replacement=False)
    g2_raw, trace = noise_estimates(small, b_small, big, b_big)
    assert trace == pytest.approx(trace_pop * n / (n - 1), rel=1e-12)
    assert g2_raw == pytest.approx(g2_true - trace_pop / (n - 1), rel=1e-12, abs=1e-12)
    g2, trace_c = noise_estimates(small, b_small, big, b_big, population=n)
    assert g2 == pytest.approx(g2_true, rel=1e-12, abs=1e-12)
    assert trace_c == trace


def test_noise_estimates_inverts_the_model():
    g2, trace = 0.3, 27.0
    small, big = g2 + trace / 8, g2 + trace / 256
    got = noise_estimates(small, 8, big, 256)
    assert got == pytest.approx((g2, trace), rel=1e-12)


@pytest.mark.parametrize("b_small,b_big", [(8, 8), (16, 8), (0, 8), (-1, 8), (4, 0)])
def test_bad_batch_sizes_raise(b_small, b_big):
    with pytest.raises(ValueError):
        noise_estimates(1.0, b_small, 0.5, b_big)
    with pytest.raises(ValueError):
        NoiseScaleTracker(b_small, b_big)


def test_bad_ema_and_population_raise():
    with pytest.raises(ValueError):
        NoiseScaleTracker(8, 256, ema=1.0)
    with pytest.raises(ValueError):
        NoiseScaleTracker(8, 256, population=100)
    with pytest.raises(ValueError):
        noise_estimates(1.0, 8, 0.5, 256, population=100)


def test_first_update_equals_raw_estimate_then_bias_corrected_ema():
    tracker = NoiseScaleTracker(8, 256, ema=0.9)
    assert tracker.b_simple is None and tracker.g2_ema is None
    first = tracker.update(4.0, 0.5)
    g2_1, tr_1 = noise_estimates(4.0, 8, 0.5, 256)
    assert first.g2 == first.g2_ema == pytest.approx(g2_1)
    assert first.trace_sigma == first.trace_ema == pytest.approx(tr_1)
    assert first.b_simple_ema == pytest.approx(tr_1 / g2_1)
    assert first.b_simple == pytest.approx(tr_1 / g2_1)

    second = tracker.update(3.0, 0.6)
    g2_2, tr_2 = noise_estimates(3.0, 8, 0.6, 256)
    norm = 1 - 0.9**2
    g2_ema = (0.9 * 0.1 * g2_1 + 0.1 * g2_2) / norm
    tr_ema = (0.9 * 0.1 * tr_1 + 0.1 * tr_2) / norm
    assert second.g2_ema == pytest.approx(g2_ema)
    assert second.trace_ema == pytest.approx(tr_ema)
    assert second.b_simple_ema == pytest.approx(tr_ema / g2_ema)
    assert tracker.b_simple == pytest.approx(tr_ema / g2_ema)


def test_b_simple_is_none_while_g2_is_not_positive():
    tracker = NoiseScaleTracker(8, 256)
    # |G_big|^2 far below |G_small|^2 * 8/256: the |G|^2 estimate comes out negative
    res = tracker.update(10.0, 0.01)
    assert res.g2 < 0 and res.g2_ema < 0
    assert res.b_simple is None and res.b_simple_ema is None
    assert tracker.b_simple is None
    with pytest.raises(ValueError):
        tracker.update(math.inf, 1.0)


def test_state_dict_round_trip():
    gen = torch.Generator().manual_seed(7)
    feed = (torch.rand(20, 2, generator=gen, dtype=torch.float64) + torch.tensor([1.0, 0.2]))
    a = NoiseScaleTracker(8, 256, ema=0.95, population=4096)
    for s, b in feed[:10].tolist():
        a.update(s, b)
    state = json.loads(json.dumps(a.state_dict()))  # plain floats / ints only
    b_tracker = NoiseScaleTracker(8, 256, ema=0.95, population=4096)
    b_tracker.load_state_dict(state)
    assert b_tracker.state_dict() == a.state_dict()
    for s, b in feed[10:].tolist():
        assert a.update(s, b) == b_tracker.update(s, b)

    with pytest.raises(ValueError):
        NoiseScaleTracker(8, 128, ema=0.95, population=4096).load_state_dict(state)
    with pytest.raises(ValueError):
        NoiseScaleTracker(8, 256, ema=0.9, population=4096).load_state_dict(state)


def test_chunk_gradient_sq_norms_hand_made():
    chunks = [torch.tensor([3.0, 4.0]), torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
              torch.zeros(2)]
    assert chunk_gradient_sq_norms(chunks) == pytest.approx((25.0 + 1.0 + 0.0) / 3)
    # per-parameter lists: each chunk is a sequence of parameter gradients
    per_param = [[torch.tensor([1.0, 2.0]), torch.tensor([[2.0]])],
                 (torch.tensor([0.0, 0.0]), torch.tensor([[1.0]]))]
    assert chunk_gradient_sq_norms(per_param) == pytest.approx((1 + 4 + 4 + 1) / 2)
    with pytest.raises(ValueError):
        chunk_gradient_sq_norms([])


def test_chunk_gradient_sq_norms_feeds_the_tracker():
    g = least_squares_grads(n=64, d=4)
    idx = torch.arange(32)
    chunk_means = [g[idx[i:i + 8]].mean(0) for i in range(0, 32, 8)]
    small = chunk_gradient_sq_norms(chunk_means)
    exp_small = float(torch.stack(chunk_means).pow(2).sum(-1).mean())
    big = float(g[idx].mean(0).pow(2).sum())
    assert small == pytest.approx(exp_small, rel=1e-12)
    g2, trace = noise_estimates(small, 8, big, 32)
    res = NoiseScaleTracker(8, 32).update(small, big)
    assert (res.g2, res.trace_sigma) == pytest.approx((g2, trace))
