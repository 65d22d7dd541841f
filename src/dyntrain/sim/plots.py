"""PNG figures of simulations (matplotlib, Agg, imported only when drawing).

``render(results, out_dir)`` writes, for each policy whose timeline was recorded
(``SimConfig.record``), ``sim_<policy>.png``: three panels sharing the time axis (hours) —
the capacity (slots of each environment, stacked) with the slots held by workers, the
allocation (workers of each job, stacked), and the jobs (a line from arrival to start, a bar
from start to end) — and, for several policies, ``sim_compare.png``: average JCT and cost
side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dyntrain.sim.results import SimResult

_DPI = 110


def _colours(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


def _steps(timeline, t_end: float, series: list[list[float]]):
    """Step-function coordinates: each value holds from its row's time to the next row's
    (one stackplot call draws them all, far faster than a ``stairs`` per series)."""
    edges = np.array([row[0] for row in timeline] + [t_end]) / 3600.0
    x = np.repeat(edges, 2)[1:-1]
    return x, [np.repeat(np.asarray(v, dtype=float), 2) for v in series]


def plot_policy(result: SimResult, path: Path) -> Path:
    """The three panels of one policy's simulation."""
    from matplotlib.figure import Figure

    timeline = result.timeline
    fig = Figure(figsize=(10, 8.5), dpi=_DPI)
    cap, alloc, gantt = fig.subplots(3, 1, sharex=True,
                                     gridspec_kw={"height_ratios": [1, 1.4, 1.6]})
    envs = sorted({e for _, slots, _ in timeline for e in slots})
    x, slots = _steps(timeline, result.sim_s,
                      [[row.get(e, 0) for _, row, _ in timeline] for e in envs])
    cap.stackplot(x, slots, colors=_colours(len(envs)), alpha=0.35,
                  labels=[f"{e} slots" for e in envs])
    _, (held,) = _steps(timeline, result.sim_s,
                        [[sum(jobs.values()) for _, _, jobs in timeline]])
    cap.plot(x, held, color="black", linewidth=0.8, label="held by workers")
    cap.set_ylabel("slots")
    cap.legend(loc="upper right", fontsize=7)
    cap.set_title(f"{result.policy}: capacity, allocation and jobs")

    ids = [j.id for j in result.jobs]
    colours = dict(zip(ids, _colours(len(ids)), strict=True))
    shown = [j for j in ids if any(jobs.get(j) for _, _, jobs in timeline)]
    _, workers = _steps(timeline, result.sim_s,
                        [[jobs.get(j, 0) for _, _, jobs in timeline] for j in shown])
    if shown:
        alloc.stackplot(x, workers, colors=[colours[j] for j in shown])
    alloc.set_ylabel("workers per job")

    for row, job in enumerate(result.jobs):
        end = job.finished_s if job.finished_s is not None else result.sim_s
        start = job.started_s if job.started_s is not None else end
        gantt.plot([job.arrival_s / 3600, start / 3600], [row, row], color="0.6", linewidth=1)
        gantt.barh(row, (end - start) / 3600, left=start / 3600, height=0.7,
                   color=colours[job.id])
    gantt.set_ylabel("job (waiting: line)")
    gantt.set_xlabel("hours")
    gantt.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def plot_comparison(summaries: list[dict], path: Path) -> Path:
    """Average JCT and cost of each policy, as two bar charts."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.5), dpi=_DPI)
    jct, cost = fig.subplots(1, 2)
    names = [s["policy"] for s in summaries]
    colours = _colours(len(names))
    jct.bar(names, [s["avg_jct_s"] / 3600 for s in summaries], color=colours)
    jct.set_ylabel("average JCT (hours)")
    cost.bar(names, [s["cost"] for s in summaries], color=colours)
    cost.set_ylabel("cost")
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def render(results: list[SimResult], out_dir: Path) -> list[Path]:
    """Every figure of the module doc; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [plot_policy(r, out_dir / f"sim_{r.policy}.png") for r in results if r.timeline]
    if len(results) > 1:
        written.append(plot_comparison([r.summary() for r in results],
                                       out_dir / "sim_compare.png"))
    return written
