"""The same digits job through torchrun alone, dyntrain's torchrun mode and its exact mode, on the
same capacity trace, side by side in one run.

The job: the digits CNN, 8 epochs, lr 0.05 (Nesterov, cosine), a global batch of 64 at 2
workers, ``--chunk-delay``/``--step-delay`` 0.025 s per 8 samples a worker trains (a heavier
model). (a) and (b) run ``bench/digits_ddp.py``, a plain DDP script (no dyntrain import,
``DistributedSampler``, 32 samples per worker, a ``torch.save`` checkpoint after every epoch);
(c) runs the built-in ``dyntrain.workloads.digits`` (``ElasticTrainer``, a fixed global batch of
64). The trace, at fixed training progress (epochs): start at 2 workers; at 2.5 capacity is
added (3), at 4.5 taken back (2), at 6.5 a worker is SIGKILLed. Each change fires once training
reached its progress and the change before it took effect. See ``bench/torchrun_compare_runs.py``
for how each mode is run and changed.

Per mode: wall time, each change's latency (the change -> the first step at the new size by a
new gang or generation) and the longest stop in training around it, samples trained and thrown
away (trained again), gang restarts, worker processes started, worker-seconds and their cost at
the SPOT environment's price, and the final model against a static run of the same mode at 2
workers (max abs parameter difference; bitwise or not) with its validation accuracy.

    .venv/bin/python bench/torchrun_compare.py      # about 5-8 minutes on 2 loaded cores

Writes ``bench/results/torchrun_compare.json`` (docs/benchmarks/torchrun-compare.md is
generated from it by ``bench/report.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import digits_ddp  # noqa: E402
from _common import machine_info, median  # noqa: E402
from dyntrain.cli.compare import state_distance  # noqa: E402
from dyntrain.workloads.digits import DigitsNet, accuracy, load_digits_split  # noqa: E402
from torchrun_compare_runs import (  # noqa: E402
    MAX_WORKERS,
    PRICE_PER_SLOT_HOUR,
    ServiceMode,
    Settings,
    TorchrunAlone,
    follow_trace,
    static_ddp,
    static_exact,
)

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "torchrun_compare.json"
TRACE = (("join", 2.5), ("leave", 4.5), ("kill", 6.5))
MODES = ("torchrun", "service-torchrun", "exact")
GLOBAL_BATCH = 64


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def copies_match() -> bool:
    """Whether digits_ddp.py's copies of the model and data equal dyntrain's digits workload."""
    train, _ = load_digits_split()
    ours = digits_ddp.load_train()
    torch.manual_seed(0)
    a = DigitsNet().state_dict()
    torch.manual_seed(0)
    b = digits_ddp.DigitsNet().state_dict()
    return (all(torch.equal(x, y) for x, y in zip(train.tensors, ours.tensors, strict=True))
            and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a))


def load_model(path: Path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["model"] if "model" in state else state


def model_report(path: Path, static: Path | None) -> dict:
    """The final model's validation accuracy and its distance from the static run's."""
    if not path.exists():
        return {"missing": str(path)}
    state = load_model(path)
    net = DigitsNet()
    net.load_state_dict(state)
    out = {"val_accuracy": round(accuracy(net, load_digits_split()[1]), 4)}
    if static is not None and static.exists():
        ref = load_model(static)
        out.update(state_distance(state, ref))
        out["bitwise_equal"] = all(torch.equal(state[k], ref[k]) for k in state)
    return out


# ---------------------------------------------------------------------------------------------


def measure_changes(run: dict, steps: list[dict], summary: dict) -> list[dict]:
    """Each change's latency, the longest stop in training around it, the restarts it caused
    and the samples trained again because of it."""
    steps = sorted(steps, key=lambda x: x["time"])
    redone = {e["generation"]: e.get("steps_redone", 0)
              for e in summary.get("exact_events", []) if e.get("event") != "start"}
    out = []
    for c in run["changes"]:
        t = c["time"]
        row = {"kind": c["kind"], "trigger": c["trigger"], "world_after": c["world_after"],
               "progress_at_change": round(c["progress_at_change"], 2)}
        first = next((x for x in steps if x["time"] > t and x["inc"] != c["inc"]
                      and x["world"] == c["world_after"]), None)
        if first is None:
            row.update(latency_s=None, note="no step at the new size before the job ended")
            out.append(row)
            continue
        end = first["time"]
        before = [x["time"] for x in steps if x["time"] <= t][-1:]
        times = before + [x["time"] for x in steps if t < x["time"] <= end]
        row.update(latency_s=round(end - t, 3),
                   pause_s=round(max(b - a for a, b in pairwise(times)), 3),
                   progress_at_new_world=round(first["progress"], 2),
                   restarts=sum(1 for r in summary["restarts"] if t < r <= end))
        if "rollbacks" in summary:
            row["samples_again"] = sum(r["samples"] for r in summary["rollbacks"]
                                       if t < r["time"] <= end)
        else:
            gens = {x["inc"] for x in steps if t < x["time"] <= end}
            row["samples_again"] = GLOBAL_BATCH * sum(redone.get(g, 0) for g in gens)
        out.append(row)
    return out


def run_mode(name: str, work: Path, s: Settings) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    mode = (TorchrunAlone(work, s) if name == "torchrun"
            else ServiceMode(work, s, "torchrun" if name == "service-torchrun" else None))
    say(f"{name}: start ({mode.label})")
    try:
        run = follow_trace(mode, s)
    except Exception as exc:  # noqa: BLE001 - recorded and shown, never faked
        say(f"{name}: failed: {exc!r}")
        return {"label": mode.label, "status": f"failed: {exc!r}", "changes": []}
    steps = mode.steps()
    summary = mode.summary()
    run["changes"] = measure_changes(run, steps, summary)
    if "rollbacks" in summary:
        summary["samples_again"] = sum(r["samples"] for r in summary["rollbacks"])
    else:
        summary["samples_again"] = GLOBAL_BATCH * sum(
            e.get("steps_redone", 0) for e in summary["exact_events"] if e.get("event") != "start")
    say(f"{name}: {run['status']} in {run['wall_s']:.1f} s; changes: "
        + ", ".join(f"{c['kind']} {c.get('latency_s')} s" for c in run["changes"]))
    return {"label": mode.label, **run, **summary}


# ---------------------------------------------------------------------------------------------


def _num(x, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _ratio(x, y) -> str:
    return "–" if x is None or y in (None, 0) else f"{x / y:.1f}x"


def table_rows(modes: dict, statics: dict) -> list[list[str]]:
    """Rows of (measure, torchrun alone, torchrun mode, exact mode, (a)/(c), (b)/(c))."""
    a, b, c = (modes.get(m, {}) for m in MODES)

    def change(m: dict, kind: str, key: str):
        return next((x.get(key) for x in m.get("changes", []) if x["kind"] == kind), None)

    def row(label: str, values: list, digits: int = 1, ratio: bool = True) -> list[str]:
        cells = [_num(v, digits) if not isinstance(v, str) else v for v in values]
        ratios = [_ratio(values[0], values[2]), _ratio(values[1], values[2])] if ratio \
            else ["", ""]
        return [label, *cells, *ratios]

    rows = [row("wall time, s", [m.get("wall_s") for m in (a, b, c)]),
            row("static run at 2 workers, wall s", [statics["ddp"]["wall_s"],
                                                    statics["ddp"]["wall_s"],
                                                    statics["exact"]["wall_s"]])]
    for kind, label in (("join", "2 -> 3 (capacity added)"), ("leave", "3 -> 2 (taken back)"),
                        ("kill", "a worker killed")):
        rows.append(row(f"{label}: latency, s", [change(m, kind, "latency_s")
                                                 for m in (a, b, c)], 2))
        rows.append(row(f"{label}: training stopped, s", [change(m, kind, "pause_s")
                                                         for m in (a, b, c)], 2))
    lat = [median([x.get("latency_s") for x in m.get("changes", [])]) for m in (a, b, c)]
    rows.append(row("median change latency, s", lat, 2))
    rows.append(row("samples trained again", [m.get("samples_again") for m in (a, b, c)], 0,
                    ratio=False))
    rows.append(row("gang restarts", [len(m["restarts"]) if "restarts" in m else None
                                      for m in (a, b, c)], 0, ratio=False))
    rows.append(row("worker processes started", [m.get("worker_processes") for m in (a, b, c)],
                    0, ratio=False))
    rows.append(row("worker-seconds", [m.get("worker_seconds") for m in (a, b, c)]))
    cost = [None if m.get("cost") is None else m["cost"] * 100 for m in (a, b, c)]
    rows.append(row(f"cost, cents (${PRICE_PER_SLOT_HOUR:.2f} per slot-hour)", cost, 3))
    models = [m.get("model", {}) for m in (a, b, c)]
    rows.append(row("final model: max abs diff from its static run",
                    [x.get("max_abs_diff") for x in models], 4, ratio=False))
    rows.append(row("final model bitwise equal to its static run",
                    [{True: "yes", False: "no"}.get(x.get("bitwise_equal"), "–")
                     for x in models], ratio=False))
    refs = [statics[k]["model"].get("val_accuracy") for k in ("ddp", "ddp", "exact")]
    rows.append(row("validation accuracy (its static run)",
                    [f"{x['val_accuracy']:.4f} ({_num(ref, 4)})" if "val_accuracy" in x else "–"
                     for x, ref in zip(models, refs, strict=True)], ratio=False))
    return rows


HEADERS = ["measure", "(a) torchrun alone", "(b) dyntrain torchrun mode",
           "(c) dyntrain exact mode", "(a)/(c)", "(b)/(c)"]
CHANGE_HEADERS = ["mode", "change", "trigger, epoch", "fired at, epoch", "new size from, epoch",
                  "latency, s", "training stopped, s", "gang restarts", "samples trained again"]


def change_rows(modes: dict) -> list[list[str]]:
    rows = []
    for name in MODES:
        for c in modes.get(name, {}).get("changes", []):
            rows.append([modes[name]["label"], f"{c['kind']} -> {c['world_after']}",
                         f"{c['trigger']:g}", _num(c["progress_at_change"], 2),
                         _num(c.get("progress_at_new_world"), 2), _num(c.get("latency_s"), 2),
                         _num(c.get("pause_s"), 2), _num(c.get("restarts"), 0),
                         _num(c.get("samples_again"), 0)])
    return rows


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--chunk-delay", type=float, default=0.025,
                    help="extra seconds per 8 samples a worker trains, in every mode")
    ap.add_argument("--only", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep every run's folder and logs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    only = [m for m in MODES if m in {x.strip() for x in args.only.split(",")}]
    s = Settings(epochs=args.epochs, chunk_delay=args.chunk_delay, trace=TRACE)

    def on_sigterm(signum, frame):  # let the finally blocks stop every process we started
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    if not copies_match():
        print("torchrun_compare: bench/digits_ddp.py's model or data differ from "
              "dyntrain.workloads.digits", file=sys.stderr)
        return 1
    work = args.workdir or Path(tempfile.mkdtemp(prefix="torchrun_compare_"))
    load_before = os.getloadavg()
    t0 = time.time()
    modes, statics = {}, {}
    try:
        say("static plain DDP run at 2 workers")
        statics["ddp"] = static_ddp(work / "static-ddp", s)
        say("static exact run at 2 workers")
        statics["exact"] = static_exact(work / "static-exact", s)
        for name in only:
            modes[name] = run_mode(name, work / name, s)
        for st in statics.values():
            st["model"] = model_report(st["final_model"], None)
        for name, m in modes.items():
            if "final_model" in m:
                ref = statics["exact" if name == "exact" else "ddp"]["final_model"]
                m["model"] = model_report(m["final_model"], ref)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    rows, crows = table_rows(modes, statics), change_rows(modes)
    table = text_table(HEADERS, rows) + "\n\n" + text_table(CHANGE_HEADERS, crows)
    print(table)
    for m in [*modes.values(), *statics.values()]:
        m.pop("t0", None)
        if "final_model" in m:
            m["final_model"] = Path(m["final_model"]).name
    result = {
        "benchmark": "torchrun_compare",
        "command": " ".join([".venv/bin/python", "bench/torchrun_compare.py", *(argv or
                                                                               sys.argv[1:])]),
        "machine": {**machine_info(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "settings": {"epochs": s.epochs, "chunk_delay_s": s.chunk_delay,
                     "trace": [list(x) for x in s.trace], "start_world": s.start_world,
                     "max_workers": MAX_WORKERS, "price_per_slot_hour": PRICE_PER_SLOT_HOUR,
                     "global_batch_exact": GLOBAL_BATCH, "batch_per_worker_ddp": 32},
        "wall_s": round(time.time() - t0, 1),
        "headers": HEADERS, "rows": rows, "change_headers": CHANGE_HEADERS,
        "change_rows": crows, "table": table, "modes": modes, "static": statics,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2, default=str)  # the run folders' paths, shortened
    text = text.replace(str(work), "WORK").replace(f"{BENCH.parent}/", "")
    args.out.write_text(text + "\n")
    print(f"\nwrote {args.out} ({result['wall_s']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
