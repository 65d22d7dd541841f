"""Join latency in `dyntrain run` from the request, warm, cold and from standby, in one run.

What a user waits for when a worker joins is the time from the request (the launcher's
``--events join=K``, a chaos strike, capacity the service grew into) to the first step in the
new world; ``events.jsonl`` records it as a join's ``latency_s``. Beside it this benchmark gives
the time from the moment the new worker was ready (its hello, ``detected_at``) to that step: what
dyntrain itself adds once a worker can train.

Two workloads: (a) the built-in digits workload (``-m dyntrain.workloads.digits``) and (b)
``bench/sklearn_digits.py``, a script that imports scikit-learn and loads, splits and scales its
data before ``fit()`` (start-up work of its own, which no fork server can do for it). Each runs
``dyntrain run --workers 1:2 --nproc 2`` twice, with the fork server (warm, the default) and with
``DYNTRAIN_FORKSERVER=0`` (cold: every worker a new ``python``), in alternating order. A first
``join=1`` into the full world starts a third worker, which waits on standby (it ran the script
up to ``fit()``). Each repetition of the schedule:

1. ``kill=1``: a member is SIGKILLed and the standby is admitted in its place (world 2 -> 2):
   standby, from the kill request to the first step with the standby in;
2. ``leave=1``: world 2 -> 1;
3. ``join=1``: a new worker is started (world 1 -> 2): a warm or cold join, from the request and
   from the worker's hello;
4. ``join=1``: with the world full, the new worker waits on standby for the next repetition's
   kill (the schedule leaves it ``--standby-gap`` steps to get ready, ``--standby-gap-warm``
   with the fork server; a standby not ready in time is reported, not counted as one).

Numbers come from the run's ``events.jsonl``. Prints a table, writes
``bench/results/join_latency.json``.

    .venv/bin/python bench/join_latency.py --reps 3     # ~15 minutes at load 15 on 2 cores
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    JsonlTail,
    LineReader,
    descendants,
    fmt,
    kill_tree,
    machine_info,
    maximum,
    median,
    write_result,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "join_latency.json"
WORKLOADS = {
    "digits": ["-m", "dyntrain.workloads.digits", "--epochs", "10000", "--log-every", "0"],
    "sklearn script": [str(ROOT / "bench" / "sklearn_digits.py"), "--epochs", "10000"],
}
GAP = 20  # steps between the events of one repetition


def schedule(reps: int, standby_gap: int, first: int = 20) -> list[str]:
    """A first standby (a join into the full world), then kill, leave, join, join (a new
    standby) per repetition, by step triggers."""
    items, step = ["step=1:join=1"], first
    for rep in range(reps):
        if rep:
            step += standby_gap
        for action in ("kill=1", "leave=1", "join=1", "join=1"):
            items.append(f"step={step}:{action}")
            step += GAP
        step -= GAP
    return items


def classify(records: list[dict]) -> dict[str, list[dict]]:
    """Requested joins and standby admissions, from a run's ``events.jsonl`` records.

    A standby admitted in place of a member shows as a crash (or leave) and a join in the same
    generation; a join alone is a requested one (a standby that was not ready in time joins so
    later, from the request that started it). A crash that shrank the world had no standby
    ready: ``missed``."""
    by_gen: dict[int, list[dict]] = {}
    for r in records:
        by_gen.setdefault(r["generation"], []).append(r)
    joins, standby, missed = [], [], []
    for gen, recs in sorted(by_gen.items()):
        gone = [r for r in recs if r["event"] in ("crash", "leave")]
        came = [r for r in recs if r["event"] == "join"]
        if gone and came:
            change, admitted = gone[0], came[0]
            standby.append({
                "generation": gen, "kind": change["event"], "workers": change["workers"],
                "standby": admitted["workers"],
                "from_request_s": change["latency_s"],
                "ready_before_request": admitted["detected_at"] <= change["requested_at"],
                "world": [change["world_before"], change.get("world_after")]})
        elif gone and gone[0]["event"] == "crash":
            missed.append({"generation": gen, "workers": gone[0]["workers"],
                           "world": [gone[0]["world_before"], gone[0].get("world_after")]})
        elif came and not gone:
            r = came[0]
            joins.append({
                "generation": gen, "workers": r["workers"], "from_request_s": r["latency_s"],
                "from_ready_s": round(r["first_step_at"] - r["detected_at"], 4),
                "startup_s": round(r["detected_at"] - r["requested_at"], 4),
                "world": [r["world_before"], r.get("world_after")]})
    return {"joins": joins, "standby": standby, "missed": missed}


def one_run(workload: str, warm: bool, reps: int, standby_gap: int, work: Path,
            timeout: float) -> dict:
    out = work / f"{workload.split()[0]}-{'warm' if warm else 'cold'}"
    events = schedule(reps, standby_gap)
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1:2", "--nproc", "2",
           "--out", str(out), "--events", ",".join(events), *WORKLOADS[workload],
           "--step-delay", "0.02"]
    env = {**os.environ, "DYNTRAIN_FORKSERVER": "1" if warm else "0", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    reader = LineReader(proc.stdout, echo_to=work / f"{out.name}.log")
    tail = JsonlTail(out / "events.jsonl")
    seen: set[int] = set()
    t0, status = time.monotonic(), "timeout"
    try:
        while time.monotonic() - t0 < timeout:
            tail.poll()
            seen |= set(descendants(proc.pid))
            # the last event starts a standby that nothing measures: once it fired, every
            # measured change has its record (an event fires once the one before took effect)
            if any(f"event {events[-1]}:" in line for _, line in reader.lines):
                status = "ok"
                break
            if proc.poll() is not None:
                status = f"launcher exited with code {proc.returncode}"
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        kill_tree(proc, extra=seen)
        reader.join()
    tail.poll()
    found = classify(tail.records)
    wall = time.monotonic() - t0
    print(f"{workload:<15} {'warm' if warm else 'cold'}: {status} in {wall:.0f} s; "
          f"joins {[j['from_request_s'] for j in found['joins']]}, standby "
          f"{[(s['from_request_s'], s['ready_before_request']) for s in found['standby']]}, "
          f"{len(found['missed'])} kill(s) without a standby ready",
          flush=True)
    command = " ".join(["dyntrain", *cmd[4:]]).replace(str(ROOT) + "/", "")
    return {"workload": workload, "mode": "warm" if warm else "cold", "status": status,
            "wall_s": round(wall, 1), "command": command, "events": events, **found,
            "records": tail.records,
            "launcher_lines": [line for _, line in reader.lines
                               if " join " in line or "standby" in line or "event " in line]}


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for workload in [w for w in WORKLOADS if any(r["workload"] == w for r in runs)]:
        for mode in ("warm", "cold"):
            joins = [j for r in runs if r["workload"] == workload and r["mode"] == mode
                     for j in r["joins"]]
            rows.append({
                "workload": workload, "what": f"join, {mode}", "n": len(joins), "not_ready": 0,
                "from_request_median_s": median([j["from_request_s"] for j in joins]),
                "from_request_max_s": maximum([j["from_request_s"] for j in joins]),
                "from_ready_median_s": median([j["from_ready_s"] for j in joins]),
                "from_ready_max_s": maximum([j["from_ready_s"] for j in joins]),
                "startup_median_s": median([j["startup_s"] for j in joins])})
        standby = [s for r in runs if r["workload"] == workload for s in r["standby"]]
        ready = [s for s in standby if s["ready_before_request"]]
        missed = sum(len(r["missed"]) for r in runs if r["workload"] == workload)
        rows.append({
            "workload": workload, "what": "standby admitted (kill)", "n": len(ready),
            "not_ready": len(standby) - len(ready) + missed,
            "from_request_median_s": median([s["from_request_s"] for s in ready]),
            "from_request_max_s": maximum([s["from_request_s"] for s in ready]),
            "from_ready_median_s": None, "from_ready_max_s": None, "startup_median_s": None})
    return rows


def table(rows: list[dict], load: tuple[float, float]) -> str:
    def cell(row: dict, key: str) -> str:
        med, top = row[f"{key}_median_s"], row[f"{key}_max_s"]
        return "-" if med is None else f"{fmt(med)} ({fmt(top)})"

    head = (f"{'workload':<15} {'change':<24} {'n':>2}  {'request -> first step s':<24} "
            f"{'ready -> first step s':<22} request -> ready s")
    lines = ["Join latency in `dyntrain run` (--workers 1:2 --nproc 2; medians, max in "
             "brackets)", head, "-" * len(head)]
    for r in rows:
        late = f"  (+{r['not_ready']} not ready in time)" if r["not_ready"] else ""
        lines.append(f"{r['workload']:<15} {r['what']:<24} {r['n']:>2}  "
                     f"{cell(r, 'from_request'):<24} {cell(r, 'from_ready'):<22} "
                     f"{fmt(r['startup_median_s'])}{late}")
    lines.append("request: the --events join (or, standby, the kill); ready: the new worker's "
                 "hello; warm: forked from the fork server; cold: DYNTRAIN_FORKSERVER=0")
    lines.append(f"load average (1 min): {load[0]:.2f} before, {load[1]:.2f} after")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the schedule per run")
    ap.add_argument("--rounds", type=int, default=1,
                    help="warm and cold runs per workload (alternating order)")
    ap.add_argument("--standby-gap", type=int, default=250,
                    help="steps between starting a standby worker and the next kill, cold")
    ap.add_argument("--standby-gap-warm", type=int, default=80,
                    help="the same with the fork server")
    ap.add_argument("--only", default=",".join(WORKLOADS),
                    help=f"comma list of workloads: {', '.join(WORKLOADS)}")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run at most")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep run folders and launcher logs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in only if w not in WORKLOADS]
    if unknown or args.reps < 1 or args.rounds < 1:
        print(f"join_latency: error: --only takes {', '.join(WORKLOADS)}; --reps and --rounds "
              f">= 1 (got --only {args.only!r}, --reps {args.reps}, --rounds {args.rounds})",
              file=sys.stderr)
        return 2

    def on_sigterm(signum, frame):  # let the finally blocks stop every process we started
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.perf_counter()
    load_before = os.getloadavg()
    runs = []
    flip = False
    with tempfile.TemporaryDirectory(prefix="join_latency_") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for _ in range(args.rounds):
            for workload in only:
                for warm in ((False, True) if flip else (True, False)):
                    gap = args.standby_gap_warm if warm else args.standby_gap
                    runs.append(one_run(workload, warm, args.reps, gap, work, args.timeout))
                flip = not flip
    load_after = os.getloadavg()
    rows = summarize(runs)
    text = table(rows, (load_before[0], load_after[0]))
    print("\n" + text)
    command = " ".join([".venv/bin/python", "bench/join_latency.py",
                        *(sys.argv[1:] if argv is None else argv)])
    write_result(args.out, {
        "benchmark": "join_latency", "command": command,
        "machine": {**machine_info(), "loadavg_before": load_before, "loadavg_after": load_after},
        "settings": {"reps": args.reps, "rounds": args.rounds, "gap": GAP,
                     "standby_gap": args.standby_gap, "standby_gap_warm": args.standby_gap_warm,
                     "workloads": WORKLOADS},
        "rows": rows, "table": text, "runs": runs,
        "total_seconds": time.perf_counter() - started})
    return 0


if __name__ == "__main__":
    sys.exit(main())
