"""How fast the job service's store takes submissions, on SQLite and on PostgreSQL.

For each backend, on a fresh database holding one compute environment, one queue and one job
definition (a command with a ``Ref::`` parameter):

* single submits: ``--singles`` calls of ``Store.submit`` one after the other (each one
  transaction: queue and definition lookups, parameter resolution, one job row), then the same
  number spread over ``--threads`` threads, each with its own Store (as several API workers
  would be); jobs/s and per-call latency;
* array submits: ``--reps`` submits of one array job with ``--array-size`` children (one
  transaction, bulk insert); seconds per submit and children/s.

Backends: SQLite (WAL, synchronous=NORMAL, a file in a temp dir) and a throw-away PostgreSQL 15
server (``dyntrain.testing.pgtemp``) both with ``fsync=off`` (its default for tests) and with
``fsync=on`` (durable commits, as a real deployment would run).

    .venv/bin/python bench/submit_throughput.py            # ~1 minute
    .venv/bin/python bench/submit_throughput.py --quick    # ~15 s

Writes a table to stdout and ``bench/results/submit_throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
import sqlalchemy  # noqa: E402

from _common import machine_info  # noqa: E402
from dyntrain.service.core.model import (  # noqa: E402
    ComputeEnvironmentSpec,
    JobDefinitionSpec,
    JobQueueSpec,
)
from dyntrain.service.store import Store  # noqa: E402
from dyntrain.testing.pgtemp import (  # noqa: E402
    PostgresUnavailable,
    create_database,
    start_postgres,
)

RESULTS = Path(__file__).resolve().parent / "results"


def prepare(url: str) -> Store:
    store = Store(url)
    store.create_all()
    store.environments.create_compute_environment(ComputeEnvironmentSpec("ce", max_slots=64))
    store.environments.create_job_queue(JobQueueSpec("q", 1, ("ce",)))
    store.definitions.register_job_definition(JobDefinitionSpec(
        "train", ("python", "train.py", "--seed", "Ref::seed"), parameters=(("seed", "0"),),
        environment=(("MODE", "bench"),)))
    return store


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def bench_singles(store: Store, n: int) -> dict:
    for i in range(20):  # warm the pool and the caches
        store.jobs.submit(queue="q", definition="train", parameters={"seed": i})
    lat = []
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        store.jobs.submit(queue="q", definition="train", parameters={"seed": i})
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    return {"jobs": n, "seconds": wall, "jobs_per_s": n / wall,
            "p50_ms": 1e3 * statistics.median(lat), "p99_ms": 1e3 * pct(lat, 0.99)}


def bench_threads(url: str, n: int, threads: int) -> dict:
    stores = [Store(url) for _ in range(threads)]
    for s in stores:
        s.jobs.submit(queue="q", definition="train")
    lat: list[float] = []
    barrier = threading.Barrier(threads + 1)

    def run(s: Store, count: int) -> None:
        mine = []
        barrier.wait()
        for i in range(count):
            t = time.perf_counter()
            s.jobs.submit(queue="q", definition="train", parameters={"seed": i})
            mine.append(time.perf_counter() - t)
        lat.extend(mine)
    per = n // threads
    pool = [threading.Thread(target=run, args=(s, per)) for s in stores]
    for t in pool:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    for s in stores:
        s.close()
    return {"jobs": per * threads, "threads": threads, "seconds": wall,
            "jobs_per_s": per * threads / wall, "p50_ms": 1e3 * statistics.median(lat),
            "p99_ms": 1e3 * pct(lat, 0.99)}


def bench_arrays(store: Store, size: int, reps: int) -> dict:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        parent = store.jobs.submit(queue="q", definition="train", array_size=size)
        times.append(time.perf_counter() - t)
    assert len(store.jobs.list_jobs(parent=parent.id, limit=size)) == size
    med = statistics.median(times)
    return {"array_size": size, "reps": reps, "seconds": times, "median_s": med,
            "children_per_s": size / med}


def run_backend(label: str, url: str, args) -> dict:
    store = prepare(url)
    try:
        out = {"backend": label, "singles": bench_singles(store, args.singles),
               "threads": bench_threads(url, args.singles, args.threads),
               "array": bench_arrays(store, args.array_size, args.reps)}
    finally:
        store.close()
    print(f"  {label}: done", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--singles", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--array-size", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="--singles 300 --reps 1")
    ap.add_argument("--out", type=Path, default=RESULTS / "submit_throughput.json")
    args = ap.parse_args()
    if args.quick:
        args.singles, args.reps = 300, 1

    machine = machine_info()
    machine["loadavg_before"] = list(os.getloadavg())
    versions = {"sqlalchemy": sqlalchemy.__version__, "psycopg": psycopg.__version__,
                "sqlite": sqlite3.sqlite_version}
    rows = []
    with tempfile.TemporaryDirectory(prefix="dyntrain-bench-") as tmp:
        rows.append(run_backend("sqlite (WAL, synchronous=NORMAL)",
                                f"sqlite:///{tmp}/bench.db", args))
    for fsync in (False, True):
        try:
            server = start_postgres(fsync=fsync)
        except PostgresUnavailable as e:
            print(f"skipping PostgreSQL: {e}", file=sys.stderr)
            break
        try:
            url = create_database(server.url, "bench")
            if "postgres" not in versions:
                engine = sqlalchemy.create_engine(url)
                with engine.connect() as conn:
                    versions["postgres"] = conn.exec_driver_sql("SHOW server_version").scalar()
                engine.dispose()
            rows.append(run_backend(f"postgres (fsync={'on' if fsync else 'off'})", url, args))
        finally:
            server.stop()
    machine["loadavg_after"] = list(os.getloadavg())

    head = (f"{'backend':34} {'single jobs/s':>13} {'p50 ms':>7} {'p99 ms':>7} "
            f"{f'{args.threads} thr jobs/s':>13} {'array s':>8} {'children/s':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        s, t, a = r["singles"], r["threads"], r["array"]
        print(f"{r['backend']:34} {s['jobs_per_s']:13.0f} {s['p50_ms']:7.2f} {s['p99_ms']:7.2f} "
              f"{t['jobs_per_s']:13.0f} {a['median_s']:8.2f} {a['children_per_s']:11.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "submit_throughput", "machine": machine, "versions": versions,
        "command": " ".join([".venv/bin/python", "bench/submit_throughput.py", *sys.argv[1:]]),
        "settings": {"singles": args.singles, "threads": args.threads,
                     "array_size": args.array_size, "reps": args.reps},
        "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
