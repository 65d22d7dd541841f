"""Rescale latency with loader processes: does the input pipeline slow membership changes?

The image workload (``digits-resnet`` recipe on digits JPEGs packed into shards) runs under
``dyntrain run --workers 1:4 --nproc 2`` with the rescale benchmark's schedule (join, leave,
kill, join per repetition, ``bench/rescale_latency.py``), once with 2 loader processes per
worker and once loading in the training process, side by side. Latency: from the change's
request to the first completed step in the new world (``events.jsonl``). The benchmark also
watches every training worker's loader processes in /proc (the other members of the session
each worker leads): a loader process that appears beside a worker's first ones is a respawn.

    .venv/bin/python bench/loader_rescale.py --reps 2      # ~4 minutes
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

from _common import (  # bench/ is sys.path[0] when run as a script
    JsonlTail,
    descendants,
    kill_tree,
    machine_info,
    median,
    write_result,
)
from dyntrain.data import pack
from dyntrain.elastic.runs.log import RunLogError, read_metrics
from dyntrain.procstat import read_stat
from dyntrain.workloads.digits_images import write_digits_images
from rescale_latency import _count_kinds, dyntrain_schedule


def session(pid: int) -> int | None:
    """The session id of ``pid`` (training workers lead their own sessions, with or without the
    fork server; their loader processes stay in them)."""
    stat = read_stat(pid)
    return None if stat is None else stat.session


def loader_processes(pids: list[int]) -> dict[int, set[int]]:
    """Training worker pid -> its loader processes: the members of a descendant's session
    other than its leader (the fork server's session holds no other process)."""
    found: dict[int, set[int]] = {}
    for pid in pids:
        sid = session(pid)
        if sid is not None and sid != pid and sid in pids:
            found.setdefault(sid, set()).add(pid)
    return found


def step_seconds(metrics: Path) -> float | None:
    """The median time between consecutive steps of one generation (the run's pace)."""
    try:
        rows = read_metrics(metrics)
    except (OSError, RunLogError):
        return None
    gaps = [b.time - a.time for a, b in pairwise(rows)
            if a.generation == b.generation and b.step == a.step + 1]
    return median(gaps)


def run(data: Path, out: Path, loader_workers: int, reps: int, timeout: float) -> dict:
    events = dyntrain_schedule(reps)
    expected = {"join": 2 * reps, "leave": reps, "crash": reps}
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1:4", "--nproc", "2",
           "--quiet", "--events", ",".join(events), "--out", str(out), "-m",
           "dyntrain.workloads.imagenet", "--data", str(data), "--recipe", "digits-resnet",
           "--epochs", "1000", "--loader-workers", str(loader_workers), "--step-delay", "0.01",
           "--checkpoint-every", "1000000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            start_new_session=True)
    tail = JsonlTail(out / "events.jsonl")
    loaders: dict[int, set[int]] = {}  # training worker pid -> its loader pids seen first
    respawned, seen = 0, set()
    t0, status = time.time(), "timeout"
    try:
        while time.time() - t0 < timeout:
            tail.poll()
            now = descendants(proc.pid)
            seen |= set(now)
            for worker, kids in loader_processes(now).items():
                if len(kids) < loader_workers and worker not in loaders:
                    continue  # still forking its loader processes
                if worker not in loaders:
                    loaders[worker] = kids
                elif not kids <= loaders[worker]:
                    respawned += len(kids - loaders[worker])
                    loaders[worker] |= kids
            if all(_count_kinds(tail.records).get(k, 0) >= n for k, n in expected.items()):
                status = "ok"
                break
            if proc.poll() is not None:
                status = f"launcher exited with code {proc.returncode}"
                break
            time.sleep(0.05)
    finally:
        kill_tree(proc, extra=seen)
    tail.poll()
    by_kind: dict[str, list[float]] = {}
    for r in tail.records:
        if r["event"] in ("join", "leave", "crash") and r.get("latency_s") is not None:
            by_kind.setdefault("kill" if r["event"] == "crash" else r["event"], []).append(
                r["latency_s"])
    return {"loader_workers": loader_workers, "status": status, "latency_s": by_kind,
            "step_s": step_seconds(out / "metrics.jsonl"),
            "loader_processes_per_worker": sorted({len(v) for v in loaders.values()}),
            "respawned_loader_processes": respawned, "wall_s": round(time.time() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--out", default="bench/results/loader_rescale.json")
    args = ap.parse_args()
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="loader-rescale-"))
    write_digits_images(tmp / "jpeg", size=16)
    for split in ("train", "val"):
        pack(str(tmp / "jpeg" / split), str(tmp / "packed" / split))
    runs = [run(tmp / "packed", tmp / f"run-{w}", w, args.reps, args.timeout) for w in (2, 0)]
    load = os.getloadavg()
    print(f"\ndigits-resnet from packed shards, --workers 1:4 --nproc 2, {args.reps} x (join, "
          f"leave, kill, join); load average {load[0]:.2f}")
    print("| loader processes per worker | change | n | median s | max s | median step s |\n"
          "| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in runs:
        for kind in ("join", "leave", "kill"):
            values = r["latency_s"].get(kind, [])
            nan = float("nan")
            print(f"| {r['loader_workers']} | {kind} | {len(values)} | "
                  f"{median(values) or nan:.3f} | {max(values, default=nan):.3f} | "
                  f"{r['step_s'] or nan:.3f} |")
        print(f"(loader processes {r['loader_workers']}: status {r['status']}, loader "
              f"processes per worker seen {r['loader_processes_per_worker']}, respawned "
              f"{r['respawned_loader_processes']})")
    write_result(args.out, {"machine": machine_info(), "args": vars(args), "runs": runs,
                            "load_average": load, "total_seconds": time.time() - t0})


if __name__ == "__main__":
    main()
