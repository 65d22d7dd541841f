"""`make demo`: the whole product on the embedded service, in about two minutes on 2 cores.

1. Starts the embedded job service (SQLite, local processes) on 127.0.0.1.
2. Creates a SPOT compute environment that replays a capacity trace (examples/traces), a RESERVED
   pool whose idle slots are lent to training and later taken back, and an ON_DEMAND one; a
   high-priority `training` queue over spot -> reserved -> on-demand, and a `batch` queue.
3. Submits an elastic training job (the digits workload, 1 to 4 workers) and a small array job.
4. Shows live progress: jobs, workers per environment, preemptions, training step and loss;
   the service's web dashboard (its URL is printed) shows the same, with charts, as it happens.
5. Ends with a summary: accuracy, equivalence to a static one-worker run, and cost against a
   static on-demand allocation of the job's max workers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import torch
import uvicorn

from dyntrain.service.api.app import create_app
from dyntrain.service.client import Client
from dyntrain.service.jobtext import live_workers
from dyntrain.service.server import Service, ServiceConfig

HERE = Path(__file__).resolve().parent
DIGITS = ["-m", "dyntrain.workloads.digits", "--epochs", "30", "--global-batch", "64",
          "--chunk-size", "8", "--noise-scale"]  # B_simple: the dashboard charts it
SLOT = {"cpus": 0.25, "gpus": 0, "memory_mib": 512}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(state: Path) -> tuple[Service, uvicorn.Server, str]:
    port = free_port()
    service = Service(ServiceConfig(state_dir=state, port=port, grace_seconds=30))
    service.start()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    client = Client(url)
    for _ in range(200):
        try:
            client.health()
            break
        except Exception:
            time.sleep(0.05)
    return service, server, url


def setup(client: Client) -> None:
    client.create_compute_environment(name="spot", capacity_type="SPOT", price_per_slot_hour=0.35,
                                      slot=SLOT, min_slots=0, desired_slots=0, max_slots=4)
    client.set_capacity_trace("spot", (HERE / "traces" / "spot_demo.csv").read_text())
    client.create_compute_environment(name="reserved", capacity_type="RESERVED",
                                      price_per_slot_hour=0.60, slot=SLOT, min_slots=0,
                                      desired_slots=2, max_slots=2)
    client.create_compute_environment(name="ondemand", capacity_type="ON_DEMAND",
                                      price_per_slot_hour=1.00, slot=SLOT, min_slots=0,
                                      desired_slots=1, max_slots=4)
    client.create_job_queue(name="training", priority=10,
                            compute_environments=["spot", "reserved"])
    client.create_job_queue(name="batch", priority=1, compute_environments=["ondemand"])


def screenshots(url: str, out: str, job_id: str) -> None:
    """The dashboard's main pages as PNGs (the README's come from here), or why not."""
    from dyntrain.service.web.screenshots import take

    try:
        paths = take(url, Path(out), job=job_id)
        print(f"   >> screenshots: {', '.join(str(p) for p in paths)}", flush=True)
    except Exception as e:  # no browser here: the demo goes on without pictures
        print(f"   >> no screenshots: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)


def progress(client: Client, train_id: str, array_id: str, t0: float) -> int | None:
    """Print one progress line; returns the training job's world size (None before a step)."""
    job = client.get_job(train_id)
    arr = client.get_job(array_id)
    step = loss = world = "-"
    if job.get("progress"):  # the coordinator's latest metrics, as the service keeps them
        last = job["progress"]
        step, loss, world = last["step"], f"{last['loss']:.3f}", last["world_size"]
    per_env = live_workers(job)  # those told to leave are on their way out: not counted
    slots = {ce["name"]: ce.get("available_slots") for ce in client.list_compute_environments()}
    array_info = arr.get("array") or {}
    done = (array_info.get("status_counts") or {}).get("SUCCEEDED", 0)
    print(f"[{time.time() - t0:5.1f}s] training {job['status']:<9} step {step:>4} world {world} "
          f"loss {loss:>6} workers {per_env or '{}'} preemptions {job['preemptions']} | "
          f"capacity spot={slots.get('spot')} reserved={slots.get('reserved')} | "
          f"array {done}/{array_info.get('size')} done", flush=True)
    return world if isinstance(world, int) else None


def watch(client: Client, train_id: str, array_id: str, url: str, shots_dir: str | None) -> None:
    """Print progress until the training job ends; take the pool back after 45 s; screenshots."""
    t0, taken_back, shots = time.time(), False, None
    previous = low = None  # world sizes: the screenshots wait until the world grew back
    while client.get_job(train_id)["status"] not in ("SUCCEEDED", "FAILED"):
        world = progress(client, train_id, array_id, t0)
        if not taken_back and time.time() - t0 > 45:
            client.update_compute_environment("reserved", desired_slots=0)
            print("   >> the reserved pool takes its 2 slots back for other work", flush=True)
            taken_back = True
        if world is not None and previous is not None and world < previous:
            low = world if low is None else min(low, world)
        previous = world if world is not None else previous
        if shots_dir and shots is None and None not in (world, low) and world > low:
            shots = threading.Thread(target=screenshots, args=(url, shots_dir, train_id))
            shots.start()
        time.sleep(2.0)
    if shots_dir and shots is None:  # the world never grew back: the job as it ended
        screenshots(url, shots_dir, train_id)
    if shots is not None:
        shots.join()
    progress(client, train_id, array_id, t0)
    client.wait(array_id, timeout=120)


def interrupted(client: Client, service: Service, server: uvicorn.Server,
                jobs: list[str]) -> NoReturn:
    """Ctrl-C: terminate the demo's jobs (their workers outlive this process), stop, exit 130."""
    print("\n== interrupted: terminating the demo's jobs and stopping the service", flush=True)
    for job_id in jobs:
        if client.get_job(job_id)["status"] not in ("SUCCEEDED", "FAILED"):
            client.terminate(job_id)
    for job_id in jobs:
        client.wait(job_id, timeout=120)
    server.should_exit = True
    service.stop()
    sys.exit(130)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="runs/service-demo")
    ap.add_argument("--screenshots", metavar="DIR",
                    help="take screenshots of the dashboard into DIR while the job runs "
                         "(needs Playwright and Debian's chromium)")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    print("== starting the embedded service (SQLite, local worker processes)", flush=True)
    service, server, url = start_service(out / "state")
    client = Client(url)
    setup(client)
    print(f"   {url}: compute environments spot (trace), reserved (2 idle slots lent), "
          "ondemand; queues training (priority 10), batch (1)", flush=True)
    print(f"   dashboard: {url}/  (open it now: the job page follows the spot trace live)",
          flush=True)

    train = client.submit(queue="training", name="digits-elastic",
                          command=[sys.executable, *DIGITS, "--step-delay", "0.03",
                                   "--log-every", "50"],  # a progress line in its logs
                          resources=SLOT, workers=(1, 4))
    array = client.submit(queue="batch", name="eval-shards", array_size=4, resources=SLOT,
                          command=[sys.executable, "-c",
                                   "import os, time; time.sleep(2); print('shard', "
                                   "os.environ['AWS_BATCH_JOB_ARRAY_INDEX'], 'done')"])
    print(f"== submitted {train['id'][:8]} (elastic, 1-4 workers) and {array['id'][:8]} "
          "(array of 4)", flush=True)
    try:
        watch(client, train["id"], array["id"], url, args.screenshots)
    except KeyboardInterrupt:
        interrupted(client, service, server, [train["id"], array["id"]])
    job = client.get_job(train["id"])
    cost = client.cost(train["id"])
    run_dir = service.controller.run_dir(train["id"])
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    server.should_exit = True
    service.stop()

    print("\n== static one-worker run of the same job, for comparison", flush=True)
    static = out / "static"
    subprocess.run([sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1",
                    "--quiet", "--out", str(static), *DIGITS], check=True)
    a = torch.load(static / "final.pt", weights_only=True)
    b = torch.load(run_dir / "final.pt", weights_only=True)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a if a[k].is_floating_point())
    acc = json.loads((run_dir / "result.json").read_text())["val_accuracy"]

    print("\n== summary")
    print(f"training job {job['status']}: {len(events)} membership changes "
          f"({', '.join(e['event'] for e in events)}), {job['preemptions']} preemption(s) "
          "(workers whose capacity was taken back, and suspensions), "
          f"{job['attempts']} counted attempt(s)")
    print(f"validation accuracy {acc:.4f}; max |elastic - static| over all parameters = {diff:.3g}"
          f" ({'identical' if diff == 0 else 'within rounding' if diff < 1e-5 else 'DIFFERENT'})")
    base = cost["static_on_demand"]
    by_type = ", ".join(f"{k} {v:.4f}" for k, v in cost["cost_by_capacity_type"].items())
    saving = cost["saving_percent"]
    print(f"cost {cost['total']:.4f} for {cost['worker_seconds']:.0f} worker-seconds ({by_type});"
          f" a static on-demand allocation of {base['workers']} workers: {base['cost']:.4f} "
          f"in {base['wall_seconds']:.0f} s; saving "
          f"{'n/a' if saving is None else f'{saving:.1f}%'}")
    sys.exit(0 if job["status"] == "SUCCEEDED" and diff < 1e-5 else 1)


if __name__ == "__main__":
    main()
