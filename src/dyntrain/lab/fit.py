"""The McCandlish et al. model of steps to result against batch size, and report helpers.

Model: ``S(B) = S_min * (1 + B_crit / B)`` steps to reach a target at batch size ``B``;
examples ``E(B) = B * S(B)``; ``E_min = S_min * B_crit``. ``S_min`` is the fewest steps
(infinite batch), ``E_min`` the fewest examples (tiny batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dyntrain.lab.results import LabError, Study, best_steps

PERFECT = "perfect scaling"
DIMINISHING = "diminishing returns"
MAXIMAL = "maximal data parallelism"
NOT_REACHED = "not reached"


@dataclass(frozen=True)
class Fit:
    """Fitted ``S(B) = s_min * (1 + b_crit / B)``.

    ``r2`` is the coefficient of determination **in log space**:
    ``1 - sum (log S - log S_fit)^2 / sum (log S - mean log S)^2``, matching the fit's loss.
    ``notes`` says when ``b_crit`` ended on the edge of the searched range (the data show no
    perfect-scaling, or no maximal-data-parallelism, regime, so ``b_crit`` is only a bound).
    """

    s_min: float
    b_crit: float
    e_min: float
    r2: float
    n: int
    notes: tuple[str, ...] = ()

    def predict(self, batch_size: Any) -> Any:
        """Model steps to result at ``batch_size`` (scalar or array)."""
        return self.s_min * (1.0 + self.b_crit / np.asarray(batch_size, dtype=float))


_GRID_DECADES = 3.0  # b_crit is searched from min(B) / 10**3 to max(B) * 10**3
_GRID_POINTS = 601


def _log_loss(x: float, logb: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Loss at log b_crit = x with log s_min profiled out in closed form: (loss, log s_min)."""
    shape = np.logaddexp(0.0, x - logb)  # log(1 + b_crit / B), stable for large ratios
    c = float(np.mean(y - shape))
    r = y - c - shape
    return float(r @ r), c


def _points(batch_sizes: Sequence[float], steps: Sequence[float | None]):
    if len(batch_sizes) != len(steps):
        raise LabError(f"{len(batch_sizes)} batch sizes but {len(steps)} step counts")
    pairs = [(float(b), float(s)) for b, s in zip(batch_sizes, steps, strict=True)
             if s is not None]
    for b, s in pairs:
        if not (b > 0 and s > 0 and math.isfinite(b) and math.isfinite(s)):
            raise LabError(f"batch sizes and steps must be positive and finite: B={b:g} S={s:g}")
    return pairs


def fit_steps_curve(batch_sizes: Sequence[float], steps: Sequence[float | None]) -> Fit:
    """Fit ``S(B) = S_min * (1 + B_crit / B)`` to measured steps to result.

    Minimises ``sum (log S_i - log(S_min + S_min * B_crit / B_i))^2`` over ``S_min, B_crit > 0``:
    log space weighs the spread of scales (tens to tens of thousands of steps) evenly, i.e.
    relative errors. For a fixed ``B_crit`` the best ``log S_min`` is a mean (closed form), so
    the search is one-dimensional: a grid over ``log B_crit`` spanning three decades beyond the
    measured batch sizes on both sides, refined by golden-section search around the best grid
    point. Points with ``steps=None`` (target never reached) are skipped; at least 3 points
    with steps, at 2 or more distinct batch sizes, are needed.

    Args:
        batch_sizes: The measured batch sizes.
        steps: Steps to result at each (None where the target was never reached).

    Returns:
        ``S_min``, ``B_crit``, ``E_min = S_min * B_crit`` and R² in log space.

    Raises:
        LabError: Fewer than 3 points reached the target, or fewer than 2 distinct batch sizes.
    """
    pairs = _points(batch_sizes, steps)
    if len(pairs) < 3:
        raise LabError(f"need at least 3 batch sizes that reached the target to fit, "
                       f"got {len(pairs)}")
    b = np.array([p[0] for p in pairs])
    y = np.log([p[1] for p in pairs])
    if np.unique(b).size < 2:
        raise LabError("need at least 2 distinct batch sizes to fit")
    logb = np.log(b)
    lo = float(logb.min()) - _GRID_DECADES * math.log(10)
    hi = float(logb.max()) + _GRID_DECADES * math.log(10)
    grid = np.linspace(lo, hi, _GRID_POINTS)
    losses = [_log_loss(x, logb, y)[0] for x in grid]
    k = int(np.argmin(losses))
    a, c = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    inv_phi = (math.sqrt(5) - 1) / 2
    x1, x2 = c - inv_phi * (c - a), a + inv_phi * (c - a)
    f1, f2 = _log_loss(x1, logb, y)[0], _log_loss(x2, logb, y)[0]
    for _ in range(60):
        if f1 < f2:
            c, x2, f2 = x2, x1, f1
            x1 = c - inv_phi * (c - a)
            f1 = _log_loss(x1, logb, y)[0]
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + inv_phi * (c - a)
            f2 = _log_loss(x2, logb, y)[0]
    candidates = [(losses[k], float(grid[k])), (f1, x1), (f2, x2)]
    loss, x = min(candidates)
    _, log_s_min = _log_loss(x, logb, y)
    s_min, b_crit = math.exp(log_s_min), math.exp(x)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    # all steps equal: r2 is undefined; report 1 if the fit is within 0.1% rms, else 0
    r2 = 1.0 - loss / ss_tot if ss_tot > 0 else float(loss / len(y) < 1e-6)
    notes = []
    if k == 0:
        notes.append("B_crit is below the fit range: no perfect-scaling regime was measured")
    elif k == len(grid) - 1:
        notes.append("B_crit is above the fit range: no maximal-data-parallelism regime was "
                     "measured, so only E_min = S_min * B_crit is determined")
    return Fit(s_min, b_crit, s_min * b_crit, r2, len(pairs), tuple(notes))


# regime thresholds: on the model curve they fall at B = B_crit / 3 and B = 3 * B_crit
REGIME_SLACK = 4.0 / 3.0


def classify_regimes(batch_sizes: Sequence[float], steps: Sequence[float | None],
                     fit: Fit) -> list[str]:
    """Label each measured point with its scaling regime.

    Rule (on measured values, relative to the fit's ``S_min`` and ``E_min``):

    - ``"perfect scaling"`` when the examples used, ``B * S``, are within 4/3 of ``E_min``
      (doubling the batch still nearly halves the steps);
    - ``"maximal data parallelism"`` when the steps ``S`` are within 4/3 of ``S_min``
      (a bigger batch can save at most 25% of the steps);
    - ``"diminishing returns"`` otherwise; ``"not reached"`` where ``steps`` is None.

    On the model curve these are exactly ``B <= B_crit / 3`` (local log-log slope <= -3/4)
    and ``B >= 3 * B_crit`` (slope >= -1/4). If noise puts a point in both, it goes to the
    side of ``B_crit`` it lies on.

    Args:
        batch_sizes: The measured batch sizes.
        steps: Steps to result at each (None where the target was never reached).
        fit: The fit of these points (``fit_steps_curve``).

    Raises:
        LabError: ``batch_sizes`` and ``steps`` differ in length.
    """
    if len(batch_sizes) != len(steps):
        raise LabError(f"{len(batch_sizes)} batch sizes but {len(steps)} step counts")
    labels = []
    for b, s in zip(batch_sizes, steps, strict=True):
        if s is None:
            labels.append(NOT_REACHED)
            continue
        perfect = b * s <= REGIME_SLACK * fit.e_min
        maximal = s <= REGIME_SLACK * fit.s_min
        if perfect and maximal:
            labels.append(PERFECT if b < fit.b_crit else MAXIMAL)
        elif perfect:
            labels.append(PERFECT)
        elif maximal:
            labels.append(MAXIMAL)
        else:
            labels.append(DIMINISHING)
    return labels


def scaling_heuristics(batch_sizes: Sequence[float],
                       best_lrs: Sequence[float | None]) -> dict[str, Any]:
    """Learning-rate scaling heuristics against the measured best learning rates.

    Both heuristics are anchored at the smallest batch size with a best learning rate:
    ``linear`` is ``lr0 * B / B0`` and ``sqrt`` is ``lr0 * sqrt(B / B0)``. ``measured_exponent``
    is the least-squares slope of log lr against log B (1 = linear, 0.5 = square root; None
    with fewer than 2 distinct batch sizes). Returns lists aligned with ``batch_sizes``.
    """
    if len(batch_sizes) != len(best_lrs):
        raise LabError(f"{len(batch_sizes)} batch sizes but {len(best_lrs)} learning rates")
    known = [(float(b), float(lr)) for b, lr in zip(batch_sizes, best_lrs, strict=True)
             if lr is not None]
    if not known:
        raise LabError("no best learning rates to anchor the scaling heuristics")
    if any(b <= 0 or lr <= 0 for b, lr in known):
        raise LabError("batch sizes and learning rates must be positive")
    b0, lr0 = min(known)
    exponent = None
    if len({b for b, _ in known}) >= 2:
        xs = np.log([b for b, _ in known])
        ys = np.log([lr for _, lr in known])
        exponent = float(np.polyfit(xs, ys, 1)[0])
    return {
        "batch_sizes": [float(b) for b in batch_sizes],
        "measured": [None if lr is None else float(lr) for lr in best_lrs],
        "linear": [lr0 * float(b) / b0 for b in batch_sizes],
        "sqrt": [lr0 * math.sqrt(float(b) / b0) for b in batch_sizes],
        "anchor_batch_size": b0,
        "anchor_lr": lr0,
        "measured_exponent": exponent,
    }


EDGE_FRACTION = 0.05
_LO_KEYS = ("min", "min_value", "low", "lower", "minimum")
_HI_KEYS = ("max", "max_value", "high", "upper", "maximum")


def _range(spec: Any) -> tuple[float, float, str] | None:
    """(low, high, scale) of a numeric search-space entry; None for categorical/unknown ones."""
    scale = ""
    if isinstance(spec, dict):
        lo = next((spec[k] for k in _LO_KEYS if k in spec), None)
        hi = next((spec[k] for k in _HI_KEYS if k in spec), None)
        scale = str(spec.get("scale", spec.get("scale_type", ""))).lower()
    elif isinstance(spec, (list, tuple)) and len(spec) == 2:
        lo, hi = spec
    else:
        return None
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        return None
    if not hi > lo:
        return None
    return lo, hi, scale


def _normalise_space(search_space: Any) -> dict[str, Any]:
    if isinstance(search_space, list):  # [{"name": ..., "min": ..., ...}, ...]
        return {str(p["name"]): p for p in search_space if isinstance(p, dict) and "name" in p}
    return dict(search_space or {})


def edge_warnings(study: Study, search_space: Any = None) -> list[str]:
    """Warn for each numeric hyperparameter of the study's best trial that sits within 5% of
    the search range (measured on the parameter's scale) from either bound.

    The scale is log for ranges with a positive lower bound unless the entry says
    ``scale: linear``; ``scale`` containing ``reverse`` or ``one_minus`` measures
    ``log(1 - x)`` (momentum-like). ``search_space`` defaults to ``study.search_space``;
    entries are ``{"min": lo, "max": hi, "scale": ...}`` or ``[lo, hi]`` (categorical entries
    are ignored). A value beyond a bound counts as on that edge.
    """
    space = _normalise_space(study.search_space if search_space is None else search_space)
    _, trial = best_steps(study)
    if trial is None:
        return []
    warnings = []
    for name, spec in space.items():
        rng = _range(spec)
        value = trial.hyperparameters.get(name)
        if rng is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        lo, hi, scale = rng
        v = float(value)
        if ("reverse" in scale or "one_minus" in scale) and hi < 1 and v < 1:
            # log(1 - x) runs the other way: the upper bound maps to the lower end
            frac = 1 - (math.log(1 - v) - math.log(1 - hi)) / (
                math.log(1 - lo) - math.log(1 - hi))
        elif lo > 0 and v > 0 and "linear" not in scale:
            frac = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
        else:
            frac = (v - lo) / (hi - lo)
        near_lo, near_hi = frac < EDGE_FRACTION, frac > 1 - EDGE_FRACTION
        if near_lo or near_hi:
            edge = "lower" if near_lo else "upper"
            warnings.append(
                f"{'/'.join(study.workload)} batch {study.batch_size}: best trial "
                f"{trial.trial_id} has {name}={v:g} at the {edge} edge of the search space "
                f"[{lo:g}, {hi:g}]; the optimum may lie outside it")
    return warnings
