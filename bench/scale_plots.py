"""The plots of the scale report, log-log, from ``bench/results/scale.json`` and
``bench/results/control_plane.json``: ``docs/benchmarks/scale-real.png`` and
``docs/benchmarks/scale-simulated.png``.

    .venv/bin/python bench/scale_plots.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "benchmarks"


def _first(changes: list[dict], kind: str) -> float | None:
    return next((c["latency_s"] for c in changes if c["event"] == kind), None)


def _plot(ax, xs, ys, label: str) -> None:
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and y > 0]
    if pts:
        ax.plot(*zip(*pts, strict=True), marker="o", label=label)


def _save(fig, axes, name: str) -> Path:
    """Legends and grids on ``axes``, then ``docs/benchmarks/NAME``."""
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = OUT / name
    fig.savefig(path, dpi=90)
    return path


def real() -> Path:
    data = json.loads((RESULTS / "scale.json").read_text())
    rows = data["sizes"]
    n = [r["n"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _plot(left, n, [r["step_s"] for r in rows], "step")
    _plot(left, n, [r["plain_allreduce_s"] for r in rows], "plain gloo all-reduce, same bytes")
    for kind in ("join", "leave", "crash"):
        _plot(left, n, [_first(r["changes"], kind) for r in rows], f"{kind} -> first step")
    left.set(xscale="log", yscale="log", xlabel="workers N", ylabel="seconds",
             title="Time per step and per change")
    _plot(right, n, [r["worker_pss_mib"] for r in rows], "worker PSS (MiB)")
    _plot(right, n, [r["launcher_cpu_per_wall_s"] for r in rows], "launcher CPU-s per s")
    right.set(xscale="log", yscale="log", xlabel="workers N", title="Memory and the launcher")
    return _save(fig, (left, right), "scale-real.png")


def simulated() -> Path:
    data = json.loads((RESULTS / "control_plane.json").read_text())
    rows = data["sizes"]
    n = [r["n"] for r in rows]
    timeout = rows[0]["failure_timeout_s"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    _plot(ax, n, [r["wave_join_s"] for r in rows], "wave of joins -> published (s)")
    _plot(ax, n, [r["steady"]["cpu_per_tick_ms"] / 1000 for r in rows], "CPU per tick (s)")
    _plot(ax, n, [r["one_silent"]["published_s"] - timeout for r in rows],
          "one silent: published after the timeout (s)")
    _plot(ax, n, [r["half_silent"]["published_s"] - timeout for r in rows],
          "half silent: published after the timeout (s)")
    ax.set(xscale="log", yscale="log", xlabel="simulated members N", ylabel="seconds",
           title="The coordinator with N members")
    return _save(fig, (ax,), "scale-simulated.png")


if __name__ == "__main__":
    for made in (real(), simulated()):
        print(f"wrote {made.relative_to(ROOT)}")
