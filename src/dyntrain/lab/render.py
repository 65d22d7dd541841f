"""The scaling report written out: JSON (:func:`to_json`), Markdown (:func:`to_markdown`) and
a short summary for the terminal (:func:`summary_lines`), from the analysis
(:mod:`dyntrain.lab.analysis`) and the noise series (:mod:`dyntrain.lab.noise`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dyntrain.lab.analysis import (
    LR_KEYS,
    REGIME_RULE,
    WorkloadReport,
    by_dataset_model,
    optimizer_comparisons,
)
from dyntrain.lab.fit import DIMINISHING, MAXIMAL, NOT_REACHED, PERFECT, Fit
from dyntrain.lab.noise import NoiseSeries, noise_comparisons


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
