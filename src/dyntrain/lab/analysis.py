"""The scaling analysis of a set of studies: steps to result against batch size, the
critical-batch-size fit, the scaling regimes and the learning-rate heuristics, as pure functions.

:func:`analyse` turns studies (see :mod:`dyntrain.lab.results`) into one
:class:`WorkloadReport` per workload (dataset, model, optimizer);
:mod:`dyntrain.lab.render` writes them as JSON, Markdown and terminal lines.

Best learning rate and momentum are read from the best trial's hyperparameters (the trial
that reached the target in the fewest steps at that batch size). The lookup is lenient:

1. a top-level key named, case-insensitively, one of :data:`LR_KEYS` (in that order of
   preference), e.g. ``learning_rate``, ``lr``, ``base_learning_rate``;
2. otherwise a nested or dotted key (``{"optimizer": {"lr": 0.1}}``, ``"optimizer/lr"``)
   whose last part is one of those names;
3. otherwise one whose part before a ``value``-like suffix is, e.g. ``learning_rate.value``
   or ``{"learning_rate": {"value": 0.1}}``.

Values must be numbers (or strings holding one) and, for a learning rate, positive. Momentum
is looked up the same way with :data:`MOMENTUM_KEYS`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dyntrain.lab.fit import (
    DIMINISHING,
    MAXIMAL,
    NOT_REACHED,
    PERFECT,
    REGIME_SLACK,
    Fit,
    classify_regimes,
    edge_warnings,
    fit_steps_curve,
    scaling_heuristics,
)
from dyntrain.lab.results import (
    NO_FINISHED_TRIALS,
    LabError,
    Study,
    group_studies,
    steps_curve,
)

LR_KEYS = ("learning_rate", "lr", "base_learning_rate", "initial_learning_rate",
           "init_learning_rate", "peak_learning_rate", "max_learning_rate", "base_lr",
           "max_lr", "peak_lr", "eta")
MOMENTUM_KEYS = ("momentum", "beta1", "beta_1", "adam_beta1", "b1")
_VALUE_SUFFIXES = ("value", "init", "initial", "base", "peak", "max")

MIN_FIT_POINTS = 3

_SLACK = "4/3" if abs(REGIME_SLACK - 4 / 3) < 1e-12 else f"{REGIME_SLACK:g}"
_F = 1 / (REGIME_SLACK - 1)  # on the model curve the regimes change at B_crit / _F, _F * B_crit


def _ratio(x: float) -> str:
    return next((f"{n}/{d}" for d in (1, 2, 3, 4, 5, 6, 8) for n in range(1, 10 * d)
                 if abs(n / d - x) < 1e-9), f"{x:.3g}")

REGIME_RULE = (
    f"Each batch size that reached the target is labelled from its measured steps S and "
    f"examples B·S against the fit: *{PERFECT}* when B·S ≤ {_SLACK}·E_min (doubling the batch "
    f"still nearly halves the steps), *{MAXIMAL}* when S ≤ {_SLACK}·S_min (a bigger batch saves "
    f"at most {1 - 1 / REGIME_SLACK:.0%} of the steps), *{DIMINISHING}* otherwise; on the fitted "
    f"curve these are B ≤ B_crit/{_F:g} and B ≥ {_F:g}·B_crit (local log-log slope "
    f"≤ −{_ratio(_F / (1 + _F))} and ≥ −{_ratio(1 / (1 + _F))}). A point that passes both "
    f"tests goes to the side of B_crit it lies on."
)




# ---------------------------------------------------------------------------------------------
# data


@dataclass
class PointReport:
    """One batch size of a workload: steps to result (None with ``reason`` if never reached)."""

    batch_size: int
    steps: int | None
    reason: str
    best_trial: str | None
    hyperparameters: dict[str, Any]
    learning_rate: float | None
    momentum: float | None
    regime: str | None  # None: reached but no fit to classify against
    trials: int
    diverged: int

    @property
    def examples(self) -> int | None:
        """Examples to result, ``B * S``."""
        return None if self.steps is None else self.batch_size * self.steps


@dataclass
class WorkloadReport:
    """The analysis of one workload (dataset, model, optimizer)."""

    dataset: str
    model: str
    optimizer: str
    metric: str
    target: float
    higher_is_better: bool
    points: list[PointReport]
    fit: Fit | None
    fit_note: str  # why there is no fit ("" when there is one)
    lr: dict[str, Any] | None  # scaling_heuristics(...) output
    lr_note: str  # why there is no learning-rate analysis ("" when there is one)
    warnings: list[str] = field(default_factory=list)
    eval_every: tuple[int, ...] = ()  # the evaluation intervals k of its studies (if recorded)

    @property
    def evaluation(self) -> str:
        """How often the metric was evaluated, for the report."""
        if not self.eval_every:
            return "evaluation interval not recorded"
        ks = ", ".join(str(k) for k in self.eval_every)
        return f"evaluated every {ks} step{'s' if self.eval_every != (1,) else ''}"

    @property
    def workload(self) -> tuple[str, str, str]:
        return (self.dataset, self.model, self.optimizer)

    @property
    def name(self) -> str:
        return "/".join(self.workload)

    @property
    def goal(self) -> str:
        """The target as a condition, e.g. ``valid_error < 0.05``."""
        return f"{self.metric} {'>' if self.higher_is_better else '<'} {self.target:g}"

    def regime_batches(self, regime: str) -> list[int]:
        return [p.batch_size for p in self.points if p.regime == regime]


# ---------------------------------------------------------------------------------------------
# hyperparameter lookup


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return x if math.isfinite(x) else None


def _flatten(d: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple, Any]]:
    out: list[tuple[tuple, Any]] = []
    for k, v in d.items():
        parts = (*prefix, *str(k).lower().replace("/", ".").split("."))
        if isinstance(v, Mapping):
            out += _flatten(v, parts)
        else:
            out.append((parts, v))
    return out


def find_hyperparameter(hparams: Mapping[str, Any], names: Sequence[str], *,
                        positive: bool = False) -> float | None:
    """The first numeric hyperparameter matching ``names`` (see the module docstring)."""
    def ok(value: Any) -> float | None:
        x = _number(value)
        return None if x is None or (positive and x <= 0) else x

    lowered = {str(k).lower(): v for k, v in hparams.items()}
    for name in names:
        if name in lowered and (x := ok(lowered[name])) is not None:
            return x
    flat = _flatten(hparams)
    for name in names:
        for parts, v in flat:
            if parts[-1] == name and (x := ok(v)) is not None:
                return x
    for name in names:
        for parts, v in flat:
            if (len(parts) >= 2 and parts[-2] == name and parts[-1] in _VALUE_SUFFIXES
                    and (x := ok(v)) is not None):
                return x
    return None


# ---------------------------------------------------------------------------------------------
# analysis


def _fit_note(reached: int, total: int, trials: int) -> str:
    if trials == 0:
        return f"{NO_FINISHED_TRIALS} ({total} batch size{'s' if total != 1 else ''} planned)"
    if reached == 0:
        return f"target never reached at any batch size ({total} measured)"
    return (f"target reached at only {reached} of {total} batch size"
            f"{'s' if total != 1 else ''}; need at least {MIN_FIT_POINTS} to fit "
            f"S(B) = S_min·(1 + B_crit/B)")


def _analyse_workload(studies: list[Study]) -> WorkloadReport:
    curve = steps_curve(studies)
    first = studies[0]
    batches = [p.batch_size for p in curve]
    steps = [p.steps for p in curve]
    reached = sum(s is not None for s in steps)
    fit: Fit | None = None
    fit_note = ""
    if reached >= MIN_FIT_POINTS:
        try:
            fit = fit_steps_curve(batches, steps)
        except LabError as e:
            fit_note = str(e)
    else:
        fit_note = _fit_note(reached, len(curve), sum(len(s.trials) for s in studies))
    if fit is not None:
        regimes: list[str | None] = list(classify_regimes(batches, steps, fit))
    else:
        regimes = [NOT_REACHED if s is None else None for s in steps]

    counts: dict[int, tuple[int, int]] = {}
    for s in studies:
        n, d = counts.get(s.batch_size, (0, 0))
        counts[s.batch_size] = (n + len(s.trials), d + sum(t.diverged for t in s.trials))

    points = []
    for p, regime in zip(curve, regimes, strict=True):
        hp = dict(p.best_trial.hyperparameters) if p.best_trial is not None else {}
        n, d = counts.get(p.batch_size, (0, 0))
        points.append(PointReport(
            batch_size=p.batch_size, steps=p.steps, reason=p.reason,
            best_trial=p.best_trial.trial_id if p.best_trial is not None else None,
            hyperparameters=hp,
            learning_rate=find_hyperparameter(hp, LR_KEYS, positive=True) if hp else None,
            momentum=find_hyperparameter(hp, MOMENTUM_KEYS) if hp else None,
            regime=regime, trials=n, diverged=d))

    lrs = [p.learning_rate for p in points]
    lr: dict[str, Any] | None = None
    lr_note = ""
    if any(x is not None for x in lrs):
        lr = scaling_heuristics(batches, lrs)
        if lr["measured_exponent"] is None:
            lr_note = "a best learning rate at only one batch size: no exponent"
    elif reached:
        lr_note = ("no learning rate in the best trials' hyperparameters (looked for "
                   f"{', '.join(LR_KEYS[:4])}, ...)")
    else:
        lr_note = "no best trials"

    warnings: list[str] = []
    for s in studies:
        warnings += edge_warnings(s)
    if fit is not None and fit.r2 < 0.9:
        warnings.append(f"{'/'.join(first.workload)}: the fit is poor (R² = {fit.r2:.2f}); "
                        "treat S_min and B_crit as rough")
    return WorkloadReport(
        dataset=first.dataset, model=first.model, optimizer=first.optimizer,
        metric=first.metric, target=first.target, higher_is_better=bool(first.higher_is_better),
        points=points, fit=fit, fit_note=fit_note, lr=lr, lr_note=lr_note, warnings=warnings,
        eval_every=tuple(sorted({s.eval_every for s in studies if s.eval_every is not None})))


def analyse(studies: Iterable[Study], *, target: float | None = None) -> list[WorkloadReport]:
    """One :class:`WorkloadReport` per workload (dataset, model, optimizer), sorted.

    ``target``, when given, replaces every study's target. Raises :class:`LabError` when
    there are no studies or one workload mixes metrics or targets.
    """
    studies = list(studies)
    if not studies:
        raise LabError("no studies to report on")
    if target is not None:
        studies = [replace(s, target=float(target)) for s in studies]
    return [_analyse_workload(group) for group in group_studies(studies).values()]


def by_dataset_model(reports: Iterable[WorkloadReport]
                     ) -> dict[tuple[str, str], list[WorkloadReport]]:
    """Reports grouped by (dataset, model): the optimizers that can be compared."""
    groups: dict[tuple[str, str], list[WorkloadReport]] = {}
    for r in reports:
        groups.setdefault((r.dataset, r.model), []).append(r)
    return {k: sorted(v, key=lambda r: r.optimizer) for k, v in sorted(groups.items())}


def optimizer_comparisons(reports: Iterable[WorkloadReport]) -> list[dict[str, Any]]:
    """For each (dataset, model) with two or more optimizers: their fits side by side and the
    steps to result at the batch sizes all of them measured."""
    out = []
    for (dataset, model), group in by_dataset_model(reports).items():
        if len(group) < 2:
            continue
        common = set.intersection(*({p.batch_size for p in r.points} for r in group))
        batches = sorted(common)
        rows = []
        for r in group:
            at = {p.batch_size: p for p in r.points}
            rows.append({
                "optimizer": r.optimizer,
                "goal": r.goal,
                "s_min": r.fit.s_min if r.fit else None,
                "b_crit": r.fit.b_crit if r.fit else None,
                "e_min": r.fit.e_min if r.fit else None,
                "r2": r.fit.r2 if r.fit else None,
                "fit_note": r.fit_note,
                "steps": [at[b].steps for b in batches],
            })
        out.append({"dataset": dataset, "model": model, "batch_sizes": batches,
                    "same_goal": len({r.goal for r in group}) == 1, "rows": rows})
    return out

