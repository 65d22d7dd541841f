"""What ``dyntrain lab throughput`` writes: throughput.json, a Markdown table and a figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dyntrain.lab.machine import oversubscribed
from dyntrain.lab.scaling import MODES
from dyntrain.outdir import make_out_dir


def markdown_table(doc: dict[str, Any]) -> str:
    hw, cfg = doc["hardware"], doc["config"]
    threads = cfg.get("threads_per_worker", 1)
    lines = [
        "# Scaling efficiency (`dyntrain lab throughput`)", "",
        f"Hardware: {hw['summary']}.  ",
        f"Workload: `{' '.join(doc['workload'])}` (G: the run's global batch), "
        f"{threads} thread(s) per worker.  ",
        f"Measured: {doc['measure']}.  ",
        "Weak scaling: per-worker batch fixed at "
        f"{cfg['per_worker_batch']}; strong scaling: global batch fixed at {cfg['global_batch']}. "
        "Efficiency = speed-up / (workers / baseline workers)."
        + (f" Each row: the median of {cfg['repeats']} runs." if cfg.get("repeats", 1) > 1
           else ""),
        "",
        "| mode | workers | global batch | per-worker batch | chunks/worker | samples/s "
        "| ideal samples/s | step ms (median) | speed-up | efficiency | other load (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    over = False
    for r in doc["rows"]:
        mark = ""
        if oversubscribed(r["workers"], hw, threads):
            mark, over = "*", True
        lines.append(
            f"| {r['mode']} | {r['workers']}{mark} | {r['global_batch']} | "
            f"{_num(r['per_worker_batch'])} | {_num(r['chunks_per_worker'])} | "
            f"{r['samples_per_s']:.1f} | {r['ideal_samples_per_s']:.1f} | "
            f"{r['step_ms_median']:.2f} | {r['speedup']:.2f} | {r['efficiency']:.1%} | "
            f"{'n/a' if r['other_load_cores'] is None else format(r['other_load_cores'], '.2f')} "
            "|")
    lines += ["", "Other load: CPU that processes other than this experiment used during the "
              "run, in cores (the machine is shared when it is well above 0)."]
    if over:
        unit = (f"{hw['gpu_count']} GPU(s)" if hw.get("gpu_count")
                else f"{hw['cpu_cores']} CPU cores")
        lines += ["", f"\\* more workers than this machine has {unit}: the workers share them, "
                  "so these rows measure contention for the hardware as much as the cost of "
                  "data parallelism."]
    return "\n".join(lines) + "\n"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def plot(doc: dict[str, Any], path: Path) -> None:
    """samples/s vs workers (with ideal linear scaling) and efficiency vs workers."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    ax_rate, ax_eff = fig.subplots(1, 2)
    colors = {"weak": "tab:blue", "strong": "tab:orange"}
    counts = sorted({r["workers"] for r in doc["rows"]})
    for mode in [m for m in MODES if any(r["mode"] == m for r in doc["rows"])]:
        rows = [r for r in doc["rows"] if r["mode"] == mode]
        x = [r["workers"] for r in rows]
        color = colors.get(mode)
        ax_rate.plot(x, [r["samples_per_s"] for r in rows], "o-", color=color,
                     label=f"{mode} (measured)")
        ax_rate.plot(x, [r["ideal_samples_per_s"] for r in rows], "--", color=color, alpha=0.6,
                     label=f"{mode} (ideal, linear)")
        ax_eff.plot(x, [100 * r["efficiency"] for r in rows], "o-", color=color, label=mode)
    ax_eff.axhline(100, color="grey", linestyle="--", linewidth=1, label="ideal")
    cores = doc["hardware"].get("gpu_count") or doc["hardware"].get("cpu_cores")
    if cores and counts and counts[-1] > cores:
        for ax in (ax_rate, ax_eff):
            ax.axvline(cores, color="grey", linestyle=":", linewidth=1)
        unit = "GPUs" if doc["hardware"].get("gpu_count") else "cores"
        ax_eff.text(cores, 5, f" {cores} {unit}", color="grey", fontsize=8)
    for ax in (ax_rate, ax_eff):
        ax.set_xlabel("workers")
        ax.set_xticks(counts)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_rate.set_ylabel("samples/s")
    ax_rate.set_title("throughput")
    ax_eff.set_ylabel("scaling efficiency (%)")
    ax_eff.set_ylim(0, 110)
    ax_eff.set_title("efficiency = speed-up / workers")
    fig.suptitle(doc["hardware"]["summary"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_outputs(doc: dict[str, Any], out: Path) -> dict[str, Path]:
    """throughput.json, throughput.md and throughput.png under ``out``."""
    make_out_dir(out, "--out")
    paths = {"json": out / "throughput.json", "md": out / "throughput.md",
             "png": out / "throughput.png"}
    paths["json"].write_text(json.dumps(doc, indent=2) + "\n")
    paths["md"].write_text(markdown_table(doc))
    plot(doc, paths["png"])
    return paths
