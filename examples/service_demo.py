"""`make demo`: the whole product on the embedded service (2-4 minutes on 2 cores).

1. Starts the embedded job service (SQLite, local processes) on 127.0.0.1.
2. Creates a SPOT compute environment that replays a capacity trace (examples/traces), a RESERVED
   pool whose idle slots are lent to training and later taken back, and an ON_DEMAND one; a
   high-priority `training` queue over spot -> reserved -> on-demand (a job spills to the next
   when the one before is full), and a `batch` queue over on-demand.
3. Submits an elastic training job (the digits workload, 1 to 4 workers) and a small array job.
4. Shows live progress: jobs, workers per environment, preemptions, training step and loss;
   the service's web dashboard (its URL is printed) shows the same, with charts, as it happens.
   After 45 s the reserved pool takes its slots back; at 60 s the spot trace reclaims three
   slots and the job spills onto on-demand; spot capacity returns at 88-92 s.
5. Ends with a summary: accuracy, equivalence to a static one-worker run, and the cost per
   capacity type against a static on-demand allocation of the job's max workers. The service
   (and its dashboard) then stays up until Ctrl-C (--no-keep-serving: the demo ends there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import torch
import uvicorn

from dyntrain.elastic.runs.log import read_events
from dyntrain.errors import DyntrainError
from dyntrain.outdir import make_out_dir
from dyntrain.service.assembly import build_service
from dyntrain.service.client import Client
from dyntrain.service.core.jobtext import live_workers
from dyntrain.service.engine.service import Service, ServiceConfig
from dyntrain.service.server import create_app

HERE = Path(__file__).resolve().parent
SLOT = {"cpus": 0.25, "gpus": 0, "memory_mib": 512}


def digits(epochs: int) -> list[str]:
    """The training job's command line after `python` (and the static run's)."""
    return ["-m", "dyntrain.workloads.digits", "--epochs", str(epochs), "--global-batch", "64",
            "--chunk-size", "8", "--noise-scale"]  # B_simple: the dashboard charts it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(state: Path) -> tuple[Service, uvicorn.Server, str]:
    port = free_port()
    service = build_service(ServiceConfig(state_dir=state, port=port, grace_seconds=30))
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
                                      desired_slots=2, max_slots=4)
    client.create_job_queue(name="training", priority=10,
                            compute_environments=["spot", "reserved", "ondemand"])
    client.create_job_queue(name="batch", priority=1, compute_environments=["ondemand"])


def submit_training(client: Client, epochs: int) -> dict:
    """The elastic digits job, 1 to 4 workers, on the training queue."""
    return client.submit(queue="training", name="digits-elastic",
                         command=[sys.executable, *digits(epochs), "--step-delay", "0.03",
                                  "--log-every", "50"],  # a progress line in its logs
                         resources=SLOT, workers=(1, 4))


def cost_line(cost: dict) -> str:
    """The summary's cost: per capacity type (and its worker-seconds), against a static
    on-demand allocation of the job's max workers."""
    seconds = cost["worker_seconds_by_capacity_type"]
    by_type = ", ".join(f"{kind} {value:.4f} ({seconds.get(kind, 0):.0f} worker-s)"
                        for kind, value in cost["cost_by_capacity_type"].items())
    base, saving = cost["static_on_demand"], cost["saving_percent"]
    return (f"cost {cost['total']:.4f} for {cost['worker_seconds']:.0f} worker-seconds "
            f"({by_type}); a static on-demand allocation of {base['workers']} workers: "
            f"{base['cost']:.4f} in {base['wall_seconds']:.0f} s; saving "
            f"{'n/a' if saving is None else f'{saving:.1f}%'}")


def screenshots(url: str, out: str, job_id: str) -> None:
    """The dashboard's main pages as PNGs (docs/screenshots/ comes from here), or why not."""
    from dyntrain.testing.screenshots import take

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
          f"capacity spot={slots.get('spot')} reserved={slots.get('reserved')} "
          f"ondemand={slots.get('ondemand')} | "
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


def compare_with_static(out: Path, run_dir: Path, epochs: int) -> float:
    """Train the same job statically on one worker; the max |elastic - static| parameter."""
    static = out / "static"
    subprocess.run([sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1",
                    "--quiet", "--out", str(static), *digits(epochs)], check=True)
    a = torch.load(static / "final.pt", weights_only=True)
    b = torch.load(run_dir / "final.pt", weights_only=True)
    return max(float((a[k] - b[k]).abs().max()) for k in a if a[k].is_floating_point())


def serve_until_interrupted(url: str, job_id: str) -> None:
    """Keep the service and its dashboard up until Ctrl-C (or SIGTERM)."""
    print(f"\n== the service stays up: dashboard {url}/ (the training job: {url}/ui/jobs/"
          f"{job_id}); Ctrl-C stops it", flush=True)
    # The handlers only note the signal: an exception raised into a wait on a lock (Ctrl-C as
    # KeyboardInterrupt) can leave that lock half released ("release unlocked lock").
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    while not stop:
        time.sleep(0.5)  # a signal ends the sleep at once; its handler has run
    print("\n== stopping the service", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/service-demo")
    ap.add_argument("--epochs", type=int, default=30,
                    help="the training job's epochs (22 steps each) [30]")
    ap.add_argument("--keep-serving", action=argparse.BooleanOptionalAction, default=True,
                    help="after the summary, keep the service and its dashboard up until "
                         "Ctrl-C [on]")
    ap.add_argument("--screenshots", metavar="DIR",
                    help="take screenshots of the dashboard into DIR while the job runs "
                         "(needs Playwright and Debian's chromium)")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    try:
        make_out_dir(out, "--out")
    except DyntrainError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    print("== starting the embedded service (SQLite, local worker processes)", flush=True)
    service, server, url = start_service(out / "state")
    client = Client(url)
    setup(client)
    print(f"   {url}: compute environments spot (trace), reserved (2 idle slots lent), "
          "ondemand (2 slots); queues training (priority 10: spot -> reserved -> ondemand), "
          "batch (1: ondemand)", flush=True)
    print(f"   dashboard: {url}/  (open it now: the job page follows the spot trace live)",
          flush=True)

    train = submit_training(client, args.epochs)
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
    events = read_events(run_dir)
    try:
        print("\n== static one-worker run of the same job, for comparison", flush=True)
        diff = compare_with_static(out, run_dir, args.epochs)
        acc = json.loads((run_dir / "result.json").read_text())["val_accuracy"]
        print("\n== summary")
        print(f"training job {job['status']}: {len(events)} membership changes "
              f"({', '.join(e.kind for e in events)}), {job['preemptions']} preemption(s) "
              "(workers whose capacity was taken back, and suspensions), "
              f"{job['attempts']} counted attempt(s)")
        verdict = "identical" if diff == 0 else "within rounding" if diff < 1e-5 else "DIFFERENT"
        print(f"validation accuracy {acc:.4f}; max |elastic - static| over all parameters = "
              f"{diff:.3g} ({verdict})")
        print(cost_line(cost), flush=True)
        if args.keep_serving:
            serve_until_interrupted(url, train["id"])
    except KeyboardInterrupt:
        print("\n== interrupted: stopping the service", flush=True)
        diff = None
    finally:
        server.should_exit = True
        service.stop()
    if diff is None:
        sys.exit(130)
    sys.exit(0 if job["status"] == "SUCCEEDED" and diff < 1e-5 else 1)


if __name__ == "__main__":
    main()
