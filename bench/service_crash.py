"""Exactly once across service crashes: short jobs, a `dyntrain server` SIGKILLed while they run.

One trial: a real `dyntrain server` on a fresh state directory, one ON_DEMAND environment of
``--slots`` slots of 0.25 cpus, ``--jobs`` plain jobs, each a shell command that appends "start"
to its own marker file, sleeps ``--job-seconds`` and appends "end". While jobs run, the server is
SIGKILLed ``--kills`` times; each time the driver waits until a job that was running has
finished while no service ran (its "end" is written), then starts the server again on the same
state directory. At the end every job must be SUCCEEDED and its marker must say "start" once:
a job whose command started twice ran twice.

    .venv/bin/python bench/service_crash.py                  # 5 trials of 200 jobs, 2 kills
    .venv/bin/python bench/service_crash.py --trials 1 --jobs 50

Writes a table and ``bench/results/service_crash.json``. ``run_trial`` is also what the test
suite's crash test runs (tests/service/test_crash.py), smaller.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_dyntrain_server as start_server  # noqa: E402
from dyntrain.testing.wait import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SLOT = {"cpus": 0.25, "gpus": 0, "memory_mib": 64}


def run_trial(tmp: Path, jobs: int = 200, slots: int = 6, kills: int = 2,
              job_seconds: float = 0.3, timeout: float = 300.0) -> dict:
    """One trial (see the module docstring); returns what happened, jobs run twice included."""
    from dyntrain.service.client import Client

    state, log, marks = tmp / "state", tmp / "server.log", tmp / "marks"
    marks.mkdir(parents=True)
    t0 = time.monotonic()
    server, url = start_server(state, log)
    phases = {"first_start": time.monotonic() - t0, "restarts": []}
    downtime_finished = 0
    try:
        with Client(url, timeout=60) as c:
            c.create_compute_environment(name="crash", slot=SLOT, min_slots=0,
                                         desired_slots=slots, max_slots=slots)
            c.create_job_queue(name="q", compute_environments=["crash"])
            ids = {}
            for i in range(jobs):
                mark = marks / f"{i}.txt"
                ids[i] = c.submit(queue="q", resources=SLOT, command=[
                    "/bin/sh", "-c", f"echo start >> {mark}; sleep {job_seconds}; "
                                     f"echo end >> {mark}"])["id"]
        for k in range(kills):
            # kill while jobs run, at evenly spread points of the run
            target = (k + 1) * jobs // (kills + 1)
            wait_until(lambda t=target: sum(1 for i in ids if _ended(marks, i)) >= t,
                       "jobs to finish before a kill", timeout, 0.05, 0.05)
            # kill while a job's command runs (its marker says start, not yet end)
            wait_until(lambda: _in_progress(marks, ids), "a job to be running", timeout, 0.05,
                       0.05)
            server.send_signal(signal.SIGKILL)
            server.wait()
            pending = _in_progress(marks, ids)
            # the jobs that ran when the service died finish while it is down
            wait_until(lambda p=pending: all(_ended(marks, i) for i in p),
                       "the running jobs to finish while the service is down", timeout, 0.05,
                       0.05)
            downtime_finished += len(pending)
            t0 = time.monotonic()
            server, url = start_server(state, log)
            phases["restarts"].append(time.monotonic() - t0)
        with Client(url, timeout=60) as c:
            final = wait_until(lambda: [c.get_job(v) for v in ids.values()], "every job to end",
                               timeout, 0.5, 0.5, until=lambda js: all(
                                   j["status"] in ("SUCCEEDED", "FAILED") for j in js))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    starts = {i: (marks / f"{i}.txt").read_text().count("start") for i in ids}
    return {
        "jobs": jobs, "kills": kills,
        "succeeded": sum(1 for j in final if j["status"] == "SUCCEEDED"),
        "not_succeeded": [(j["id"], j["status"], j["status_reason"]) for j in final
                          if j["status"] != "SUCCEEDED"],
        "ran_twice": sum(1 for n in starts.values() if n > 1),
        "never_ran": sum(1 for n in starts.values() if n == 0),
        "finished_while_down": downtime_finished,
        "attempts_over_1": sum(1 for j in final if j["attempts"] > 1),
        "preemptions": sum(j["preemptions"] for j in final),
        "recovered_notes": log.read_text().count("recovered:"),
        "server_start_s": phases,
    }


def _in_progress(marks: Path, ids) -> list[int]:
    out = []
    for i in ids:
        path = marks / f"{i}.txt"
        if path.exists():
            text = path.read_text()
            if "start" in text and "end" not in text:
                out.append(i)
    return out


def _ended(marks: Path, i: int) -> bool:
    path = marks / f"{i}.txt"
    return path.exists() and "end" in path.read_text()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--slots", type=int, default=6)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--job-seconds", type=float, default=0.3)
    ap.add_argument("--out", type=Path, default=RESULTS / "service_crash.json")
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    trials = []
    for n in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="service-crash-") as tmp:
            t = time.time()
            r = run_trial(Path(tmp), args.jobs, args.slots, args.kills, args.job_seconds)
            r["seconds"] = time.time() - t
        trials.append(r)
        print(f"trial {n + 1}: {r['succeeded']}/{r['jobs']} SUCCEEDED, ran twice "
              f"{r['ran_twice']}, finished while down {r['finished_while_down']}, "
              f"{r['seconds']:.0f} s", flush=True)
    lines = [f"{args.trials} trials: {args.jobs} jobs of `sh -c 'echo start; sleep "
             f"{args.job_seconds:g}; echo end'`, {args.slots} slots, the server SIGKILLed "
             f"{args.kills} times per trial",
             f"{'measure':48s} {'total':>8s}", "-" * 57]
    for key, label in (("ran_twice", "jobs run twice"),
                       ("never_ran", "jobs never run"),
                       ("succeeded", "jobs SUCCEEDED"),
                       ("finished_while_down", "jobs that finished while the server was down"),
                       ("attempts_over_1", "jobs with more than one counted attempt"),
                       ("preemptions", "preemptions (attempts re-queued: never started)")):
        lines.append(f"{label:48s} {sum(t[key] for t in trials):>8d}")
    lines.append(f"{'jobs in all':48s} {args.jobs * args.trials:>8d}")
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "service_crash",
        "command": " ".join([".venv/bin/python", "bench/service_crash.py", *sys.argv[1:]]),
        "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
        "config": vars(args) | {"out": str(args.out)}, "trials": trials, "table": text},
        indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(t["ran_twice"] == 0 and t["succeeded"] == t["jobs"] for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
