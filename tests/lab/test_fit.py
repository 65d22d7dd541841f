"""The S(B) = S_min (1 + B_crit / B) fit, regime labels and learning-rate heuristics."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntrain.lab import LabError, classify_regimes, fit_steps_curve, scaling_heuristics
from dyntrain.lab.fit import DIMINISHING, MAXIMAL, NOT_REACHED, PERFECT

S_MIN, B_CRIT = 1000.0, 256.0
BATCHES = 2.0 ** np.arange(4, 14)  # 16 .. 8192


def model(b, s_min=S_MIN, b_crit=B_CRIT):
    return s_min * (1 + b_crit / np.asarray(b, dtype=float))


def test_recovers_parameters_on_clean_curve():
    fit = fit_steps_curve(BATCHES, model(BATCHES))
    assert fit.s_min == pytest.approx(S_MIN, rel=0.01)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=0.01)
    assert fit.e_min == pytest.approx(S_MIN * B_CRIT, rel=0.01)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)
    assert fit.n == len(BATCHES) and fit.notes == ()
    assert fit.predict(512) == pytest.approx(1500, rel=0.01)


def test_recovers_parameters_from_integer_steps():
    steps = [int(round(s)) for s in model(BATCHES)]
    fit = fit_steps_curve([int(b) for b in BATCHES], steps)
    assert fit.s_min == pytest.approx(S_MIN, rel=0.02)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=0.02)


@pytest.mark.parametrize("seed", range(5))
def test_recovers_parameters_with_3pct_noise(seed):
    rng = np.random.default_rng(seed)
    noisy = model(BATCHES) * np.exp(rng.normal(0.0, 0.03, BATCHES.size))
    fit = fit_steps_curve(BATCHES, noisy)
    assert fit.s_min == pytest.approx(S_MIN, rel=0.15)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=0.15)
    assert fit.r2 > 0.99


@settings(max_examples=40, deadline=None)
@given(s_min=st.floats(10, 1e5), b_crit=st.floats(8, 1e4))
def test_recovers_any_curve_with_both_regimes_measured(s_min, b_crit):
    batches = 2.0 ** np.arange(0, 17)  # 1 .. 65536: spans b_crit / 8 to 8 * b_crit
    fit = fit_steps_curve(batches, model(batches, s_min, b_crit))
    assert fit.s_min == pytest.approx(s_min, rel=1e-3)
    assert fit.b_crit == pytest.approx(b_crit, rel=1e-3)


def test_skips_unreached_points():
    steps = [*model(BATCHES[:-2]), None, None]
    fit = fit_steps_curve(BATCHES, steps)
    assert fit.n == len(BATCHES) - 2
    assert fit.b_crit == pytest.approx(B_CRIT, rel=0.01)


def test_perfect_scaling_only_is_flagged():
    b = np.array([16.0, 32, 64, 128])
    fit = fit_steps_curve(b, 1e6 / b)  # S * B constant: no S_min visible
    assert fit.notes and "only E_min" in fit.notes[0]
    assert fit.e_min == pytest.approx(1e6, rel=0.01)


def test_flat_curve_is_flagged():
    fit = fit_steps_curve([16, 32, 64, 128], [500, 500, 500, 500])
    assert fit.s_min == pytest.approx(500, rel=0.01)
    assert fit.notes and "no perfect-scaling" in fit.notes[0]
    assert fit.r2 == 1.0


@pytest.mark.parametrize("batches, steps", [
    ([], []),
    ([16, 32], [100, 50]),
    ([16, 32, 64], [100, 50, None]),
])
def test_fewer_than_three_points_is_an_error(batches, steps):
    with pytest.raises(LabError, match="at least 3"):
        fit_steps_curve(batches, steps)


def test_bad_inputs():
    with pytest.raises(LabError, match="at least 2 distinct"):
        fit_steps_curve([64, 64, 64], [10, 11, 12])
    with pytest.raises(LabError, match="positive"):
        fit_steps_curve([16, 32, 64], [100, 0, 25])
    with pytest.raises(LabError, match="3 batch sizes but 2"):
        fit_steps_curve([16, 32, 64], [100, 50])


def test_regimes_on_synthetic_curve():
    steps = model(BATCHES)
    fit = fit_steps_curve(BATCHES, steps)
    labels = dict(zip(BATCHES.astype(int).tolist(), classify_regimes(BATCHES, steps, fit),
                      strict=True))
    # B <= B_crit / 3 perfect, B >= 3 * B_crit maximal, diminishing between
    assert [labels[b] for b in (16, 32, 64)] == [PERFECT] * 3
    assert [labels[b] for b in (128, 256, 512)] == [DIMINISHING] * 3
    assert [labels[b] for b in (1024, 2048, 4096, 8192)] == [MAXIMAL] * 4


def test_regimes_on_noisy_curve_are_ordered():
    rng = np.random.default_rng(1)
    steps = model(BATCHES) * np.exp(rng.normal(0.0, 0.03, BATCHES.size))
    labels = classify_regimes(BATCHES, steps, fit_steps_curve(BATCHES, steps))
    order = {PERFECT: 0, DIMINISHING: 1, MAXIMAL: 2}
    ranks = [order[x] for x in labels]
    assert ranks == sorted(ranks) and ranks[0] == 0 and ranks[-1] == 2


def test_regimes_mark_unreached_points():
    steps = [*model(BATCHES[:-1]), None]
    fit = fit_steps_curve(BATCHES, steps)
    assert classify_regimes(BATCHES, steps, fit)[-1] == NOT_REACHED
    with pytest.raises(LabError):
        classify_regimes(BATCHES, steps[:-1], fit)


def test_scaling_heuristics_anchor_at_smallest_batch():
    h = scaling_heuristics([256, 64, 128, 512], [0.4, None, 0.2, 0.8])
    assert h["anchor_batch_size"] == 128 and h["anchor_lr"] == 0.2
    assert h["linear"] == pytest.approx([0.4, 0.1, 0.2, 0.8])
    assert h["sqrt"] == pytest.approx([0.2 * math.sqrt(2), 0.2 / math.sqrt(2), 0.2, 0.4])
    assert h["measured"] == [0.4, None, 0.2, 0.8]
    assert h["measured_exponent"] == pytest.approx(1.0)
    assert scaling_heuristics([64], [0.1])["measured_exponent"] is None
    with pytest.raises(LabError):
        scaling_heuristics([64, 128], [None, None])
