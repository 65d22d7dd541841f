"""Rescale latency: dyntrain vs torchrun's elastic agent, on this machine, in one run.

For every membership change -- a worker joins, a worker leaves gracefully (SIGTERM), a worker is
SIGKILLed -- it measures the rescale latency (the change -> the first step completed in the new
world) and the steps of work lost, for:

1. dyntrain: ``dyntrain run --workers 1:4 --nproc 2 --events ...`` on the built-in digits workload;
   the schedule cycles join / leave / kill / join (world sizes 2 -> 3 -> 2 -> 1 -> 2) ``--reps``
   times. Numbers come from the run's ``events.jsonl`` and ``metrics.jsonl``.
2. torchrun (``python -m torch.distributed.run``, c10d rendezvous, ``--nnodes 1:4``,
   ``--nproc-per-node 1``, one agent per "node", all on 127.0.0.1) running
   ``bench/torchrun_worker.py`` (same model, data and global batch, plain DDP over gloo, a
   checkpoint every step), in two configurations: torchrun's defaults and tuned-down timeouts. The
   same cycle: start one more agent (join), SIGTERM the newest agent (leave), SIGKILL the worker
   process of one agent (kill; the agent restarts its group and torchrun restarts every worker).
   A third, "shared-store" (tuned, with torch's default rendezvous-store sharing on), only tries
   a join: in torch 2.13 it deadlocks, which is why the other two turn the sharing off.

The torchrun side lives in ``bench/rescale_torchrun.py``. Writes
``bench/results/rescale_latency.json`` and prints a table. Run it with
``.venv/bin/python bench/rescale_latency.py`` (about 5-6 minutes; ``--quick`` about 2).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    JsonlTail,
    LineReader,
    descendants,
    fmt,
    kill_tree,
    machine_info,
    maximum,
    median,
)
from rescale_torchrun import (  # noqa: E402
    EPOCHS,
    KINDS,
    MAX_WORKERS,
    TORCHRUN_CONFIGS,
    run_torchrun,
    say,
)

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "rescale_latency.json"



# ---------------------------------------------------------------------------------------------
# dyntrain
# ---------------------------------------------------------------------------------------------

def dyntrain_schedule(reps: int, gap: int = 30) -> list[str]:
    """join, leave, kill, join per repetition (world 2 -> 3 -> 2 -> 1 -> 2), by step triggers.

    Events fire one at a time, each once the previous one took effect, so a trigger that is
    already due fires right after the previous change completed its first step.
    """
    items, step = [], 0
    for _ in range(reps):
        for action in ("join=1", "leave=1", "kill=1", "join=1"):
            step += gap
            items.append(f"step={step}:{action}")
    return items


def run_dyntrain(reps: int, work: Path, timeout: float) -> dict:
    out = work / "dyntrain"
    events = dyntrain_schedule(reps)
    expected = {"join": 2 * reps, "leave": reps, "crash": reps}
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", f"1:{MAX_WORKERS}",
           "--nproc", "2", "--events", ",".join(events), "--out", str(out),
           "-m", "dyntrain.workloads.digits", "--epochs", EPOCHS]
    say(f"dyntrain: {' '.join(cmd[3:])}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    reader = LineReader(proc.stdout, echo_to=work / "dyntrain-launcher.log")
    tail = JsonlTail(out / "events.jsonl")
    seen_workers: set[int] = set()
    status = "timeout"
    try:
        while time.time() - t0 < timeout:
            tail.poll()
            seen_workers |= set(descendants(proc.pid))
            got = _count_kinds(tail.records)
            if all(got.get(k, 0) >= n for k, n in expected.items()):
                status = "ok"
                break
            if proc.poll() is not None:
                status = f"launcher exited with code {proc.returncode}"
                break
            time.sleep(0.05)
    finally:
        kill_tree(proc, extra=seen_workers)
        reader.join()
    tail.poll()
    wall = time.time() - t0
    metrics = JsonlTail(out / "metrics.jsonl")
    metrics.poll()
    changes, notes = _dyntrain_changes(tail.records, metrics.records, reader.lines)
    if status != "ok":
        notes.append(f"status: {status} (events so far: {_count_kinds(tail.records)})")
    say(f"dyntrain: {status}, {len(changes)} changes in {wall:.1f} s")
    return {"system": "dyntrain", "config": "default", "status": status, "wall_s": round(wall, 1),
            "command": " ".join(["dyntrain", *cmd[4:]]), "events": events,
            "changes": changes, "notes": notes, "raw_events": tail.records}


def _count_kinds(records: list[dict]) -> dict[str, int]:
    gens: dict[str, set] = {}
    for r in records:
        gens.setdefault(r["event"], set()).add(r.get("generation"))
    return {k: len(v) for k, v in gens.items()}


def _dyntrain_changes(records, metrics, lines) -> tuple[list[dict], list[str]]:
    notes: list[str] = []
    # first and last metrics time per generation (unix), in file order
    first_time: dict[int, float] = {}
    last_before: dict[int, float | None] = {}
    prev_time = None
    for m in metrics:
        g = m["gen"]
        if g not in first_time:
            first_time[g] = m["time"]
            last_before[g] = prev_time
        prev_time = m["time"]
    spawned = {}  # worker id -> when the launcher started its process (unix, line arrival)
    for t, line in lines:
        m = re.search(r"event \S+:join=\d+: started (.+)$", line)
        if m:
            for w in m.group(1).split(","):
                spawned[w.strip()] = t
    by_gen: dict[tuple[int, str], list[dict]] = {}
    for r in records:
        if r["event"] in ("start", "resume"):
            continue
        by_gen.setdefault((r["generation"], r["event"]), []).append(r)
    changes = []
    for (gen, event), recs in sorted(by_gen.items()):
        if len(recs) > 1:
            notes.append(f"generation {gen}: {len(recs)} '{event}' records for one change "
                         f"(workers {[r['workers'] for r in recs]}); counted once")
            recs = sorted(recs, key=lambda r: (not r["workers"], r["requested_at"]))
        r = recs[0]
        kind = "kill" if event == "crash" else event
        redone = r.get("steps_redone", 0)
        c = {
            "kind": kind,
            "workers": r["workers"],
            "world_before": r["world_before"],
            "world_after": r.get("world_after"),
            "latency_s": r["latency_s"],
            "detect_s": round(r["detected_at"] - r["requested_at"], 4),
            "reform_s": round(r["reformed_at"] - r["requested_at"], 4),
            "steps_lost": redone,
            "steps_lost_max": redone + (1 if kind == "kill" else 0),
            "pause_s": None,
        }
        if gen in first_time and last_before.get(gen) is not None:
            c["pause_s"] = round(first_time[gen] - last_before[gen], 4)
        if kind == "join":
            c["latency_from_ready_s"] = round(r["first_step_at"] - r["detected_at"], 4)
        if kind == "join" and gen in first_time:
            w = r["workers"][0] if r["workers"] else None
            if w in spawned:
                c["latency_from_process_start_s"] = round(first_time[gen] - spawned[w], 4)
        changes.append(c)
    return changes, notes


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def _label(system: str, config: str) -> str:
    return system if system == "dyntrain" else f"torchrun/{config}"


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for run in runs:
        for kind in KINDS:
            cs = [c for c in run["changes"] if c["kind"] == kind]
            if not cs:
                continue
            ok = [c for c in cs if c.get("latency_s") is not None]
            row = {
                "system": run["system"], "config": run["config"], "kind": kind,
                "n": len(ok), "failed": len(cs) - len(ok),
                "failures": [c.get("note") for c in cs if c.get("latency_s") is None],
                "median_s": median([c["latency_s"] for c in ok]),
                "max_s": maximum([c["latency_s"] for c in ok]),
                "pause_median_s": median([c.get("pause_s") for c in ok]),
                "pause_max_s": maximum([c.get("pause_s") for c in ok]),
                "steps_lost_median": median([c.get("steps_lost") for c in ok]),
                "steps_lost_max": maximum([c.get("steps_lost") for c in ok]),
                "steps_lost_bound": maximum([c.get("steps_lost_max") for c in ok]),
            }
            if kind == "join":
                key = ("latency_from_ready_s" if run["system"] == "dyntrain"
                       else "latency_from_rendezvous_s")
                row["alt_median_s"] = median([c.get(key) for c in ok])
                row["alt_max_s"] = maximum([c.get(key) for c in ok])
                row["alt_what"] = ("from the new worker's hello" if run["system"] ==
                                   "dyntrain" else "from the new agent's rendezvous attempt")
            rows.append(row)
    return rows


def _lost_text(row: dict) -> str:
    lo, hi, bound = row["steps_lost_median"], row["steps_lost_max"], row["steps_lost_bound"]
    if lo is None:
        return "-"
    text = f"{lo:g}" if lo == hi else f"{lo:g} (max {hi:g})"
    if bound is not None and bound > (hi or 0):
        text += f" + <={bound - hi:g} in flight"
    return text


def compute_ratios(rows: list[dict]) -> tuple[dict, dict]:
    dyn = {r["kind"]: r for r in rows if r["system"] == "dyntrain"}
    tr = [r for r in rows if r["system"] == "torchrun" and r["median_s"] is not None]
    ratios: dict = {"latency": {}, "pause": {}}
    for r in tr:
        d = dyn.get(r["kind"])
        if not d:
            continue
        if d["median_s"]:
            ratios["latency"].setdefault(r["kind"], {})[r["config"]] = round(
                r["median_s"] / d["median_s"], 1)
        if d["pause_median_s"] and r["pause_median_s"] is not None:
            ratios["pause"].setdefault(r["kind"], {})[r["config"]] = round(
                r["pause_median_s"] / d["pause_median_s"], 1)
    goal = {"dyntrain_median_below_s": 1.0, "min_speedup_vs_torchrun_default": 20.0,
            "per_kind": {}}
    for kind in KINDS:
        d = dyn.get(kind)
        med = d["median_s"] if d else None
        speed = ratios["latency"].get(kind, {}).get("default")
        goal["per_kind"][kind] = {
            "dyntrain_median_s": med, "speedup_vs_default": speed,
            "below_1s": None if med is None else med < 1.0,
            "speedup_ok": None if speed is None else speed >= 20.0,
        }
    checks = [v[k] for v in goal["per_kind"].values() for k in ("below_1s", "speedup_ok")]
    goal["met"] = (False if any(c is False for c in checks)
                   else None if any(c is None for c in checks) else True)
    return ratios, goal


def print_report(rows: list[dict], runs: list[dict], ratios: dict, goal: dict) -> None:
    print()
    print("Rescale latency: membership change -> first step completed in the new world")
    head = (f"{'system/config':<23} {'change':<6} {'n':>3} {'median s':>9} {'max s':>8} "
            f"{'pause s':>8}  steps lost (median)")
    print(head)
    print("-" * len(head))
    for r in rows:
        n = f"{r['n']}" if not r["failed"] else f"{r['n']}+{r['failed']}F"
        line = (f"{_label(r['system'], r['config']):<23} {r['kind']:<6} {n:>3} "
                f"{fmt(r['median_s']):>9} {fmt(r['max_s']):>8} {fmt(r['pause_median_s']):>8}  "
                f"{_lost_text(r)}")
        if r["failed"]:
            line += f"  [F: {r['failures'][0]}]"
        print(line)
    print("  (n+kF: k changes never reached a step in the new world; see notes)")
    print()
    print("Joins on the other basis (median / max s):")
    for r in rows:
        if r["kind"] == "join" and r.get("alt_median_s") is not None:
            print(f"  {_label(r['system'], r['config']):<23} {fmt(r['alt_median_s']):>7} / "
                  f"{fmt(r['alt_max_s'])}  {r['alt_what']}")
    print()
    print("torchrun / dyntrain, ratio of medians (higher = dyntrain faster):")
    for what, title in (("latency", "latency"), ("pause", "pause (training stopped)")):
        for kind in KINDS:
            parts = [f"{cfg} {v:g}x" for cfg, v in ratios[what].get(kind, {}).items()]
            if parts:
                print(f"  {title:<25} {kind:<6} " + "  ".join(parts))
    print()
    print(f"Goal: dyntrain median < {goal['dyntrain_median_below_s']:g} s and >= "
          f"{goal['min_speedup_vs_torchrun_default']:g}x faster than torchrun defaults, per kind")
    verdict = {True: "ok", False: "MISSED", None: "not measured"}
    for kind, res in goal["per_kind"].items():
        speed = res["speedup_vs_default"]
        print(f"  {kind:<6} dyntrain median {fmt(res['dyntrain_median_s'])} s "
              f"({verdict[res['below_1s']]}); torchrun-default / dyntrain "
              f"{'-' if speed is None else f'{speed:g}x'} ({verdict[res['speedup_ok']]})")
    overall = {True: "MET", False: "NOT MET", None: "INCOMPLETE (not every kind measured)"}
    print(f"  overall: {overall[goal['met']]}")
    print()
    print("Notes:")
    for line in NOTES:
        print(f"  - {line}")
    for run in runs:
        label = _label(run["system"], run["config"])
        for note in run.get("notes", []):
            print(f"  - {label}: {note}")


NOTES = [
    "latency: dyntrain join = from the --events request that started the new worker to the "
    "first step with it (its start-up included; the others keep training meanwhile); torchrun "
    "join = from starting the new agent process, so it includes that agent's and the restarted "
    "workers' start-up. 'Joins on the other basis': dyntrain from the new worker's hello, "
    "torchrun from the new agent's rendezvous attempt.",
    "leave = SIGTERM (dyntrain: the worker finishes its step and hands over; torchrun: SIGTERM to "
    "the newest agent, which stops its worker; the other workers then fail in gloo and their "
    "agents restart them). kill = SIGKILL of one worker process (torchrun: an agent's child, not "
    "the agent; every agent then restarts its workers).",
    "pause = last step completed in the old world -> first step in the new one.",
    "steps lost: dyntrain = steps_redone (graceful changes lose nothing more); for a crash the "
    "interrupted in-flight step is lost too (<= steps_redone + 1). torchrun = checkpointed "
    "steps recomputed after the restart (it checkpoints every step) + the step in flight when "
    "its workers were stopped (<= 1: torchrun stops every worker on every change).",
    "torchrun/default = torchrun's defaults except --max-restarts 100 (the default 0 ends the job "
    "on the first worker failure, so a kill or leave would not be survived) and "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (see torchrun/shared-store). torchrun/tuned = "
    "--monitor-interval 0.05, last_call_timeout=1 and keep-alive 1 s x 3 (timeouts are whole "
    "seconds); keep_alive_max_attempt=2 split the job into two worlds in a trial run.",
    "torchrun/shared-store = tuned, with torch's default rendezvous-store sharing left on: in "
    "torch 2.13 a node joining a running job deadlocks (the newcomer waits for MASTER_ADDR under "
    "the new round's key prefix, which only a newly elected rank 0 writes; rank 0 waits for the "
    "newcomer's role info), so the join never completes. Stack dumps (--debug-rdzv) show the "
    "newcomer in RendezvousStoreInfo.build (store.get) and rank 0 in _assign_worker_ranks "
    "(multi_get).",
    "The c10d rendezvous store lives in the first torchrun agent; it is never the one that leaves.",
    f"--workers/--nnodes 1:{MAX_WORKERS}: a join never fills the job to its maximum (a torchrun "
    "rendezvous that reaches max nodes completes without waiting last_call_timeout).",
    "All processes share this machine's cores; other processes running at the same time (see "
    "machine.loadavg_* in the JSON) slow process start-up and steps for both systems.",
]


# ---------------------------------------------------------------------------------------------

def _short(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions of the join/leave/kill cycle for dyntrain and tuned torchrun")
    ap.add_argument("--default-reps", type=int, default=1,
                    help="repetitions for torchrun with its defaults (~2 min each)")
    ap.add_argument("--quick", action="store_true",
                    help="one repetition each; torchrun defaults measured for the kill only")
    ap.add_argument("--only", default="dyntrain,tuned,shared-store,default",
                    help="comma list of dyntrain, tuned, shared-store (the join-hang probe), "
                    "default")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep run folders and logs here (default: a temporary folder, removed)")
    ap.add_argument("--tuned-rdzv-conf", default=None,
                    help="override the tuned configuration's --rdzv-conf")
    ap.add_argument("--debug-rdzv", action="store_true",
                    help="torchrun agents log their rendezvous at DEBUG level (see --workdir)")
    args = ap.parse_args(argv)
    if args.tuned_rdzv_conf:
        conf = TORCHRUN_CONFIGS["tuned"]["args"]
        conf[conf.index("--rdzv-conf") + 1] = args.tuned_rdzv_conf
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    reps, default_reps = (1, 1) if args.quick else (args.reps, args.default_reps)
    default_kinds = ("kill",) if args.quick else KINDS

    if args.quick:
        only.discard("shared-store")

    def on_sigterm(signum, frame):  # let the finally blocks stop every process we started
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rescale_latency_"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    load_before = os.getloadavg()
    runs = []
    try:
        if "dyntrain" in only:
            runs.append(run_dyntrain(reps, work, timeout=60 + 25 * reps))
        if "tuned" in only:
            runs.append(run_torchrun("tuned", reps, work, change_timeout=45,
                                     debug=args.debug_rdzv))
        if "shared-store" in only:
            runs.append(run_torchrun("shared-store", 1, work, change_timeout=25,
                                     kinds=("join",), debug=args.debug_rdzv))
        if "default" in only:
            runs.append(run_torchrun("default", default_reps, work, change_timeout=120,
                                     kinds=default_kinds, debug=args.debug_rdzv))
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = summarize(runs)
    ratios, goal = compute_ratios(rows)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_report(rows, runs, ratios, goal)
    report = buf.getvalue()
    print(report, end="")
    result = {
        "benchmark": "rescale_latency",
        "machine": {**machine_info(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "command": " ".join([_short(sys.executable), *sys.argv]) if argv is None else argv,
        "settings": {"reps": reps, "default_reps": default_reps, "quick": args.quick,
                     "max_workers": MAX_WORKERS, "torchrun_configs": TORCHRUN_CONFIGS},
        "wall_s": round(time.time() - t0, 1),
        "summary": rows, "ratios": ratios, "goal": goal, "notes": NOTES,
        "runs": [{k: v for k, v in r.items() if k != "raw_events"} for r in runs],
        "dyntrain_events": next((r["raw_events"] for r in runs if r["system"] == "dyntrain"),
                                None),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".txt").write_text(
        f"{result['machine']['date']}  {result['command']}\n{report}")
    print(f"\nwrote {args.out} and {args.out.with_suffix('.txt').name} "
          f"({result['wall_s']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
