"""What a service SIGKILL + restart costs a running elastic job: re-attaching vs resuming.

A real ``dyntrain server`` (its own state dir, SQLite) runs an elastic digits job on two workers
(``--step-delay`` keeps steps ~50 ms, checkpoints every 20 steps). While it trains, the server
is SIGKILLed and started again on the same state dir, ``--restarts`` times, each once the job
has made 30 new steps. Two modes, side by side in one run:

* ``reattach`` (the default, ``--reattach-seconds 300``): the workers train on while the service
  is down and re-attach to the restarted service's coordinator;
* ``checkpoint`` (``--reattach-seconds 0``, the behaviour before re-attaching): the workers stop
  with their coordinator and the restarted service resumes the job from its newest checkpoint.

Per restart, from the job's ``metrics.jsonl`` (one row per applied step, with the leader's unix
time) and ``events.jsonl``:

* steps redone: steps whose row appears more than once (applied, thrown away, applied again);
* steps lost in flight: ``steps_redone`` of the ``reattach`` event (0 when the generation went on);
* pause: the longest gap between two consecutive step rows from the kill to 30 steps after it
  (how long the job did not train), beside the service's own downtime (kill -> restarted
  server answers ``/health``);
* checkpoint reloads (``resume`` events).

Each job then runs to the end; its ``final.pt`` is compared with a static one-process run.

    .venv/bin/python bench/service_restart.py               # ~2-4 minutes
    .venv/bin/python bench/service_restart.py --restarts 3

Writes a table and ``bench/results/service_restart.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt, machine_info, maximum, median, read_jsonl, write_result  # noqa: E402
from dyntrain.testing.jobs import pinned_env
from dyntrain.testing.wait import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "service_restart.json"
DIGITS = [sys.executable, "-m", "dyntrain.workloads.digits", "--checkpoint-every", "20"]
MODES = {"reattach": "300", "checkpoint": "0"}


def rows(path: Path) -> list[dict]:
    return read_jsonl(path)


class Server:
    """A ``dyntrain server`` process on a state dir; ``kill()`` is SIGKILL."""

    def __init__(self, state: Path, reattach: str, n: int) -> None:
        self.log = state.parent / f"server-{state.name}-{n}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dyntrain.cli.main", "server", "--port", "0",
                 "--state-dir", str(state), "--reattach-seconds", reattach], stdout=out,
                stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = wait_until(self._up, "the server to answer", 120, 0.05, 0.05)

    def _up(self) -> str | None:
        m = re.search(r"listening on (http://\S+)", self.log.read_text())
        if m is None:
            return None
        try:
            return m.group(1) if httpx.get(m.group(1) + "/health", timeout=2).is_success else None
        except httpx.HTTPError:
            return None

    def job(self, job_id: str) -> dict:
        return httpx.get(f"{self.url}/jobs/{job_id}", timeout=10).json()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()


def run_mode(mode: str, tmp: Path, args) -> dict:
    state = tmp / mode
    n = 0
    server = Server(state, MODES[mode], n)
    command = DIGITS + ["--epochs", str(args.epochs), "--step-delay", str(args.step_delay)]
    job = httpx.post(f"{server.url}/jobs", timeout=10, json={
        "queue": "default", "command": command, "workers": {"min": 2, "max": 2},
        "resources": {"cpus": 0.5, "memory_mib": 256}}).json()
    run = state / "runs" / "jobs" / job["id"]
    metrics = run / "metrics.jsonl"
    restarts = []
    try:
        for _ in range(args.restarts):
            before = max((r["step"] for r in rows(metrics)), default=0)
            wait_until(lambda b=before: max((r["step"] for r in rows(metrics)), default=0) >=
                       b + 30, "30 more steps", 180, 0.05, 0.05)
            killed_at = time.time()
            server.kill()
            n += 1
            server = Server(state, MODES[mode], n)
            back_at = time.time()
            step_at_kill = max(r["step"] for r in rows(metrics) if r["time"] <= killed_at)
            wait_until(lambda s=step_at_kill: max(r["step"] for r in rows(metrics)) >= s + 30,
                       "the job to make 30 steps after the restart", 180, 0.05, 0.05)
            after = [r for r in rows(metrics) if r["time"] > killed_at - 1]
            times = sorted(r["time"] for r in after)
            gaps = [b - a for a, b in zip(times[:-1], times[1:], strict=True)]
            restarts.append({"step_at_kill": step_at_kill,
                             "service_down_s": back_at - killed_at, "pause_s": max(gaps)})
        final = wait_until(lambda: server.job(job["id"]), "the job to end", 600, 0.05, 0.05,
                           until=lambda j: j["status"] in ("SUCCEEDED", "FAILED"))
    finally:
        server.stop()
    steps = [r["step"] for r in rows(metrics)]
    events = rows(run / "events.jsonl")
    reattaches = [e for e in events if e["event"] == "reattach"]
    return {
        "status": final["status"], "attempts": final["attempts"],
        "preemptions": final["preemptions"], "restarts": restarts,
        "steps_redone": len(steps) - len(set(steps)),
        "steps_never_reported": sorted(set(range(1, max(steps) + 1)) - set(steps)),
        "reattach_steps_redone": [e["steps_redone"] for e in reattaches],
        "reattach_origins": [e.get("origin") for e in reattaches],
        "checkpoint_resumes": sum(e["event"] == "resume" for e in events),
        "final": str(run / "final.pt"),
    }


def bitwise_equal(a: str | Path, b: str | Path) -> bool:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--restarts", type=int, default=2, help="SIGKILL + restart per job")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--step-delay", type=float, default=0.01)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    started = time.time()
    machine = machine_info()
    machine["loadavg_before"] = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="svc-restart-") as tmp_name:
        tmp = Path(tmp_name)
        static = subprocess.run(DIGITS + ["--epochs", str(args.epochs)], cwd=ROOT,
                                env=pinned_env(DYNTRAIN_OUT=str(tmp / "static")),
                                capture_output=True, text=True)
        if static.returncode:
            raise SystemExit(f"the static run failed: {static.stderr[-2000:]}")
        results = {}
        for mode in MODES:
            results[mode] = run_mode(mode, tmp, args)
            results[mode]["bitwise_equal_to_static"] = bitwise_equal(
                results[mode].pop("final"), tmp / "static" / "final.pt")
            print(f"{mode}: {json.dumps(results[mode])}", flush=True)
    machine["loadavg_after"] = list(os.getloadavg())

    lines = [f"Service SIGKILL + restart under a running elastic digits job (2 workers, "
             f"{args.restarts} restarts per mode; medians, max in brackets)",
             f"{'':34s} {'reattach (default)':>22s} {'checkpoint (before)':>22s}"]

    def row(label: str, cell) -> None:
        lines.append(f"{label:34s} {cell(results['reattach']):>22s} "
                     f"{cell(results['checkpoint']):>22s}")

    def stat(key: str):
        return lambda r: (f"{fmt(median([x[key] for x in r['restarts']]), 2)} "
                          f"[{fmt(maximum([x[key] for x in r['restarts']]), 2)}]")

    row("service down (kill -> /health) s", stat("service_down_s"))
    row("job paused (longest step gap) s", stat("pause_s"))
    row("steps redone, per restart", lambda r: fmt(r["steps_redone"] / args.restarts, 1))
    row("steps lost in flight (events)", lambda r: str(r["reattach_steps_redone"] or "-"))
    row("checkpoint reloads", lambda r: str(r["checkpoint_resumes"]))
    row("attempts / preemptions", lambda r: f"{r['attempts']} / {r['preemptions']}")
    row("final.pt bitwise = static", lambda r: str(r["bitwise_equal_to_static"]))
    row("status", lambda r: r["status"])
    table = "\n".join(lines)
    print(table)
    write_result(args.out, {
        "benchmark": "service_restart",
        "command": " ".join([".venv/bin/python", "bench/service_restart.py", *sys.argv[1:]]),
        "machine": machine, "config": vars(args) | {"out": str(args.out)},
        "results": results, "table": table, "total_seconds": time.time() - started})
    return 0


if __name__ == "__main__":
    sys.exit(main())
