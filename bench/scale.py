"""How the elastic runtime's costs grow with the world: real worker processes at N = 1 ... 64.

For each N, one ``dyntrain run --workers 1:N+1 --nproc N`` of the digits MLP (a tiny model, so
that compute does not drown the control plane; the fork server shares torch's memory between the
workers) with this schedule of injected changes, ``GAP`` steps apart:

1. ``join=1`` (N -> N+1), 2. ``leave=1`` (N+1 -> N), 3. ``kill=1`` (N -> N-1),
4. a wave: ``kill=K`` (N-1 -> N-1-K, K = N/2 from N = 4), 5. a wave: ``join=K`` back (the
   launcher starts those of it that the memory available holds, and says so).

From the run's ``events.jsonl``, for each change: the seconds from its request to the first step
in the new world, and its parts: request -> detected (the coordinator sees it), detected ->
published (its decision), published -> first step (group connect, state hand-over, the step),
and the group connect (the leader's, creating the new process group) and the hand-over alone.
From ``metrics.jsonl``: the steady-state step time (the median gap between consecutive steps of
the longest generation of N or N + 1). Beside it, in the same run, a plain gloo all-reduce of
the same bytes among N processes (``torch.distributed``, no dyntrain).
While the job runs: the launcher's CPU seconds per wall second (it hosts the coordinator and
the store) and each worker's memory (PSS: its share of pages shared with the fork server and the
others).

    .venv/bin/python bench/scale.py                          # N = 1, 2, 4, 8, 16, 32, 64
    .venv/bin/python bench/scale.py --sizes 2,4 --out /tmp/scale.json

Writes ``bench/results/scale.json``; ``make bench-report`` renders ``docs/benchmarks/scale.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from _common import (
    JsonlTail,
    LineReader,
    descendants,
    free_port,
    kill_tree,
    machine_info,
    process_cpu_seconds,
    write_result,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "scale.json"
GAP = 8  # steps between two changes
HIDDEN = 128  # the digits MLP's width (its default)


def schedule(n: int) -> list[tuple[str, str]]:
    """(name, --events action) of each change, in order."""
    wave = n // 2 if n >= 4 else 0
    items = [("join", "join=1"), ("leave", "leave=1")]
    if n >= 2:
        items.append(("kill", "kill=1"))
    if wave:
        items += [(f"kill wave ({wave})", f"kill={wave}"), (f"join wave ({wave})", f"join={wave}")]
    return items


def events_option(items: list[tuple[str, str]], first: int) -> str:
    return ",".join(f"step={first + i * GAP}:{action}" for i, (_, action) in enumerate(items))


def pss_mib(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def parts(record: dict) -> dict:
    def gap(a: str, b: str) -> float | None:
        if record.get(a) is None or record.get(b) is None:
            return None
        return round(record[b] - record[a], 4)
    return {"event": record["event"], "world": [record.get("world_before"),
                                                record.get("world_after")],
            "latency_s": record.get("latency_s"),
            "detect_s": gap("requested_at", "detected_at"),
            "decide_s": gap("detected_at", "reformed_at"),
            "first_step_s": gap("reformed_at", "first_step_at"),
            "connect_s": record.get("group_connect_s"),
            "state_sync_s": record.get("state_sync_s")}


def injected(records: list[dict], n: int) -> list[dict]:
    """The changes after the world first reached ``n`` (the first workers may form a smaller
    world and be joined by the rest as they start: those joins are not the schedule's)."""
    full = next((r["generation"] for r in records if r.get("world_after") == n), None)
    if full is None:
        return []
    return [r for r in records if r.get("event") in ("join", "leave", "crash")
            and r.get("generation", -1) > full]


def steady_gaps(rows: list[dict], n: int) -> list[float]:
    """Seconds between consecutive steps of the longest generation at N or N + 1 workers (its
    first step, which includes the group's forming, left out)."""
    by_gen: dict[int, list[dict]] = {}
    for r in rows:
        if (r.get("world_size") or 0) >= n and r.get("gen") is not None:
            by_gen.setdefault(r["gen"], []).append(r)
    longest = max(by_gen.values(), key=len, default=[])
    return [b["time"] - a["time"] for a, b in zip(longest[1:], longest[2:], strict=False)]


def one_run(n: int, work: Path, timeout: float, global_batch: int) -> dict:
    out = work / f"n{n}"
    items = schedule(n)
    first = 4 * GAP  # the first generation's steps give the steady-state step time
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", f"1:{n + 1}",
           "--nproc", str(n), "--out", str(out), "--quiet", "--no-tensorboard",
           "--events", events_option(items, first), "-m", "dyntrain.workloads.digits",
           "--model", "mlp", "--global-batch", str(global_batch), "--chunk-size", "1",
           "--epochs", "100000", "--log-every", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    reader = LineReader(proc.stdout, echo_to=work / f"n{n}.log")
    seen: set[int] = set()
    pss: list[float] = []
    cpu_first = None
    status = "timeout"
    events = JsonlTail(out / "events.jsonl")
    try:
        while time.monotonic() - t0 < timeout:
            if (out / "events.jsonl").exists():
                events.poll()
            done = [r for r in injected(events.records, n) if r.get("first_step_at") is not None]
            if len(done) >= len(items):  # every change took effect: the run is over
                status = "ok"
                break
            kids = set(descendants(proc.pid))
            seen |= kids
            if cpu_first is None and (out / "metrics.jsonl").exists():
                cpu_first = (time.monotonic(), process_cpu_seconds([proc.pid]))
                pss = [m for pid in kids if (m := pss_mib(pid)) is not None
                       and "dyntrain" in open(f"/proc/{pid}/cmdline").read()]
            if proc.poll() is not None:
                status = f"launcher exited with code {proc.returncode}"
                break
            time.sleep(0.2)
        cpu_last = (time.monotonic(), process_cpu_seconds([proc.pid]))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        kill_tree(proc, extra=seen)
        reader.join()
    wall = time.monotonic() - t0
    if (out / "events.jsonl").exists():
        events.poll()
    metrics = JsonlTail(out / "metrics.jsonl")
    metrics.poll()
    changes = [parts(r) for r in injected(events.records, n)]
    rows = [r for r in metrics.records if "step" in r and r.get("time") is not None]
    gaps = steady_gaps(rows, n)
    coord_cpu = None
    if cpu_first and cpu_last[0] > cpu_first[0]:
        coord_cpu = (cpu_last[1] - cpu_first[1]) / (cpu_last[0] - cpu_first[0])
    print(f"N={n:3d} {status} in {wall:.0f} s: step {statistics.median(gaps) if gaps else 0:.3f} s"
          f", changes " + ", ".join(f"{c['event']} {c['world'][0]}->{c['world'][1]} "
                                   f"{c['latency_s']}" for c in changes), flush=True)
    return {"n": n, "status": status, "wall_s": round(wall, 1),
            "command": " ".join(["dyntrain", *cmd[4:]]).replace(str(out), "RUN"),
            "schedule": [name for name, _ in items], "changes": changes,
            "step_s": statistics.median(gaps) if gaps else None,
            "launcher_cpu_per_wall_s": coord_cpu,
            "worker_pss_mib": statistics.median(pss) if pss else None, "workers_sampled": len(pss)}


def _allreduce_member(rank: int, n: int, port: int, numel: int, reps: int, out) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    buf = torch.ones(numel)
    times = []
    for i in range(reps + 2):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buf)
        if i >= 2:
            times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def plain_allreduce(n: int, numel: int, reps: int = 10) -> float | None:
    """The median seconds of a gloo all-reduce of ``numel`` float32 among ``n`` processes."""
    if n < 2:
        return 0.0
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_allreduce_member, args=(r, n, port, numel, reps, queue))
             for r in range(n)]
    for p in procs:
        p.start()
    try:
        return queue.get(timeout=300)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def growth(points: list[tuple[int, float | None]]) -> float | None:
    """The exponent of a least-squares line through (log N, log value), N >= 2."""
    pts = [(math.log(n), math.log(v)) for n, v in points if n >= 2 and v and v > 0]
    if len(pts) < 3:
        return None
    mx, my = statistics.mean(x for x, _ in pts), statistics.mean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return round(sum((x - mx) * (y - my) for x, y in pts) / sxx, 2) if sxx else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    except ValueError:
        sys.exit("scale: error: --sizes takes worker counts, e.g. 1,2,4,8")
    if not sizes or sizes[0] < 1 or sizes[-1] > 128:
        sys.exit("scale: error: --sizes takes worker counts from 1 to 128")
    numel = 64 * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * 10 + 10
    started = time.monotonic()
    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dyntrain-scale-") as tmp:
        for n in sizes:
            # one chunk per worker at most N+1 workers, and a multiple of every world's
            global_batch = max(8, 2 ** math.ceil(math.log2(n + 1)))
            row = one_run(n, Path(tmp), args.timeout, global_batch)
            row["global_batch"] = global_batch
            row["plain_allreduce_s"] = plain_allreduce(n, numel)
            rows.append(row)
    fits = {}
    for key in ("step_s", "plain_allreduce_s", "launcher_cpu_per_wall_s", "worker_pss_mib"):
        fits[key] = growth([(r["n"], r[key]) for r in rows])
    for kind in ("join", "leave", "crash"):
        fits[f"{kind}_latency_s"] = growth(
            [(r["n"], c["latency_s"]) for r in rows for c in r["changes"][:3]
             if c["event"] == kind])
    write_result(args.out, {
        "machine": machine_info(), "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "command": " ".join(["bench/scale.py", *(argv or sys.argv[1:])]),
        "model_parameters": numel, "gap_steps": GAP, "sizes": rows, "growth_exponents": fits,
        "total_seconds": round(time.monotonic() - started, 1)})


if __name__ == "__main__":
    main()
