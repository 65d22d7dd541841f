"""Takeover time of service replicas: the leader SIGKILLed at a random moment, another leads.

Two `dyntrain server --replica` processes on one throw-away PostgreSQL database and one state
directory (the default lease: ttl 5 s, renewed every second). One trial: wait until a replica
leads, wait a random time (seeded: uniform in [0, 2) s, so the kill falls anywhere in the
renewal period), SIGKILL the leader, submit a short job to the survivor at once, and measure

* **lease**: from the SIGKILL until the survivor's ``GET /health`` says it leads;
* **first start**: from the SIGKILL until the job submitted meanwhile has started (its command
  ran, a marker file says so): the takeover as a user sees it.

The killed replica is started again (a standby) before the next trial.

    .venv/bin/python bench/takeover.py                     # 20 trials
    .venv/bin/python bench/takeover.py --trials 3

Writes a table and ``bench/results/takeover.json``; ``bench/report.py`` renders it into
``docs/benchmarks/takeover.md``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402

from _common import machine_info, start_dyntrain_server, write_result  # noqa: E402
from dyntrain.service.client import Client  # noqa: E402
from dyntrain.testing.pgtemp import create_database, start_postgres  # noqa: E402
from dyntrain.testing.wait import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SLOT = {"cpus": 0.25, "gpus": 0, "memory_mib": 64}


def leads(url: str) -> bool:
    try:
        return bool(httpx.get(f"{url}/health", timeout=1).json().get("leader"))
    except httpx.HTTPError:
        return False


class Pair:
    """Two replicas on ``db`` sharing ``tmp/state``; either may be killed and started again."""

    def __init__(self, tmp: Path, db: str, extra: list[str]) -> None:
        self.tmp, self.db, self.extra = tmp, db, extra
        self.procs, self.urls = [None, None], ["", ""]
        for i in (0, 1):
            self.start(i)

    def start(self, i: int) -> None:
        self.procs[i], self.urls[i] = start_dyntrain_server(
            self.tmp / "state", self.tmp / f"replica-{i}.log", "--replica", "--db", self.db,
            "--warm-workers", "0", *self.extra)

    def leader(self) -> int:
        return wait_until(lambda: next((i for i in (0, 1) if leads(self.urls[i])), None),
                          "a replica to lead", 60, 0.05, until=lambda i: i is not None)

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)


def trial(pair: Pair, rng: random.Random, marks: Path, n: int) -> dict:
    lead = pair.leader()
    other = 1 - lead
    time.sleep(rng.uniform(0.0, 2.0))  # anywhere in the renewal period
    pair.procs[lead].kill()
    killed = time.monotonic()
    mark = marks / f"{n}.txt"
    with Client(pair.urls[other], timeout=30) as client:
        client.submit(queue="q", resources=SLOT,
                      command=["/bin/sh", "-c", f"echo start >> {mark}"])
    wait_until(lambda: leads(pair.urls[other]), "the survivor to lead", 60, 0.02, 0.02)
    lease = time.monotonic() - killed
    wait_until(mark.exists, "the job submitted meanwhile to start", 60, 0.02, 0.02)
    first = time.monotonic() - killed
    pair.procs[lead].wait()
    pair.start(lead)  # a standby again
    return {"trial": n, "lease_s": round(lease, 3), "first_start_s": round(first, 3)}


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"min": ordered[0], "median": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max": ordered[-1], "mean": round(statistics.fmean(ordered), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lease-ttl-seconds", type=float, default=5.0)
    ap.add_argument("--lease-renew-seconds", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "takeover.json")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    load_before = list(os.getloadavg())
    started = time.monotonic()
    pg = start_postgres()
    extra = ["--lease-ttl-seconds", str(args.lease_ttl_seconds),
             "--lease-renew-seconds", str(args.lease_renew_seconds)]
    trials = []
    with tempfile.TemporaryDirectory(prefix="takeover-") as tmp_name:
        tmp = Path(tmp_name)
        marks = tmp / "marks"
        marks.mkdir()
        pair = Pair(tmp, create_database(pg.url, "takeover"), extra)
        try:
            with Client(pair.urls[0], timeout=30) as client:
                client.create_compute_environment(name="ce", slot=SLOT, min_slots=0,
                                                  desired_slots=4, max_slots=4)
                client.create_job_queue(name="q", compute_environments=["ce"])
            for n in range(args.trials):
                t = trial(pair, rng, marks, n)
                trials.append(t)
                print(f"trial {n + 1}: lease {t['lease_s']:.2f} s, first start "
                      f"{t['first_start_s']:.2f} s", flush=True)
        finally:
            pair.stop()
            pg.stop()
    lease = summary([t["lease_s"] for t in trials])
    first = summary([t["first_start_s"] for t in trials])
    lines = [f"{args.trials} trials, seed {args.seed}: the leader of two replicas SIGKILLed "
             f"(ttl {args.lease_ttl_seconds:g} s, renewed every {args.lease_renew_seconds:g} s)",
             f"{'seconds from the SIGKILL':34s} {'min':>6s} {'median':>6s} {'p90':>6s} "
             f"{'max':>6s} {'mean':>6s}", "-" * 70]
    for label, s in (("until another replica leads", lease),
                     ("until a job submitted then starts", first)):
        lines.append(f"{label:34s} " + " ".join(f"{s[k]:6.2f}" for k in
                                                   ("min", "median", "p90", "max", "mean")))
    text = "\n".join(lines)
    print(text)
    write_result(args.out, {
        "benchmark": "takeover",
        "command": " ".join([".venv/bin/python", "bench/takeover.py", *sys.argv[1:]]),
        "machine": machine_info(), "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()), "config": vars(args) | {"out": str(args.out)},
        "trials": trials, "lease": lease, "first_start": first, "table": text,
        "total_seconds": time.monotonic() - started})
    return 0


if __name__ == "__main__":
    sys.exit(main())
