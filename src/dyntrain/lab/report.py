"""The scaling report: steps to result against batch size, the critical-batch-size fit, the
scaling regimes, learning-rate heuristics and the gradient noise scale, as pure functions.

:func:`analyse` turns studies (see :mod:`dyntrain.lab.results`) into one
:class:`WorkloadReport` per workload (dataset, model, optimizer); :func:`to_json` and
:func:`to_markdown` render them; :mod:`dyntrain.lab.plots` draws the figures.
``dyntrain lab report`` (:mod:`dyntrain.cli.lab_report`) wires these together.

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

The gradient noise scale comes from a dyntrain ``metrics.jsonl`` (one JSON object per line;
records with a ``b_simple`` key, a number or null, and an integer ``step``; other lines and
records are ignored). Its mean is taken over the second half of the logged steps (the steps
from the midpoint of the first and last step carrying ``b_simple`` onwards), where the estimate
has settled, and compared with each workload's fitted ``B_crit``: McCandlish et al. (2018)
predict ``B_crit`` to be close to ``B_simple``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from dyntrain.elastic.linelog import pieces, read_lines
from dyntrain.elastic.storage import StorageError, is_url, open_store
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

__all__ = [
    "LR_KEYS",
    "MOMENTUM_KEYS",
    "REGIME_RULE",
    "NoiseSeries",
    "PointReport",
    "WorkloadReport",
    "analyse",
    "by_dataset_model",
    "find_hyperparameter",
    "fmt",
    "load_noise",
    "lr_verdict",
    "noise_comparisons",
    "optimizer_comparisons",
    "parse_noise_spec",
    "plot_key",
    "summary_lines",
    "to_json",
    "to_markdown",
]

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


@dataclass
class NoiseSeries:
    """``b_simple`` over training from one ``metrics.jsonl``."""

    name: str
    path: str
    steps: list[int]
    values: list[float | None]

    @property
    def window(self) -> tuple[int, int] | None:
        """(first, last) step of the second half of the logged steps."""
        if not self.steps:
            return None
        first, last = min(self.steps), max(self.steps)
        return (math.ceil(first + (last - first) / 2), last)

    def _second_half(self) -> list[float]:
        w = self.window
        if w is None:
            return []
        return [v for s, v in zip(self.steps, self.values, strict=True)
                if s >= w[0] and v is not None and math.isfinite(v)]

    @property
    def mean_second_half(self) -> float | None:
        """Mean of the finite ``b_simple`` values over the second half of training."""
        vals = self._second_half()
        return sum(vals) / len(vals) if vals else None

    @property
    def n_second_half(self) -> int:
        return len(self._second_half())


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


# ---------------------------------------------------------------------------------------------
# gradient noise scale


def parse_noise_spec(spec: str) -> tuple[str | None, Path | str]:
    """``NAME=PATH`` or ``PATH`` (a path that exists as given wins over splitting at ``=``);
    PATH may be an object-store URL (kept as a string)."""
    if "=" in spec and not Path(spec).exists() and not is_url(spec.partition("=")[0]):
        name, _, path = spec.partition("=")
        if not name or not path:
            raise LabError(f"--noise expects [NAME=]PATH, got {spec!r}")
        return name, path if is_url(path) else Path(path)
    return None, spec if is_url(spec) else Path(spec)


def _default_noise_name(path: Path) -> str:
    if path.stem == "metrics" and path.parent.name not in ("", "."):
        return path.parent.name
    return path.stem


def load_noise(path: str | Path, name: str | None = None) -> NoiseSeries:
    """Read ``b_simple`` over training from a dyntrain ``metrics.jsonl``.

    Lines that are blank, JSON values other than objects, or objects without a ``b_simple``
    key are ignored. Raises :class:`LabError` naming the file and line for a line that is not
    JSON, a ``b_simple`` that is neither a number nor null, or a record with ``b_simple`` but
    no integer ``step``; and when the file has no ``b_simple`` records at all.

    ``path`` may be an object-store URL of a run folder or of its ``metrics.jsonl``.
    """
    if is_url(path):
        text, shown = _remote_metrics(str(path))
        path = PurePosixPath(shown.partition("://")[2])  # for the default name
    else:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise LabError(f"{path}: cannot read: {e.strerror}") from None
        except UnicodeDecodeError:
            raise LabError(f"{path}: not a text file") from None
        shown = str(path)
    records: dict[int, float | None] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise LabError(f"{shown}:{lineno}: invalid JSON: {e.msg}") from None
        if not isinstance(rec, dict) or "b_simple" not in rec:
            continue
        raw = rec["b_simple"]
        if raw is None or (isinstance(raw, float) and not math.isfinite(raw)):
            value = None  # null (or NaN/infinity): no estimate at this step
        elif (value := _number(raw)) is None:
            raise LabError(f"{shown}:{lineno}: b_simple is not a number: {raw!r}")
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
            raise LabError(f"{shown}:{lineno}: record with b_simple has no integer step: "
                           f"{step!r}")
        records[int(step)] = value  # a later record for the same step replaces the earlier
    if not records:
        raise LabError(f"{shown}: no records with a b_simple key")
    steps = sorted(records)
    return NoiseSeries(name or _default_noise_name(path), shown, steps,
                       [records[s] for s in steps])


def _remote_metrics(url: str) -> tuple[str, str]:
    """The text of a run folder's metrics on an object store (its segments joined) and its
    URL."""
    root, _, last = url.rstrip("/").rpartition("/")
    if not last.endswith(".jsonl"):
        root, last = url.rstrip("/"), "metrics.jsonl"
    try:
        store = open_store(root)
        if not pieces(store, last):
            raise LabError(f"{root}/{last}: no such file")
        text = "\n".join(read_lines(store, last))
    except StorageError as e:
        raise LabError(str(e)) from None
    return text, f"{root}/{last}"


def noise_comparisons(series: NoiseSeries, reports: Iterable[WorkloadReport]
                      ) -> list[dict[str, Any]]:
    """The series' second-half mean against each fitted workload's ``B_crit``."""
    mean = series.mean_second_half
    out = []
    for r in reports:
        if r.fit is None:
            continue
        ratio = mean / r.fit.b_crit if mean is not None and r.fit.b_crit > 0 else None
        out.append({"workload": r.name, "b_crit": r.fit.b_crit, "b_simple_mean": mean,
                    "ratio": ratio})
    return out


# ---------------------------------------------------------------------------------------------
# rendering


def plot_key(kind: str, dataset: str = "", model: str = "") -> str:
    """The key under which :func:`dyntrain.lab.plots.render` returns a figure's path."""
    return kind if not dataset else f"{kind}:{dataset}/{model}"


def _safe(x: Any) -> Any:
    """JSON-safe copy: non-finite floats become None, unknown objects strings."""
    if x is None or isinstance(x, (bool, str, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_safe(v) for v in x]
    try:
        f = float(x)  # numpy scalars
    except (TypeError, ValueError):
        return str(x)
    return f if math.isfinite(f) else None


def _fit_json(fit: Fit | None) -> dict[str, Any] | None:
    if fit is None:
        return None
    return {"s_min": fit.s_min, "b_crit": fit.b_crit, "e_min": fit.e_min, "r2": fit.r2,
            "n": fit.n, "notes": list(fit.notes),
            "perfect_scaling_below": fit.b_crit / 3, "maximal_parallelism_above": 3 * fit.b_crit}


def _workload_json(r: WorkloadReport) -> dict[str, Any]:
    return {
        "dataset": r.dataset, "model": r.model, "optimizer": r.optimizer,
        "workload": r.name, "metric": r.metric, "target": r.target,
        "higher_is_better": r.higher_is_better, "eval_every": list(r.eval_every),
        "points": [{
            "batch_size": p.batch_size, "steps": p.steps, "examples": p.examples,
            "regime": p.regime, "reason": p.reason, "best_trial": p.best_trial,
            "learning_rate": p.learning_rate, "momentum": p.momentum,
            "hyperparameters": p.hyperparameters, "trials": p.trials, "diverged": p.diverged,
        } for p in r.points],
        "fit": _fit_json(r.fit),
        "fit_note": r.fit_note,
        "regimes": {k: r.regime_batches(k) for k in (PERFECT, DIMINISHING, MAXIMAL)},
        "learning_rate": r.lr,
        "learning_rate_note": r.lr_note,
        "warnings": list(r.warnings),
    }


def to_json(reports: Sequence[WorkloadReport], noise: Sequence[NoiseSeries] = (),
            plots: Mapping[str, str | Path] | None = None) -> dict[str, Any]:
    """The report as a JSON-safe dict (no NaN or infinity: those become null)."""
    data = {
        "format": "dyntrain.lab.report/1",
        "regime_rule": REGIME_RULE,
        "learning_rate_keys": list(LR_KEYS),
        "workloads": [_workload_json(r) for r in reports],
        "optimizer_comparisons": optimizer_comparisons(reports),
        "noise": [{
            "name": s.name, "path": s.path, "records": len(s.steps),
            "first_step": s.steps[0] if s.steps else None,
            "last_step": s.steps[-1] if s.steps else None,
            "window": list(s.window) if s.window else None,
            "b_simple_mean": s.mean_second_half, "n_mean": s.n_second_half,
            "vs_b_crit": noise_comparisons(s, reports),
        } for s in noise],
    }
    if plots is not None:
        data["plots"] = {k: str(v) for k, v in plots.items()}
    return _safe(data)


def fmt(x: float | int | None) -> str:
    """A number for people: None as an em dash, integers as is, floats to ~3 significant
    digits (whole numbers up to 100 000 without an exponent)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    ax = abs(x)
    if ax >= 1e5 or (0 < ax < 1e-3):
        return f"{x:.3g}"
    if ax >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _link(path: str | Path, base: str | Path | None) -> str:
    p = Path(path)
    if base is not None:
        try:
            return Path(os.path.relpath(p, base)).as_posix()
        except ValueError:
            pass
    return p.as_posix()


def _exponent_sentence(r: WorkloadReport) -> str:
    if r.lr is None:
        return f"Best learning rate: {r.lr_note}."
    exp = r.lr["measured_exponent"]
    if exp is None:
        return f"Best learning rate: {r.lr_note}."
    return (f"Best learning rate goes as B^{exp:.2f} (least-squares slope of log lr against "
            f"log B; linear scaling is 1, square-root scaling 0.5): {lr_verdict(exp)}.")


def lr_verdict(exponent: float) -> str:
    """Which heuristic a measured learning-rate exponent is closer to, in words."""
    if exponent > 1.25:
        return "it grows faster than linear scaling"
    if exponent >= 0.75:
        return "closer to linear scaling"
    if exponent >= 0.25:
        return "closer to square-root scaling"
    if exponent >= 0:
        return "it grows more slowly than either heuristic"
    return ("it falls as the batch grows, unlike either heuristic (check the search space and "
            "the number of trials)")


def _workload_markdown(r: WorkloadReport) -> list[str]:
    lines = [f"### {r.optimizer}", "", f"Target: `{r.goal}`, {r.evaluation}.", ""]
    if r.fit is not None:
        f = r.fit
        lines += [
            "| S_min | B_crit | E_min = S_min·B_crit | R² (log space) | n |",
            "|---:|---:|---:|---:|---:|",
            f"| {fmt(f.s_min)} | {fmt(f.b_crit)} | {fmt(f.e_min)} | {f.r2:.3f} | {f.n} |",
            "",
        ]
        lines += [f"Fit note: {n}" for n in f.notes]
        if f.notes:
            lines.append("")
        lines += [f"Perfect scaling up to about B = {fmt(f.b_crit / 3)}, maximal data "
                  f"parallelism from about B = {fmt(3 * f.b_crit)}.", ""]
    else:
        lines += [f"**No fit:** {r.fit_note}.", ""]
    has_mom = any(p.momentum is not None for p in r.points)
    head = ["Batch size", "Steps to result", "Examples", "Regime", "Best lr"]
    head += ["Best momentum"] if has_mom else []
    head += ["Best trial", "Trials (diverged)"]
    lines += ["| " + " | ".join(head) + " |",
              "|" + "|".join("---:" if i < 3 else "---" for i in range(len(head))) + "|"]
    for p in r.points:
        if p.steps is None:
            regime = f"{NOT_REACHED}: {p.reason}" if p.reason else NOT_REACHED
        else:
            regime = p.regime or "— (no fit)"
        row = [str(p.batch_size), fmt(p.steps), fmt(p.examples), regime, fmt(p.learning_rate)]
        row += [fmt(p.momentum)] if has_mom else []
        row += [p.best_trial or "—", f"{p.trials} ({p.diverged})"]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines += ["", _exponent_sentence(r), ""]
    if r.warnings:
        lines += ["Warnings:", ""] + [f"- ⚠ {_cell(w)}" for w in r.warnings] + [""]
    return lines


def _comparison_markdown(c: dict[str, Any]) -> list[str]:
    lines = ["#### Optimizer comparison", ""]
    if not c["same_goal"]:
        lines += ["The optimizers chase different targets; compare with care.", ""]
    batches = c["batch_sizes"]
    head = ["Optimizer", "S_min", "B_crit", "E_min", "R²"] + [f"S at B={b}" for b in batches]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in c["rows"]:
        cells = [row["optimizer"], fmt(row["s_min"]), fmt(row["b_crit"]), fmt(row["e_min"]),
                 "—" if row["r2"] is None else f"{row['r2']:.3f}"]
        cells += ["not reached" if s is None else str(s) for s in row["steps"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if not batches:
        lines += ["No batch size was measured for every optimizer.", ""]
    fitted = [row for row in c["rows"] if row["s_min"] is not None]
    if len(fitted) >= 2:
        fastest = min(fitted, key=lambda row: row["s_min"])
        widest = max(fitted, key=lambda row: row["b_crit"])
        lines += [f"Fewest steps at large batch (S_min): **{fastest['optimizer']}**; largest "
                  f"critical batch size (B_crit): **{widest['optimizer']}**.", ""]
    return lines


def _noise_markdown(noise: Sequence[NoiseSeries], reports: Sequence[WorkloadReport],
                    plot: str | None) -> list[str]:
    lines = ["## Gradient noise scale", "",
             "B_simple = tr(Σ)/|G|² measured during training (McCandlish et al. 2018), "
             "averaged over the second half of each run's logged steps, against each "
             "workload's fitted B_crit. The theory predicts B_crit ≈ B_noise, which B_simple "
             "approximates when the loss is well conditioned, so expect a ratio of order 1.", ""]
    if plot:
        lines += [f"![B_simple over training]({plot})", ""]
    lines += ["| Run | Records | Steps averaged | B_simple (mean) | Workload | B_crit | "
              "B_simple / B_crit |", "|---|---:|---|---:|---|---:|---:|"]
    for s in noise:
        w = s.window
        span = f"{w[0]}–{w[1]} ({s.n_second_half})" if w else "—"
        rows = noise_comparisons(s, reports)
        if not rows:
            lines.append(f"| {_cell(s.name)} | {len(s.steps)} | {span} | "
                         f"{fmt(s.mean_second_half)} | (no fitted workload) | — | — |")
        for c in rows:
            lines.append(f"| {_cell(s.name)} | {len(s.steps)} | {span} | "
                         f"{fmt(c['b_simple_mean'])} | {_cell(c['workload'])} | "
                         f"{fmt(c['b_crit'])} | {fmt(c['ratio'])} |")
    lines.append("")
    return lines


def to_markdown(reports: Sequence[WorkloadReport], plots: Mapping[str, str | Path],
                noise: Sequence[NoiseSeries] = (), *, base: str | Path | None = None,
                source: str | Path | None = None) -> str:
    """The Markdown report; ``plots`` maps :func:`plot_key` keys to image paths (written
    relative to ``base``, the folder the report goes to)."""
    lines = ["# Scaling report: steps to result against batch size", ""]
    if source is not None:
        lines += [f"Studies from `{source}`.", ""]
    lines += [
        "Steps to result at a batch size B is the fewest steps in which any trial of the "
        "hyperparameter search reached the target (diverged trials excluded). The fit is "
        "S(B) = S_min·(1 + B_crit/B) (McCandlish et al. 2018) by least squares in log space; "
        "E_min = S_min·B_crit is the fewest examples, R² is measured in log space.", "",
        f"**Regimes.** {REGIME_RULE}", "",
        "**Learning rate.** The best trial's learning rate at each batch size, against the "
        "linear (lr ∝ B) and square-root (lr ∝ √B) heuristics anchored at the smallest batch "
        "size.", "",
        "## Summary", "",
        "| Workload | Target | Reached | S_min | B_crit | E_min | R² | Warnings |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reports:
        reached = sum(p.steps is not None for p in r.points)
        f = r.fit
        lines.append(
            f"| {_cell(r.name)} | `{_cell(r.goal)}` | {reached}/{len(r.points)} | "
            f"{fmt(f.s_min if f else None)} | {fmt(f.b_crit if f else None)} | "
            f"{fmt(f.e_min if f else None)} | {'—' if f is None else f'{f.r2:.3f}'} | "
            f"{len(r.warnings)} |")
    lines.append("")
    comparisons = {(c["dataset"], c["model"]): c for c in optimizer_comparisons(reports)}
    for (dataset, model), group in by_dataset_model(reports).items():
        lines += [f"## {dataset} / {model}", ""]
        for kind, alt in (("steps_vs_batch", "steps to result against batch size"),
                          ("best_lr", "best learning rate against batch size")):
            p = plots.get(plot_key(kind, dataset, model))
            if p is not None:
                lines += [f"![{alt}]({_link(p, base)})", ""]
        for r in group:
            lines += _workload_markdown(r)
        if (dataset, model) in comparisons:
            lines += _comparison_markdown(comparisons[(dataset, model)])
    if noise:
        p = plots.get(plot_key("noise"))
        lines += _noise_markdown(noise, reports, None if p is None else _link(p, base))
    all_warnings = [w for r in reports for w in r.warnings]
    lines += ["## Warnings", ""]
    lines += [f"- ⚠ {_cell(w)}" for w in all_warnings] if all_warnings else ["None."]
    lines.append("")
    return "\n".join(lines)


def summary_lines(reports: Sequence[WorkloadReport], noise: Sequence[NoiseSeries] = ()
                  ) -> list[str]:
    """A short plain-text summary for the terminal."""
    lines: list[str] = []
    for r in reports:
        lines.append(f"{r.name}  ({r.goal}, {r.evaluation})")
        if r.fit is not None:
            f = r.fit
            lines.append(f"  fit: S_min={fmt(f.s_min)}  B_crit={fmt(f.b_crit)}  "
                         f"E_min={fmt(f.e_min)}  R²={f.r2:.3f}  (n={f.n})")
            lines += [f"  note: {n}" for n in f.notes]
        else:
            lines.append(f"  no fit: {r.fit_note}")
        for p in r.points:
            if p.steps is None:
                what = (p.reason if p.trials == 0 else
                        f"not reached ({p.reason})" if p.reason else NOT_REACHED)
                lines.append(f"  B={p.batch_size:<7} {what}")
            else:
                lines.append(f"  B={p.batch_size:<7} S={p.steps:<8} {p.regime or ''}".rstrip())
        if r.lr is not None and r.lr["measured_exponent"] is not None:
            exp = r.lr["measured_exponent"]
            lines.append(f"  best lr ~ B^{exp:.2f} (linear 1, square root 0.5): "
                         f"{lr_verdict(exp)}")
        lines += [f"  warning: {w}" for w in r.warnings]
    for s in noise:
        lines.append(f"noise {s.name}: mean B_simple {fmt(s.mean_second_half)} over steps "
                     f"{s.window[0] if s.window else '—'}–{s.window[1] if s.window else '—'}")
        for c in noise_comparisons(s, reports):
            lines.append(f"  vs {c['workload']}: B_crit {fmt(c['b_crit'])}, ratio "
                         f"{fmt(c['ratio'])}")
    return lines
