"""The same digits job through torchrun alone, dyntrain's torchrun mode and its exact mode, on the
same capacity trace, side by side in one run.

The job: the digits CNN, 10 epochs, lr 0.05 (Nesterov, cosine), a global batch of 64 at 2
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
NOTES = [
    "latency: from the change (the new agent started, the SIGTERM or SIGKILL sent, "
    "desired_slots written) to the first step completed at the new size by a new gang (torchrun "
    "modes) or a new generation (exact mode). training stopped: the longest time without a "
    "completed step, from the last step before the change to that first step.",
    "The trace fires at fixed training progress in epochs ('trigger'), each change once the one "
    "before it took effect. A restarted torchrun gang resumes at the start of its epoch, so its "
    "progress goes back ('new size from'); in (a) the running gang keeps training while a new "
    "agent starts, so a join can take effect epochs after it fired.",
    "(a) torchrun alone: bench/rescale_torchrun.py's 'tuned' configuration (--monitor-interval "
    "0.05, last_call_timeout=1, keep-alive 1 s x 3, --max-restarts 1000, "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1); with torchrun's defaults a change took 38-53 s in "
    "the rescale-latency benchmark. Capacity added: one more agent; taken back: SIGTERM to the "
    "newest agent; kill: SIGKILL to the second agent's worker.",
    "(b) and (c): a service in this process (SQLite store, LocalExecutor with one warm worker as "
    "dyntrain server's default, Controller with schedule_every 0.05 s and a 10 s grace period), "
    "a fresh one per mode; one SPOT environment at $0.30 per slot-hour whose desired_slots the "
    "trace sets (2 -> 3 -> 2); --workers 1:4; kill: SIGKILL to the job's newest worker. The "
    "torchrun mode's first gang starts new Pythons (its start starts the executor's zygote); "
    "each later gang's workers are processes the zygote forks with torch imported, which run "
    "the script with torchrun's variables ('warm gang starts').",
    "restart phases (torchrun mode): stop = the change -> the old gang's last worker exit as "
    "the service recorded it; start = -> the last new worker running the script (its first "
    "line); set-up = -> every rank past the script's first barrier (its imports, "
    "init_process_group, data, model, checkpoint loaded, DDP built); first step = -> the new "
    "gang's first step. They add up to the change's latency.",
    "global batch: the torchrun modes train 32 samples per worker (the script's own batch "
    "semantics, as most DDP scripts are written): 64 at 2 workers, 96 at 3, with the same "
    "learning rate; 23 steps per epoch at 2 workers, 15 at 3. The exact mode trains a global "
    "batch of 64 at every size (22 steps per epoch).",
    "samples trained again: torchrun modes: the steps of the epoch in progress when a gang "
    "stopped (the script checkpoints after every epoch), which the next gang trains again; the "
    "step in flight at each stop is not counted. Exact mode: steps_redone of the membership "
    "events x 64 (a graceful change redoes none; a crash's interrupted step is not counted).",
    "cost: worker-seconds x $0.30 per slot-hour. (b), (c): the service's usage records (each "
    "worker's lifetime). (a): each agent's lifetime, as a node is paid for while its agent waits "
    "in a rendezvous. The static runs: wall time x 2 workers.",
    "wall time: (a) from starting the first agent to the last agent's exit; (b), (c) from the "
    "submit to the job's end as the driving loop saw it; static runs: the command's wall time.",
    "final model: the torchrun modes against the same script under torchrun at a fixed 2 "
    "workers; the exact mode against `dyntrain run --workers 2:2`. Parameters and buffers "
    "(BatchNorm statistics) are compared; accuracy on the 360 validation digits.",
]


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
    """Each change's latency (to the first step at the new size by a new gang or generation),
    the longest stop in training around it, the restarts it caused and the samples trained
    again because of it. Where the new size was never reached, the same up to the first step
    by a new gang or generation at any size (``trained_on_at``)."""
    steps = sorted(steps, key=lambda x: x["time"])
    redone = {e["generation"]: e.get("steps_redone", 0)
              for e in summary.get("exact_events", []) if e.get("event") != "start"}
    out = []
    for c in run["changes"]:
        t = c["time"]
        row = {"kind": c["kind"], "trigger": c["trigger"], "world_after": c["world_after"],
               "progress_at_change": round(c["progress_at_change"], 2)}
        later = [x for x in steps if x["time"] > t and x["inc"] != c["inc"]]
        first = next((x for x in later if x["world"] == c["world_after"]), None)
        if first is None:
            row.update(latency_s=None, note="no step at the new size before the job ended")
            if not later:
                out.append(row)
                continue
            first = later[0]
            row["trained_on_at"] = first["world"]
        else:
            row.update(latency_s=round(first["time"] - t, 3),
                       progress_at_new_world=round(first["progress"], 2))
        end = first["time"]
        row.update(time_changed=t, time_first_step=end)
        before = [x["time"] for x in steps if x["time"] <= t][-1:]
        times = before + [x["time"] for x in steps if t < x["time"] <= end]
        row.update(pause_s=round(max(b - a for a, b in pairwise(times)), 3),
                   restarts=sum(1 for r in summary["restarts"] if t < r <= end))
        if row["restarts"]:
            row["phases"] = restart_phases(t, first, summary)
        if "rollbacks" in summary:
            row["samples_again"] = sum(r["samples"] for r in summary["rollbacks"]
                                       if t < r["time"] <= end)
        else:
            gens = {x["inc"] for x in steps if t < x["time"] <= end}
            row["samples_again"] = GLOBAL_BATCH * sum(redone.get(g, 0) for g in gens)
        out.append(row)
    return out


def restart_phases(t: float, first: dict, summary: dict) -> dict:
    """Where a gang restart's time went, from the change at ``t`` to the new gang's first step
    ``first``: stopping the old gang (to its last worker's exit, where the mode knows it),
    starting the new processes (to the last one running the script), the script's set-up (its
    imports, ``init_process_group``, data, model and checkpoint, to every rank past its
    barrier) and its first step."""
    gang = [r for r in summary.get("gang_starts", []) if t < r["time"] <= first["time"]]
    if not gang:
        return {}
    up = max(r["proc_t0"] for r in gang)
    ready = max(r["time"] for r in gang)
    stops = [x for x in summary.get("worker_stops", []) if t < x <= up]
    stopped = max(stops) if stops else None
    return {"stop_s": None if stopped is None else round(stopped - t, 3),
            "start_s": None if stopped is None else round(up - stopped, 3),
            "until_started_s": round(up - t, 3),
            "setup_s": round(ready - up, 3), "first_step_s": round(first["time"] - ready, 3)}


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
    run["epochs"] = s.epochs
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
    numbers = all(isinstance(v, (int, float)) for v in (x, y))
    return f"{x / y:.1f}x" if numbers and y else "–"


def table_rows(modes: dict, statics: dict) -> list[list[str]]:
    """Rows of (measure, torchrun alone, torchrun mode, exact mode, (a)/(c), (b)/(c))."""
    a, b, c = (modes.get(m, {}) for m in MODES)

    def change(m: dict, kind: str, key: str):
        c = next((x for x in m.get("changes", []) if x["kind"] == kind), {})
        if key == "latency_s" and c.get("trained_on_at") is not None:
            return f"not reached: trained on at {c['trained_on_at']}"
        return c.get(key)

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
    rows.append(row("median latency of the changes that reached their size, s", lat, 2))
    rows.append(row("trained every epoch to its end (samples lost)",
                    [_complete(m) for m in (a, b, c)], ratio=False))
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
                    [f"{x['max_abs_diff']:.3g}" if "max_abs_diff" in x else "–"
                     for x in models], ratio=False))
    rows.append(row("final model bitwise equal to its static run",
                    [{True: "yes", False: "no"}.get(x.get("bitwise_equal"), "–")
                     for x in models], ratio=False))
    refs = [statics[k]["model"].get("val_accuracy") for k in ("ddp", "ddp", "exact")]
    rows.append(row("validation accuracy (its static run)",
                    [f"{x['val_accuracy']:.4f} ({_num(ref, 4)})" if "val_accuracy" in x else "–"
                     for x, ref in zip(models, refs, strict=True)], ratio=False))
    return rows


def _complete(m: dict) -> str:
    """Whether the final model saw every epoch to its end: "yes (0)" or what it reached."""
    if "final_epoch" in m:
        done, of = m["final_epoch"], m.get("epochs")
    elif "final_step" in m:
        done, of = m["final_step"], m["total_steps"]
    else:
        return "–"
    return "yes (0)" if done is not None and done == of else f"no: {done} of {of}"


HEADERS = ["measure", "(a) torchrun alone", "(b) dyntrain torchrun mode",
           "(c) dyntrain exact mode", "(a)/(c)", "(b)/(c)"]
CHANGE_HEADERS = ["mode", "change", "trigger, epoch", "fired at, epoch", "new size from, epoch",
                  "latency, s", "training stopped, s", "gang restarts", "samples trained again"]


PHASE_HEADERS = ["mode", "change", "stop old gang, s", "start processes, s",
                 "script set-up, s", "first step, s", "latency, s", "warm gang starts"]


def phase_rows(modes: dict) -> list[list[str]]:
    """Where each gang restart's time went (the modes whose restarts have phases)."""
    rows = []
    for name in MODES:
        m = modes.get(name, {})
        for c in m.get("changes", []):
            p = c.get("phases")
            if not p or p.get("stop_s") is None:
                continue
            gang = [g for g in m.get("gang_starts", [])
                    if c["time_changed"] < g["time"] <= c["time_first_step"]]
            rows.append([m["label"], f"{c['kind']} -> {c['world_after']}",
                         _num(p["stop_s"], 2), _num(p["start_s"], 2), _num(p["setup_s"], 2),
                         _num(p["first_step_s"], 2), _num(c.get("latency_s"), 2),
                         f"{sum(g['warm'] for g in gang)} of {len(gang)}"])
    return rows


def change_rows(modes: dict) -> list[list[str]]:
    rows = []
    for name in MODES:
        for c in modes.get(name, {}).get("changes", []):
            rows.append([modes[name]["label"], f"{c['kind']} -> {c['world_after']}",
                         f"{c['trigger']:g}", _num(c["progress_at_change"], 2),
                         _num(c.get("progress_at_new_world"), 2) if "trained_on_at" not in c
                         else f"not reached (trained on at {c['trained_on_at']})",
                         _num(c.get("latency_s"), 2),
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
    ap.add_argument("--epochs", type=int, default=10)
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
    rows, crows, prows = table_rows(modes, statics), change_rows(modes), phase_rows(modes)
    table = (text_table(HEADERS, rows) + "\n\n" + text_table(CHANGE_HEADERS, crows) + "\n\n"
             + text_table(PHASE_HEADERS, prows))
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
        "change_rows": crows, "phase_headers": PHASE_HEADERS, "phase_rows": prows,
        "table": table, "notes": NOTES, "modes": modes, "static": statics,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2, default=str)  # the run folders' paths, shortened
    text = text.replace(str(work), "WORK").replace(f"{BENCH.parent}/", "")
    args.out.write_text(text + "\n")
    print(f"\nwrote {args.out} ({result['wall_s']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
