"""Chaos soak: ``dyntrain run --chaos SEED:N`` on the ledger workload, against the static run.

One static run of ``tests/scripts/ledger_train.py`` (plain ``python``, no coordinator), then one
elastic run with ``--workers 1:4 --nproc 2 --failure-timeout 2 --chaos SEED:N`` (joins, leaves,
kills and hangs at random times without waiting for the previous change, aimed at re-formations,
state hand-overs, checkpoint writes, several at once). Slower chunks (``--step-delay``) keep the
job running long enough for every strike; 4 MB of optimizer ballast makes hand-overs and
checkpoint writes last long enough to be hit. Reported:

* completion (exit code, strikes made of N, steps), wall time;
* max |diff| of every final parameter against the static run (0 = bitwise equal);
* samples double-applied and samples missed (the ledger's counts against the pure sampler);
* stray processes: every process seen under the launcher during the run, alive after it ended;
* strikes by action and aim, membership changes by kind, steps redone.

    .venv/bin/python bench/chaos_soak.py                     # 100 strikes, ~10-15 minutes
    .venv/bin/python bench/chaos_soak.py --strikes 20        # shorter

Writes a table to stdout and ``bench/results/chaos_soak.json``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from _common import alive, descendants, machine_info, read_jsonl, write_result
from dyntrain.cli.compare import state_distance
from dyntrain.testing.jobs import pinned_env

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LEDGER = ROOT / "tests" / "scripts" / "ledger_train.py"
sys.path.insert(0, str(ROOT / "tests"))
from test_elastic_e2e import expected_counts  # noqa: E402 (the ledger's counts, pure sampler)


def static_run(out: Path) -> None:
    env = pinned_env(DYNTRAIN_OUT=str(out))  # a job's numerics, as every worker's
    env.pop("DYNTRAIN_COORDINATOR", None)
    subprocess.run([sys.executable, str(LEDGER)], env=env, check=True, cwd=ROOT,
                   capture_output=True, timeout=600)


def watch_tree(pid: int, seen: set[int], stop: threading.Event) -> None:
    """Collect every process under ``pid`` (workers, fork server) while the run lasts."""
    while not stop.wait(0.2):
        seen.update(descendants(pid))


def max_diff(static: Path, run: Path) -> float:
    a = torch.load(static / "final.pt", weights_only=True)
    b = torch.load(run / "final.pt", weights_only=True)
    distance = state_distance(a, b)  # (a NaN in one only: inf)
    return float("inf") if distance["nan_in_one"] or not distance["non_float_equal"] \
        else distance["max_abs_diff"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--strikes", type=int, default=100)
    ap.add_argument("--step-delay", type=float, default=0.1, help="ledger seconds per chunk")
    ap.add_argument("--timeout", type=float, default=3000.0)
    ap.add_argument("--out", default=str(BENCH / "results" / "chaos_soak.json"))
    args = ap.parse_args(argv)
    began = time.monotonic()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dyntrain-chaos-soak-") as tmp:
        static, out = Path(tmp) / "static", Path(tmp) / "run"
        static_run(static)
        cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1:4", "--nproc",
               "2", "--failure-timeout", "2", "--out", str(out), "--chaos",
               f"{args.seed}:{args.strikes}", str(LEDGER), "--step-delay", str(args.step_delay),
               "--ballast-mb", "4"]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        seen: set[int] = set()
        stop = threading.Event()
        watcher = threading.Thread(target=watch_tree, args=(proc.pid, seen, stop), daemon=True)
        watcher.start()
        stdout, _ = proc.communicate(timeout=args.timeout)
        stop.set()
        watcher.join()
        wall = time.monotonic() - t0
        (Path(tmp) / "stdout.txt").write_text(stdout)
        hellos = {int(pid) for pid in re.findall(r"\(\S+ pid (\d+)\) wants to join", stdout)}
        time.sleep(1.0)  # the launcher has exited: give the kernel a moment to reap
        stray = sorted(pid for pid in seen | hellos if alive(pid))
        strikes = read_jsonl(out / "chaos.jsonl")
        events = read_jsonl(out / "events.jsonl")
        finished = proc.returncode == 0 and (out / "final.pt").exists()
        result = {
            "exit_code": proc.returncode, "finished": finished, "wall_s": round(wall, 1),
            "strikes_asked": args.strikes, "strikes_made": len(strikes),
            "strikes_by_action": dict(collections.Counter(s["action"] for s in strikes)),
            "strikes_by_aim": dict(collections.Counter(s["aim"] for s in strikes)),
            "changes_by_kind": dict(collections.Counter(e["event"] for e in events)),
            # steps computed again after a roll-back to a checkpoint (never applied twice):
            # once per generation, though several changes name the same one
            "steps_redone": sum({e["generation"]: e.get("steps_redone") or 0
                                 for e in events}.values()),
            "workers_started": len(set(re.findall(r"worker (w\d+) \(", stdout))),
            "processes_seen": len(seen | hellos), "stray_processes": stray,
        }
        if finished:
            counts = torch.load(out / "final.pt", weights_only=True)["counts"]
            want = expected_counts()
            result["max_abs_diff_vs_static"] = max_diff(static, out)
            result["samples_double_applied"] = int((counts - want).clamp(min=0).sum())
            result["samples_missed"] = int((want - counts).clamp(min=0).sum())
        else:
            result["tail"] = stdout[-3000:]
    result["load_before"] = [round(x, 1) for x in load_before]
    result["load_after"] = [round(x, 1) for x in os.getloadavg()]
    print("| strikes made / asked | finished | wall | changes (join/leave/crash/resume) | "
          "steps redone | max \\|diff\\| vs static | samples double-applied / missed | "
          "stray processes |")
    print("| --- | --- | ---: | --- | ---: | ---: | --- | ---: |")
    kinds = result["changes_by_kind"]
    print(f"| {result['strikes_made']} / {args.strikes} | {'yes' if result['finished'] else 'NO'} "
          f"| {wall:.0f} s | {kinds.get('join', 0)}/{kinds.get('leave', 0)}/"
          f"{kinds.get('crash', 0)}/{kinds.get('resume', 0)} | {result['steps_redone']} | "
          f"{result.get('max_abs_diff_vs_static', '-')} | "
          f"{result.get('samples_double_applied', '-')} / {result.get('samples_missed', '-')} "
          f"| {len(stray)} |")
    print(f"strikes by action: {result['strikes_by_action']}; by aim: {result['strikes_by_aim']}")
    if not result["finished"]:
        print(result["tail"])
    result["total_seconds"] = time.monotonic() - began
    write_result(args.out, {"benchmark": "chaos soak (ledger workload, CPU, gloo)",
                            "machine": machine_info(), "seed": args.seed, **result})


if __name__ == "__main__":
    main()
