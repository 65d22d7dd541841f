"""PNG figures for the scaling report (matplotlib, Agg, imported only when drawing).

:func:`render` writes, for each (dataset, model):

- ``steps_vs_batch_<dataset>_<model>.png``: steps to result against batch size on log-log
  axes, one colour per optimizer: measured points (marker by regime), the fitted
  ``S_min·(1 + B_crit/B)``, the perfect-scaling line (slope −1, ``E_min/B``; through the
  smallest batch size's point when there is no fit), the ``S_min`` asymptote, ``B_crit``, the
  regimes shaded when one optimizer is shown, and batch sizes that never reached the target as
  ``x`` marks along the top;
- ``best_lr_<dataset>_<model>.png``: the best trial's learning rate against batch size with
  the linear and square-root heuristics (only when some learning rate was found);

and ``noise.png`` (``B_simple`` over training with each fitted ``B_crit``) when noise series
are given. Names are deterministic; characters outside ``[A-Za-z0-9._-]`` become ``-``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dyntrain.lab.analysis import WorkloadReport, by_dataset_model
from dyntrain.lab.fit import DIMINISHING, MAXIMAL, PERFECT
from dyntrain.lab.noise import NoiseSeries
from dyntrain.lab.render import fmt, plot_key

__all__ = ["plot_best_lr", "plot_noise", "plot_steps_vs_batch", "render"]

_REGIME_MARKERS = {PERFECT: "o", DIMINISHING: "s", MAXIMAL: "^", None: "D"}
_REGIME_LABELS = {PERFECT: PERFECT, DIMINISHING: DIMINISHING, MAXIMAL: MAXIMAL,
                  None: "reached (no fit)"}
_DPI = 110


def _figure(width: float = 7.5, height: float = 5.0) -> Any:
    from matplotlib.figure import Figure  # lazy: matplotlib is slow to import

    fig = Figure(figsize=(width, height), dpi=_DPI)
    return fig, fig.add_subplot(1, 1, 1)


def _colours(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def _slug(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9._-]+", "-", p).strip("-") or "x" for p in parts)


def _batch_range(reports: Sequence[WorkloadReport]) -> tuple[float, float]:
    bs = [p.batch_size for r in reports for p in r.points]
    return min(bs) / 1.6, max(bs) * 1.6


def _log_ticks(ax: Any, xs: Sequence[float] = ()) -> None:
    """Plain-number tick labels on log axes; x ticks at the measured batch sizes."""
    from matplotlib.ticker import FixedLocator, Formatter, FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    xs = sorted(set(xs))
    if 0 < len(xs) <= 14:
        ax.xaxis.set_major_locator(FixedLocator(xs))
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(plain)

    class MinorLabels(Formatter):
        """Label some minor ticks (m x 10^k) when the axis spans at most two decades."""

        def __call__(self, v: float, pos: Any = None) -> str:
            lo, hi = self.axis.get_view_interval()
            if not (v > 0 and lo > 0 and hi > lo):
                return ""
            decades = math.log10(hi / lo)
            mantissa = v / 10 ** math.floor(math.log10(v) + 1e-9)
            keep = (2, 3, 5) if decades > 1 else (2, 3, 4, 5, 6, 8)
            near = round(mantissa)
            if decades > 2 or near not in keep or abs(mantissa - near) > 1e-6:
                return ""
            return f"{v:g}"

    ax.yaxis.set_minor_formatter(MinorLabels())


def plot_steps_vs_batch(reports: Sequence[WorkloadReport], path: Path) -> Path:
    """Steps to result against batch size for the optimizers of one (dataset, model)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.transforms import blended_transform_factory

    fig, ax = _figure()
    ax.set_xscale("log")
    ax.set_yscale("log")
    lo, hi = _batch_range(reports)
    grid = np.geomspace(lo, hi, 200)
    top = blended_transform_factory(ax.transData, ax.transAxes)
    regimes_seen: set[Any] = set()
    shaded = unreached_seen = False
    ys: list[float] = []
    any_reached = False
    for r, colour in zip(reports, _colours(len(reports)), strict=True):
        reached = [p for p in r.points if p.steps is not None]
        any_reached |= bool(reached)
        ys += [float(p.steps) for p in reached if p.steps is not None]
        for regime, marker in _REGIME_MARKERS.items():
            pts = [p for p in reached if p.regime == regime]
            if pts:
                regimes_seen.add(regime)
                ax.scatter([p.batch_size for p in pts], [p.steps for p in pts], s=42,
                           marker=marker, color=colour, zorder=3, edgecolors="black",
                           linewidths=0.5)
        if r.fit is not None:
            f = r.fit
            ys.append(f.s_min)
            ax.plot(grid, f.predict(grid), color=colour, lw=1.8,
                    label=f"{r.optimizer}: fit S_min={fmt(f.s_min)}, B_crit={fmt(f.b_crit)} "
                          f"(R²={f.r2:.2f})")
            ax.plot(grid, f.e_min / grid, color=colour, lw=1, ls="--", alpha=0.8,
                    label=f"{r.optimizer}: perfect scaling E_min/B")
            ax.axhline(f.s_min, color=colour, lw=1, ls=":", alpha=0.8,
                       label=f"{r.optimizer}: S_min asymptote")
            if lo < f.b_crit < hi:
                ax.axvline(f.b_crit, color=colour, lw=0.8, ls="-.", alpha=0.6)
            if len(reports) == 1:
                shaded = True
                ax.axvspan(lo, min(max(f.b_crit / 3, lo), hi), color="tab:green", alpha=0.08,
                           lw=0)
                ax.axvspan(max(min(3 * f.b_crit, hi), lo), hi, color="tab:red", alpha=0.08,
                           lw=0)
        elif reached:
            b0, s0 = reached[0].batch_size, reached[0].steps
            ax.plot(grid, s0 * b0 / grid, color=colour, lw=1, ls="--", alpha=0.8,
                    label=f"{r.optimizer}: perfect scaling (slope −1, no fit)")
            ax.plot([p.batch_size for p in reached], [p.steps for p in reached],
                    color=colour, lw=1, alpha=0.6, label=f"{r.optimizer}: measured")
        missed = [p.batch_size for p in r.points if p.steps is None]
        if missed:
            unreached_seen = True
            ax.plot(missed, [0.97] * len(missed), ls="none", marker="x", ms=9, mew=2,
                    color=colour, transform=top, clip_on=False, zorder=4)
    if ys:
        ax.set_ylim(min(ys) / 1.8, max(ys) * 1.6)
    else:
        ax.set_ylim(1, 10)
        ax.text(0.5, 0.5, "no batch size reached the target", transform=ax.transAxes,
                ha="center", va="center", color="0.4")
    ax.set_xlim(lo, hi)
    handles, labels = ax.get_legend_handles_labels()
    for regime in _REGIME_MARKERS:
        if regime in regimes_seen:
            handles.append(Line2D([], [], ls="none", marker=_REGIME_MARKERS[regime],
                                  color="0.5", markeredgecolor="black"))
            labels.append(_REGIME_LABELS[regime])
    if unreached_seen:
        handles.append(Line2D([], [], ls="none", marker="x", color="0.3", mew=2))
        labels.append("target not reached (top)")
    if shaded:
        handles += [Patch(color="tab:green", alpha=0.15), Patch(color="tab:red", alpha=0.15)]
        labels += ["B ≤ B_crit/3 (perfect scaling)", "B ≥ 3·B_crit (maximal parallelism)"]
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="best", framealpha=0.85)
    _log_ticks(ax, [p.batch_size for r in reports for p in r.points])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("steps to result S")
    goals = sorted({r.goal for r in reports})
    ax.set_title(f"{reports[0].dataset} / {reports[0].model}: steps to "
                 f"{goals[0] if len(goals) == 1 else 'target'}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    return _save(fig, path)


def plot_best_lr(reports: Sequence[WorkloadReport], path: Path) -> Path | None:
    """Best learning rate against batch size with the linear and square-root heuristics;
    None (nothing written) when no optimizer has a best learning rate."""
    with_lr = [r for r in reports if r.lr is not None]
    if not with_lr:
        return None
    fig, ax = _figure()
    ax.set_xscale("log")
    ax.set_yscale("log")
    for r, colour in zip(reports, _colours(len(reports)), strict=True):
        h = r.lr
        if h is None:
            continue
        bs = np.asarray(h["batch_sizes"], dtype=float)
        known = [(b, lr) for b, lr in zip(h["batch_sizes"], h["measured"], strict=True)
                 if lr is not None]
        exp = h["measured_exponent"]
        ax.scatter([b for b, _ in known], [lr for _, lr in known], color=colour, s=42,
                   zorder=3, edgecolors="black", linewidths=0.5,
                   label=f"{r.optimizer}: best lr" + ("" if exp is None else
                                                     f" (slope {exp:.2f})"))
        grid = np.geomspace(bs.min(), bs.max(), 100) if bs.size else bs
        b0, lr0 = h["anchor_batch_size"], h["anchor_lr"]
        ax.plot(grid, lr0 * grid / b0, color=colour, ls="--", lw=1,
                label=f"{r.optimizer}: linear (lr ∝ B)")
        ax.plot(grid, lr0 * np.sqrt(grid / b0), color=colour, ls=":", lw=1.2,
                label=f"{r.optimizer}: square root (lr ∝ √B)")
    _log_ticks(ax, [p.batch_size for r in reports for p in r.points])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("best learning rate")
    ax.set_title(f"{reports[0].dataset} / {reports[0].model}: best learning rate", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="best", framealpha=0.85)
    return _save(fig, path)


def plot_noise(noise: Sequence[NoiseSeries], reports: Sequence[WorkloadReport],
               path: Path) -> Path:
    """``B_simple`` over training steps (mean over the second half marked) with each fitted
    workload's ``B_crit`` as a horizontal line."""
    fig, ax = _figure()
    colours = _colours(len(noise) + len(reports))
    positive = True
    for s, colour in zip(noise, colours, strict=False):
        pts = [(st, v) for st, v in zip(s.steps, s.values, strict=True) if v is not None]
        positive &= all(v > 0 for _, v in pts)
        ax.plot([st for st, _ in pts], [v for _, v in pts], color=colour, lw=1.2,
                label=f"B_simple: {s.name}")
        mean, w = s.mean_second_half, s.window
        if mean is not None and w is not None:
            positive &= mean > 0
            ax.plot(list(w), [mean, mean], color=colour, lw=2.5, alpha=0.6,
                    label=f"{s.name}: mean over steps {w[0]}–{w[1]} = {mean:.3g}")
    for r, colour in zip([r for r in reports if r.fit is not None], colours[len(noise):],
                         strict=False):
        assert r.fit is not None
        ax.axhline(r.fit.b_crit, color=colour, ls="--", lw=1.2,
                   label=f"B_crit {r.name} = {r.fit.b_crit:.3g}")
        positive &= r.fit.b_crit > 0
    if positive:
        ax.set_yscale("log")
        _log_ticks(ax)
    ax.set_xlabel("step")
    ax.set_ylabel("batch size")
    ax.set_title("gradient noise scale B_simple over training vs fitted B_crit", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="best", framealpha=0.85)
    return _save(fig, path)


def render(reports: Sequence[WorkloadReport], out_dir: str | Path,
           noise: Sequence[NoiseSeries] = ()) -> dict[str, Path]:
    """Write every figure into ``out_dir``; returns ``{plot_key(...): path}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    used: set[str] = set()
    for (dataset, model), group in by_dataset_model(reports).items():
        stem = _slug(dataset, model)
        while stem in used:
            stem += "_"
        used.add(stem)
        paths[plot_key("steps_vs_batch", dataset, model)] = plot_steps_vs_batch(
            group, out / f"steps_vs_batch_{stem}.png")
        lr_path = plot_best_lr(group, out / f"best_lr_{stem}.png")
        if lr_path is not None:
            paths[plot_key("best_lr", dataset, model)] = lr_path
    if noise:
        paths[plot_key("noise")] = plot_noise(noise, reports, out / "noise.png")
    return paths
