"""The job service on a Ray cluster vs on this machine: submit -> first step, node join ->
stepping on it, node loss -> stepping smaller.

One run, side by side: a throw-away Ray cluster on 127.0.0.1 (``LocalRayCluster``: a head
without CPUs and one worker node of a SPOT environment, each its own ``ray start``), a
``dyntrain server --executor ray`` pointed at it, and a ``dyntrain server`` with the local
executor (default settings: one warm worker, filled after the first request that could use
it). Through the HTTP API each server gets an elastic job (workers 1..3, slots of 1 CPU) running
``tests/scripts/ledger_train.py`` with more epochs than it reaches. Times, on one clock
(``time.time()``; metrics.jsonl rows carry the workers' unix time):

* submit -> first step: the API's submit returning -> the first metrics.jsonl row (both
  executors; the job starts with the slots its environment has: 1 node of 1 slot on Ray,
  ``desired_slots`` 1 locally);
* node join -> stepping on it (Ray): a new worker node (``ray start`` with one more unit of the
  environment's resource) is launched; phases: launch -> the node is registered (``ray start``
  printed that it runs) -> the first step in the bigger world;
* node loss -> stepping smaller (Ray): the new node's raylet is SIGKILLed (a spot reclaim) ->
  the first step in the smaller world (Ray's health check: 0.5 s period, 3 misses).

    .venv/bin/python bench/ray_service.py --reps 2      # ~3-5 minutes on 2 cores

Writes a table and ``bench/results/ray_service.json``. Run with ``dyntrain[ray]`` installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    fmt,
    machine_info,
    read_jsonl,
    start_dyntrain_server,
    write_result,
)
from dyntrain.service.client import Client
from dyntrain.testing.raycluster import LocalRayCluster
from dyntrain.testing.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]
LEDGER = [sys.executable, str(ROOT / "tests" / "scripts" / "ledger_train.py"), "--epochs",
          "100000", "--step-delay", "0.01"]


def rows(path: Path) -> list[dict]:
    return read_jsonl(path)


def first_step(run: Path, after: float, world=None) -> float:
    """Unix time of the first metrics row after ``after`` (in a world of ``world``)."""
    def found():
        for r in rows(run / "metrics.jsonl"):
            if r["time"] > after and (world is None or r["world_size"] == world):
                return r["time"]
        return None
    return wait_until(found, f"a step in {run.name} (world {world})", 180, 0.05, 0.05)


def submit(url: str, state: Path, queue: str) -> tuple[Path, float]:
    with Client(url) as client:
        job = client.submit(queue=queue, command=LEDGER, workers={"min": 1, "max": 3},
                            resources={"cpus": 1, "memory_mib": 128})
        submitted = time.time()
    run = state / "runs" / "jobs" / job["id"]
    return run, first_step(run, 0) - submitted


def ray_rounds(cluster: LocalRayCluster, run: Path, reps: int) -> list[dict]:
    out = []
    for i in range(reps):
        name = f"spot-join-{i}"
        launched = time.time()
        cluster.add_node(name, 1, {"dyntrain_ce_spot": 1})
        registered = time.time()
        grown = first_step(run, registered, world=2)
        time.sleep(2)  # a few steps at world 2
        killed = time.time()
        cluster.kill_raylet(name)
        smaller = first_step(run, killed, world=1)
        cluster.stop_node(name)
        out.append({"node_start_s": registered - launched, "join_to_step_s": grown - registered,
                    "loss_to_smaller_step_s": smaller - killed})
        time.sleep(2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ray_service.json"))
    args = ap.parse_args()
    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="dtbench-ray-"))
    cluster = LocalRayCluster()
    servers = []
    try:
        cluster.start()
        cluster.add_node("spot-1", 1, {"dyntrain_ce_spot": 1})
        load = os.getloadavg()[0]
        result: dict = {"machine": machine_info(), "load_average_1m_start": load}
        for mode, extra in (("ray", ["--executor", "ray", "--ray-address", cluster.address]),
                            ("local", [])):
            state = tmp / mode
            proc, url = start_dyntrain_server(state, tmp / f"{mode}.log", *extra)
            servers.append(proc)
            with Client(url) as client:
                client.create_compute_environment(
                    name="spot", capacity_type="SPOT", price_per_slot_hour=0.1,
                    slot={"cpus": 1, "gpus": 0, "memory_mib": 128}, min_slots=0,
                    desired_slots=1, max_slots=3)
                client.create_job_queue(name="q", compute_environments=["spot"])
            run, seconds = submit(url, state, "q")
            result[f"{mode}_submit_to_first_step_s"] = seconds
            if mode == "ray":
                result["ray_rounds"] = ray_rounds(cluster, run, args.reps)
            proc.terminate()
            proc.wait(timeout=60)
        result["load_average_1m_end"] = os.getloadavg()[0]
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.kill()
        cluster.close()
    result["total_seconds"] = time.monotonic() - began
    rounds = result["ray_rounds"]

    def med(key):
        return statistics.median(r[key] for r in rounds)
    print(f"| what | Ray executor | local executor |\n| --- | --- | --- |\n"
          f"| submit -> first step | {fmt(result['ray_submit_to_first_step_s'], 2)} s | "
          f"{fmt(result['local_submit_to_first_step_s'], 2)} s |\n"
          f"| node launched -> registered with Ray | {fmt(med('node_start_s'), 2)} s | - |\n"
          f"| node registered -> first step on it | {fmt(med('join_to_step_s'), 2)} s | - |\n"
          f"| raylet killed -> first step smaller | {fmt(med('loss_to_smaller_step_s'), 2)} s "
          f"| - |\n(medians of {len(rounds)}; load average {load:.1f} at start, "
          f"{result['load_average_1m_end']:.1f} at end)")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
