"""A 10,000-child array job through a real `dyntrain server`: API latency, cancel, terminate,
and children per second.

One `dyntrain server` process (SQLite state in a temp dir, the local executor: 2 cpus), driven
over HTTP as a user would, with one ON_DEMAND compute environment of ``--slots`` (8) slots of
0.25 cpus and one queue. Each child runs ``/bin/true``. Four phases:

1. queued: the environment has 0 slots; an array of ``--children`` is submitted (the submit
   itself is timed) and, once the service has taken it in (the parent is RUNNABLE), ``--requests``
   (200) rounds of six requests are timed: health, list 100 jobs, describe the parent, describe
   a child, read a child's log, submit a one-job command. p50/p99/max per kind and overall.
2. cancel: ``cancel`` of the whole queued array: time to the answer, and until every child is
   FAILED.
3. terminate: a second array with the slots on, once children run: ``terminate``: time to the
   answer, and until every child has ended.
4. throughput: a third array with the slots on: submit -> the parent SUCCEEDED; children/s
   overall and from 10% to 90% finished; the same request mix timed in a background thread
   while it runs.

    .venv/bin/python bench/array_10k.py                 # 10,000 children
    .venv/bin/python bench/array_10k.py --quick         # 1,000

Writes a table to stdout and ``bench/results/array_10k.json`` (``array_10k_<N>.json`` for other
sizes). The machine is shared: the load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt, machine_info  # noqa: E402
from _common import start_dyntrain_server as start_server  # noqa: E402
from dyntrain.service.client import Client  # noqa: E402
from dyntrain.testing.wait import wait_until  # noqa: E402

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
SLOT = {"cpus": 0.25, "gpus": 0, "memory_mib": 256}
TRUE = ["/bin/true"]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summary(ms: list[float]) -> dict:
    return {"n": len(ms), "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99),
            "max_ms": max(ms) if ms else None}


class Mix:
    """The request mix a user's tools send, timed per kind."""

    def __init__(self, client: Client, queue: str | None, parent: str, size: int) -> None:
        """``queue``: where the mix submits its one-job commands (None: it submits none)."""
        self.client, self.queue, self.parent, self.size = client, queue, parent, size
        self.ms: dict[str, list[float]] = {}
        self.i = 0

    def round(self) -> None:
        self.i += 1
        child = f"{self.parent}:{(self.i * 7919) % self.size}"
        calls = {"health": lambda: self.client.health(),
                 "list": lambda: self.client.list_jobs(limit=100),
                 "parent": lambda: self.client.get_job(self.parent),
                 "child": lambda: self.client.get_job(child),
                 "logs": lambda: self.client.logs(child),
                 "submit": lambda: self.client.submit(queue=self.queue, command=TRUE,
                                                      resources=SLOT)}
        if self.queue is None:
            del calls["submit"]
        for kind, call in calls.items():
            t = time.perf_counter()
            call()
            self.ms.setdefault(kind, []).append((time.perf_counter() - t) * 1000)

    def result(self) -> dict:
        out = {k: summary(v) for k, v in self.ms.items()}
        out["all"] = summary([x for v in self.ms.values() for x in v])
        return out


def counts(client: Client, parent: str) -> dict[str, int]:
    return client.get_job(parent)["array"]["status_counts"]


def run(args) -> dict:
    n = args.children
    r: dict = {"children": n}
    with tempfile.TemporaryDirectory(prefix="array-10k-") as tmp_s:
        tmp = Path(tmp_s)
        server, url = start_server(tmp / "state", tmp / "server.log")
        try:
            with Client(url, timeout=120) as c:
                c.create_compute_environment(name="bench", slot=SLOT, min_slots=0,
                                             desired_slots=0, max_slots=args.slots)
                c.create_job_queue(name="q", compute_environments=["bench"])

                # 1. queued
                t = time.perf_counter()
                a = c.submit(queue="q", command=TRUE, resources=SLOT, array_size=n)
                r["submit_s"] = time.perf_counter() - t
                t = time.perf_counter()
                wait_until(lambda: c.get_job(a["id"])["status"] == "RUNNABLE",
                           "the array to be queued", 300, 0.05, 0.05)
                r["submit_to_all_queued_s"] = time.perf_counter() - t
                mix = Mix(c, "q", a["id"], n)
                for _ in range(args.requests):
                    mix.round()
                r["queued_api_ms"] = mix.result()
                print(f"queued: API p99 {r['queued_api_ms']['all']['p99_ms']:.1f} ms", flush=True)

                # 2. cancel
                t = time.perf_counter()
                c.cancel(a["id"])
                r["cancel_answer_s"] = time.perf_counter() - t
                wait_until(lambda: counts(c, a["id"])["FAILED"] == n, "the children cancelled",
                           300, 0.05, 0.05)
                r["cancel_all_children_s"] = time.perf_counter() - t
                for job in c.list_jobs(queue="q", status="RUNNABLE", limit=1000):
                    c.cancel(job["id"])  # the mix's one-job submits

                # 3. terminate while children run
                c.update_compute_environment("bench", desired_slots=args.slots)
                b = c.submit(queue="q", command=["/bin/sleep", "30"], resources=SLOT,
                             array_size=n)
                wait_until(lambda: counts(c, b["id"])["RUNNING"] >= 1, "children to run", 300,
                           0.05, 0.05)
                t = time.perf_counter()
                c.terminate(b["id"])
                r["terminate_answer_s"] = time.perf_counter() - t
                wait_until(lambda: sum(counts(c, b["id"])[s] for s in ("SUCCEEDED", "FAILED")) == n,
                           "the children terminated", 300, 0.05, 0.05)
                r["terminate_all_children_s"] = time.perf_counter() - t
                print(f"cancel {r['cancel_answer_s']:.3f} s, terminate "
                      f"{r['terminate_answer_s']:.3f} s", flush=True)

                # 4. throughput, with the request mix running beside it
                t0 = time.time()
                d = c.submit(queue="q", command=TRUE, resources=SLOT, array_size=n)
                busy = Mix(Client(url, timeout=120), None, d["id"], n)
                stop = threading.Event()

                def sample() -> None:
                    while not stop.is_set():
                        busy.round()
                        stop.wait(0.05)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                progress = [(t0, 0)]
                while True:
                    done = counts(c, d["id"])
                    finished = done["SUCCEEDED"] + done["FAILED"]
                    progress.append((time.time(), finished))
                    if finished == n:
                        break
                    if time.time() - t0 > args.timeout:
                        raise SystemExit(f"throughput phase timed out at {finished}/{n}")
                    time.sleep(0.5)
                stop.set()
                sampler.join()
                busy.client.close()
                elapsed = time.time() - t0
                final = c.get_job(d["id"])
                r["throughput"] = {
                    "parent_status": final["status"], "succeeded": done["SUCCEEDED"],
                    "submit_to_all_finished_s": elapsed, "children_per_s": n / elapsed,
                    "children_per_s_10_to_90": _middle_rate(progress, n)}
                r["running_api_ms"] = busy.result()
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
    return r


def _middle_rate(progress: list[tuple[float, int]], n: int) -> float | None:
    lo = next((p for p in progress if p[1] >= 0.1 * n), None)
    hi = next((p for p in progress if p[1] >= 0.9 * n), None)
    return (hi[1] - lo[1]) / (hi[0] - lo[0]) if lo and hi and hi[0] > lo[0] else None


def table(r: dict, args) -> str:
    n = r["children"]
    lines = [f"Array job of {n} children of /bin/true through a real `dyntrain server` "
             f"({args.slots} slots of 0.25 cpus, local executor); shared 2-core machine",
             f"{'measure':58s} {'value':>12s}", "-" * 71]

    def row(label, value, digits=3, unit=""):
        lines.append(f"{label:58s} {fmt(value, digits) + unit:>12s}")

    row("submit (one request: parent + children)", r["submit_s"], unit=" s")
    row("submit -> every child queued (RUNNABLE)", r["submit_to_all_queued_s"], unit=" s")
    for phase in ("queued", "running"):
        api = r[f"{phase}_api_ms"]
        row(f"API while {phase}: p50 / all requests ({api['all']['n']})",
            api["all"]["p50_ms"], 1, " ms")
        row(f"API while {phase}: p99", api["all"]["p99_ms"], 1, " ms")
        worst = max((k for k in api if k != "all"), key=lambda k: api[k]["p99_ms"] or 0)
        row(f"API while {phase}: worst kind's p99 ({worst})", api[worst]["p99_ms"], 1, " ms")
    row("cancel of the queued array: answer", r["cancel_answer_s"], unit=" s")
    row("cancel: every child FAILED", r["cancel_all_children_s"], unit=" s")
    row("terminate of a running array: answer", r["terminate_answer_s"], unit=" s")
    row("terminate: every child ended", r["terminate_all_children_s"], unit=" s")
    t = r["throughput"]
    row("submit -> all finished (parent " + t["parent_status"] + ")",
        t["submit_to_all_finished_s"], 1, " s")
    row("children/s (overall)", t["children_per_s"], 1)
    row("children/s (10% -> 90% finished)", t["children_per_s_10_to_90"], 1)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--children", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="1,000 children")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200, help="rounds of the request mix")
    ap.add_argument("--timeout", type=float, default=1200.0, help="for the throughput phase")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.children = 1_000
    out = args.out or RESULTS / ("array_10k.json" if args.children == 10_000
                                 else f"array_10k_{args.children}.json")
    machine = machine_info()
    machine["loadavg_before"] = list(os.getloadavg())
    r = run(args)
    machine["loadavg_after"] = list(os.getloadavg())
    text = table(r, args)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "array_10k",
        "command": " ".join([".venv/bin/python", "bench/array_10k.py", *sys.argv[1:]]),
        "machine": machine,
        "config": {"children": args.children, "command": TRUE, "slots": args.slots,
                   "slot": SLOT, "requests": args.requests, "store": "SQLite (server default)"},
        "result": r, "table": text}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    ok = r["throughput"]["parent_status"] == "SUCCEEDED"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
