"""Worker start-up in `dyntrain run`: plain processes against the fork server, side by side.

Each round runs the digits workload twice, once with ``DYNTRAIN_FORKSERVER=0`` (every worker a
new ``python``, importing torch and torch._dynamo itself) and once with the fork server (the
default on a CPU build), in alternating order: ``--workers 1:3 --nproc 2`` and one
``step=5:join=1`` event. From the launcher's timestamped lines it takes

- initial: launcher start -> each initial worker's hello ("wants to join"),
- join: the event starting the worker -> its hello, and -> the first step in the world of 3,

then stops the run with Ctrl-C (SIGINT to its process group). Reference figures in the same run:
``python -c 'import torch'`` and ``import torch, torch._dynamo`` (what a worker imports before
its first step). Prints a table, writes ``bench/results/worker_startup.json``.

    .venv/bin/python bench/worker_startup.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import LineReader, fmt, machine_info, maximum, median, write_result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "worker_startup.json"
WORKLOAD = ["-m", "dyntrain.workloads.digits", "--epochs", "100", "--step-delay", "0.003"]
HELLO = re.compile(r"^\[ *([0-9.]+)s\] worker (w\d+) \(.*wants to join")
STARTED = re.compile(r"^\[ *([0-9.]+)s\] event step=5:join=1: started (w\d+)")
JOINED = re.compile(r"^\[ *([0-9.]+)s\] join (w\d+): world 2 -> 3, first step in the new world "
                    r"([0-9.]+) s after the request")


def one_run(fork_server: bool, workdir: Path, timeout: float) -> dict:
    env = {**os.environ, "DYNTRAIN_FORKSERVER": "1" if fork_server else "0",
           "OMP_NUM_THREADS": "1"}
    out = workdir / f"run-{'fork' if fork_server else 'plain'}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1:3", "--nproc", "2",
           "--out", str(out), "--events", "step=5:join=1", *WORKLOAD]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    reader = LineReader(proc.stdout)
    deadline = time.monotonic() + timeout
    result: dict = {"initial": [], "join_hello": None, "join_first_step": None}
    started_at: dict[str, float] = {}
    seen = 0
    while time.monotonic() < deadline and proc.poll() is None:
        lines = [line for _, line in reader.lines[seen:]]
        seen += len(lines)
        for line in lines:
            if m := STARTED.match(line):
                started_at[m.group(2)] = float(m.group(1))
            elif m := HELLO.match(line):
                t, worker = float(m.group(1)), m.group(2)
                if worker in started_at:
                    result["join_hello"] = t - started_at[worker]
                else:
                    result["initial"].append(t)
            elif m := JOINED.match(line):
                t, worker = float(m.group(1)), m.group(2)
                result["join_first_step"] = t - started_at[worker]
        if result["join_first_step"] is not None:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(120)
    reader.join()
    return result


def import_seconds(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def loadavg() -> float:
    return os.getloadavg()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    started = time.perf_counter()
    load_before = loadavg()
    runs: dict[str, list[dict]] = {"plain": [], "fork server": []}
    refs: dict[str, list[float]] = {"import torch": [], "import torch, torch._dynamo": []}
    with tempfile.TemporaryDirectory(prefix="dyntrain-startup-") as tmp:
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            for fork in order:
                res = one_run(fork, Path(tmp), args.timeout)
                runs["fork server" if fork else "plain"].append(res)
                print(f"round {r + 1} {'fork server' if fork else 'plain':<11} {res}",
                      flush=True)
            refs["import torch"].append(import_seconds("import torch"))
            refs["import torch, torch._dynamo"].append(
                import_seconds("import torch, torch._dynamo"))
    load_after = loadavg()
    rows = []
    for mode, results in runs.items():
        initial = [t for res in results for t in res["initial"]]
        hello = [res["join_hello"] for res in results]
        first = [res["join_first_step"] for res in results]
        rows.append({"mode": mode, "n": len(results),
                     "initial_hello_median_s": median(initial),
                     "initial_hello_max_s": maximum(initial),
                     "join_hello_median_s": median(hello), "join_hello_max_s": maximum(hello),
                     "join_first_step_median_s": median(first),
                     "join_first_step_max_s": maximum(first)})
    def cell(row: dict, key: str) -> str:
        return f"{fmt(row[key + '_median_s'], 2)} ({fmt(row[key + '_max_s'], 2)})"

    header = (f"{'mode':<12} {'n':>2}  {'initial hello s':<16} {'join hello s':<14} "
              "join -> first step s")
    lines = ["Worker start-up in `dyntrain run` (digits, --workers 1:3 --nproc 2, "
             "step=5:join=1; medians, max in brackets)", header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row['mode']:<12} {row['n']:>2}  {cell(row, 'initial_hello'):<16} "
                     f"{cell(row, 'join_hello'):<14} {cell(row, 'join_first_step')}")
    plain, fork = rows
    if plain["join_hello_median_s"] and fork["join_hello_median_s"]:
        ratio = plain["join_hello_median_s"] / fork["join_hello_median_s"]
        lines.append(f"join start-up (event -> hello): {ratio:.0f}x faster with the fork server")
    for name, values in refs.items():
        lines.append(f"reference: python -c '{name}': median {median(values):.2f} s")
    lines.append(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
    table = "\n".join(lines)
    print("\n" + table)
    write_result(args.out, {"machine": machine_info(), "rows": rows, "runs": runs,
                            "references": refs, "load_before": load_before,
                            "load_after": load_after, "table": table,
                            "total_seconds": time.perf_counter() - started})


if __name__ == "__main__":
    main()
