"""An array job of 10,000 children through the job service: submit -> every child finished.

In one process: a SQLite store in a temp dir, a ``LocalExecutor(cpus=2)`` and a ``Controller``
(``schedule_every=0.05``) driven by this script's own loop (``step()``, then a 20 ms sleep, as a
service's loop would). One ON_DEMAND compute environment of ``--slots`` (8) slots of 0.25 cpus,
one queue, one array job of ``--children`` children (10,000; ``--quick`` 1,000) whose command is
``/bin/true`` (``--command python`` runs ``python -c pass`` instead). Every child is still one
worker process of the executor: ``python wrap.py STATUS -- /bin/true``, so each child costs one
Python interpreter start (the wrapper) plus the command.

Measured (wall clock; a shared 2-core machine, so numbers are noisy: medians are given):

* submit: the ``Store.submit`` call that writes the parent and its children;
* submit -> first child started, -> the parent SUCCEEDED (every child finished); children/s
  overall and in the steady middle (10% -> 90% of the children finished);
* the controller's ``step()``: count, median, p90, max, and where its time goes: the step's parts
  (executor poll, exits, ticks of attempts, dependency resolution, array parents, snapshot,
  the scheduler, applying the plan, deadlines, logs) are timed by wrapping them on the
  controller instance (nothing in the service is changed);
* a cProfile of the loop for ``--profile-seconds`` (10 s) once ``--profile-at`` (30%) of the
  children finished; the top entries are printed. Profiled steps are left out of the step
  statistics (they run slower); the overall rate includes them.

A timeout guard (``--timeout``; 20 minutes for 10,000, scaled down for fewer) stops the run and
reports how far it got.

    .venv/bin/python bench/array_10k.py                    # 10,000 children
    .venv/bin/python bench/array_10k.py --quick            # 1,000
    .venv/bin/python bench/array_10k.py --children 2000

Writes a table to stdout and ``bench/results/array_10k.json`` (``--out`` to change; runs with
another size than 10,000 are written to ``array_10k_<N>.json`` unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt, machine_info  # noqa: E402
from dyntrain.service import controller as controller_module  # noqa: E402
from dyntrain.service.controller import Controller, ControllerConfig  # noqa: E402
from dyntrain.service.executors.local import LocalExecutor  # noqa: E402
from dyntrain.service.model import (  # noqa: E402
    CapacityType,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    JobStatus,
    Resources,
)
from dyntrain.service.store import Store  # noqa: E402

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
SLOT = Resources(0.25, 0, 256)
TICK_S = 0.02
COMMANDS = {"true": ["/bin/true"], "python": [sys.executable, "-c", "pass"]}
PARTS = ["executor.poll", "_on_exit", "_tick_attempt", "_resolve_waiting",
         "_update_array_parents", "snapshot", "schedule", "_apply", "_enforce_deadlines",
         "_pump_logs"]


class PartTimer:
    """Wraps parts of one controller's step on the instance and adds up their wall time."""

    def __init__(self, c: Controller) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.current: dict[str, float] = defaultdict(float)  # this step's
        for name in PARTS:
            if name == "executor.poll":
                c.executor.poll = self._wrap(name, c.executor.poll)
            elif name == "schedule":
                # the controller calls the module-level name; wrap it for this run only
                controller_module.schedule = self._wrap(name, controller_module.schedule)
            else:
                setattr(c, name, self._wrap(name, getattr(c, name)))

    def _wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[name] += time.perf_counter() - t
                self.calls[name] += 1
        return timed

    def take_step(self) -> dict[str, float]:
        out, self.current = dict(self.current), defaultdict(float)
        return out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def profile_text(prof: cProfile.Profile, key: str, n: int) -> str:
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.strip_dirs().sort_stats(key).print_stats(n)
    text = buf.getvalue()
    start = text.find("   ncalls")
    return text[start:] if start >= 0 else text


def run(args) -> dict:
    n = args.children
    result: dict = {"children": n}
    with tempfile.TemporaryDirectory(prefix="array-10k-") as tmp_s:
        tmp = Path(tmp_s)
        store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
        store.create_all()
        store.create_compute_environment(ComputeEnvironmentSpec(
            "local", CapacityType.ON_DEMAND, 1.0, SLOT, 0, args.slots, args.slots))
        store.create_job_queue(JobQueueSpec("q", 1, ("local",)))
        executor = LocalExecutor(tmp / "executor", cpus=2, memory_mib=16_384)
        c = Controller(store, executor, ControllerConfig(tmp / "runs", grace_seconds=30.0,
                                                         schedule_every=0.05))
        parts = PartTimer(c)
        starts: list[float] = []
        real_start = executor.start

        def counting_start(spec):
            handle = real_start(spec)
            starts.append(time.time())
            return handle
        executor.start = counting_start

        t_submit = time.time()
        parent = store.submit(queue="q", command=COMMANDS[args.command], resources=SLOT,
                              array_size=n, job_id="bigarray")
        t_submitted = time.time()
        result["submit_s"] = t_submitted - t_submit
        print(f"submitted {n} children in {result['submit_s']:.3f} s", flush=True)

        step_s: list[float] = []
        step_parts: list[dict[str, float]] = []
        profiled_steps = 0
        progress: list[tuple[float, int]] = [(t_submitted, 0)]
        prof: cProfile.Profile | None = None
        prof_window: tuple[float, float] | None = None
        deadline = time.monotonic() + args.timeout
        last_check = last_print = 0.0
        finished = 0
        status = JobStatus.SUBMITTED
        timed_out = False
        try:
            while True:
                t = time.perf_counter()
                c.step()
                dt = time.perf_counter() - t
                this = parts.take_step()
                if prof is not None:
                    profiled_steps += 1
                else:
                    step_s.append(dt)
                    step_parts.append(this)
                now = time.monotonic()
                if now - last_check >= 0.5:
                    last_check = now
                    status = store.get_job(parent.id).status
                    counts = store.count_jobs_by_status()
                    finished = (counts[JobStatus.SUCCEEDED] + counts[JobStatus.FAILED]
                                - (1 if status.is_terminal() else 0))
                    progress.append((time.time(), finished))
                    if (prof is None and prof_window is None and args.profile_seconds > 0
                            and finished >= args.profile_at * n):
                        prof = cProfile.Profile()
                        prof_window = (time.time(), 0.0)
                        prof.enable()
                    if prof is not None and time.time() - prof_window[0] >= args.profile_seconds:
                        prof.disable()
                        prof_window = (prof_window[0], time.time())
                        result["profile"] = {
                            "window": [prof_window[0] - t_submitted,
                                       prof_window[1] - t_submitted],
                            "steps": profiled_steps,
                            "by_cumulative": profile_text(prof, "cumulative", 30),
                            "by_tottime": profile_text(prof, "tottime", 25)}
                        prof = None
                    if now - last_print >= 10:
                        last_print = now
                        el = time.time() - t_submitted
                        recent = step_s[-200:]
                        print(f"  {el:7.1f} s: {finished:>6d}/{n} finished "
                              f"({finished / el if el else 0:.1f}/s), step median "
                              f"{statistics.median(recent) * 1000 if recent else 0:.1f} ms",
                              flush=True)
                    if status.is_terminal():
                        break
                if now > deadline:
                    timed_out = True
                    break
                time.sleep(TICK_S)
        finally:
            if prof is not None:
                prof.disable()
                result["profile"] = {"window": [prof_window[0] - t_submitted,
                                                time.time() - t_submitted],
                                     "steps": profiled_steps,
                                     "by_cumulative": profile_text(prof, "cumulative", 30),
                                     "by_tottime": profile_text(prof, "tottime", 25)}
            for w in store.list_workers(active=True):
                try:
                    executor.signal(w.id, "KILL")
                except Exception:
                    pass
        t_end = time.time()
        counts = store.count_jobs_by_status()
        final = store.get_job(parent.id)
        children = store.list_jobs(parent=parent.id, limit=n + 1)
        durations = [ch.stopped_at - ch.started_at for ch in children
                     if ch.started_at and ch.stopped_at]
        store.close()

    elapsed = t_end - t_submitted
    result.update({
        "completed": not timed_out and final.status is JobStatus.SUCCEEDED,
        "timed_out": timed_out,
        "parent_status": final.status.value,
        "parent_reason": final.status_reason,
        "children_finished": finished,
        "children_succeeded": sum(1 for ch in children if ch.status is JobStatus.SUCCEEDED),
        "children_failed": sum(1 for ch in children if ch.status is JobStatus.FAILED),
        "status_counts": {s.value: v for s, v in counts.items()},
        "submit_to_first_start_s": (starts[0] - t_submitted) if starts else None,
        "submit_to_all_finished_s": None if timed_out else elapsed,
        "elapsed_s": elapsed,
        "workers_started": len(starts),
        "child_run_s_median": statistics.median(durations) if durations else None,
        "child_run_s_max": max(durations) if durations else None,
    })
    done = result["children_finished"]
    result["children_per_s"] = done / elapsed if elapsed > 0 else None
    lo = next((p for p in progress if p[1] >= 0.1 * n), None)
    hi = next((p for p in progress if p[1] >= 0.9 * n), None)
    result["children_per_s_10_to_90"] = ((hi[1] - lo[1]) / (hi[0] - lo[0])
                                         if lo and hi and hi[0] > lo[0] else None)
    result["progress"] = [(round(t - t_submitted, 3), f) for t, f in progress]
    ms = [x * 1000 for x in step_s]
    result["step_ms"] = {"n": len(ms), "median": statistics.median(ms) if ms else None,
                         "p90": pct(ms, 0.9), "max": max(ms) if ms else None,
                         "first": ms[0] if ms else None, "total_s": sum(step_s),
                         "profiled_steps_left_out": profiled_steps}
    top = sorted(range(len(ms)), key=lambda i: -ms[i])[:5]
    result["slowest_steps"] = [{"index": i, "ms": ms[i],
                                "parts_ms": {k: round(v * 1000, 2)
                                             for k, v in step_parts[i].items()}}
                               for i in top]
    result["parts"] = {}
    for name in PARTS:
        per_step = [sp.get(name, 0.0) * 1000 for sp in step_parts]
        result["parts"][name] = {
            "total_s": sum(per_step) / 1000, "calls_incl_profiled": parts.calls.get(name, 0),
            "median_ms_per_step": statistics.median(per_step) if per_step else None,
            "max_ms_per_step": max(per_step) if per_step else None}
    return result


def table(r: dict, args) -> str:
    n = r["children"]
    lines = [f"Array job of {n} children ({args.command}: {' '.join(COMMANDS[args.command])}, "
             f"each via the executor's Python wrapper), {args.slots} slots of 0.25 cpus, "
             "executor cpus=2; shared 2-core machine: noisy",
             f"{'measure':52s} {'value':>12s}", "-" * 66]

    def row(label, value, digits=3, unit=""):
        lines.append(f"{label:52s} {fmt(value, digits) + unit:>12s}")

    row("submit (Store.submit, parent + children)", r["submit_s"], unit=" s")
    row("submit -> first child started", r["submit_to_first_start_s"], unit=" s")
    if r["completed"]:
        row("submit -> all finished (parent SUCCEEDED)", r["submit_to_all_finished_s"],
            1, " s")
    else:
        row(f"TIMED OUT after (finished {r['children_finished']}/{n})", r["elapsed_s"], 1, " s")
    row("children/s (overall)", r["children_per_s"], 1)
    row("children/s (10% -> 90% finished)", r["children_per_s_10_to_90"], 1)
    row("child run time, started -> stopped (median)", r["child_run_s_median"], unit=" s")
    s = r["step_ms"]
    row(f"controller step(): n (profiled {s['profiled_steps_left_out']} left out)", s["n"])
    row("controller step(): median", s["median"], 1, " ms")
    row("controller step(): p90", s["p90"], 1, " ms")
    row("controller step(): max", s["max"], 1, " ms")
    row("controller step(): the first one", s["first"], 1, " ms")
    lines.append("where step() time goes (parts wrapped on the controller instance; share of "
                 "the unprofiled steps' total):")
    lines.append(f"  {'part':30s} {'total s':>9s} {'share':>6s} {'median ms':>10s} "
                 f"{'max ms':>9s}")
    total = s["total_s"] or 1.0
    for name in sorted(r["parts"], key=lambda k: -r["parts"][k]["total_s"]):
        p = r["parts"][name]
        lines.append(f"  {name:30s} {p['total_s']:9.2f} {100 * p['total_s'] / total:5.1f}% "
                     f"{fmt(p['median_ms_per_step'], 2):>10s} {fmt(p['max_ms_per_step'], 1):>9s}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--children", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="1,000 children")
    ap.add_argument("--command", choices=sorted(COMMANDS), default="true")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds (default: 20 minutes for 10,000 children, scaled by size)")
    ap.add_argument("--profile-seconds", type=float, default=10.0)
    ap.add_argument("--profile-at", type=float, default=0.3,
                    help="start the profile once this share of the children finished")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.children = 1_000
    if args.timeout is None:
        args.timeout = max(180.0, 1200.0 * args.children / 10_000)
    out = args.out or RESULTS / ("array_10k.json" if args.children == 10_000
                                 else f"array_10k_{args.children}.json")

    machine = machine_info()
    machine["loadavg_before"] = list(os.getloadavg())
    r = run(args)
    machine["loadavg_after"] = list(os.getloadavg())
    text = table(r, args)
    print(text)
    if "profile" in r:
        p = r["profile"]
        print(f"\ncProfile of the loop, {p['window'][0]:.1f}-{p['window'][1]:.1f} s after submit "
              f"({p['steps']} steps), top by cumulative time:")
        print("\n".join(p["by_cumulative"].splitlines()[:32]))
        print("top by own time:")
        print("\n".join(p["by_tottime"].splitlines()[:22]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "array_10k",
        "command": " ".join([".venv/bin/python", "bench/array_10k.py", *sys.argv[1:]]),
        "machine": machine,
        "config": {"children": args.children, "command": COMMANDS[args.command],
                   "slots": args.slots, "slot": {"cpus": SLOT.cpus, "memory_mib": SLOT.memory_mib},
                   "executor": "LocalExecutor(cpus=2, memory_mib=16384)",
                   "schedule_every": 0.05, "tick_sleep_s": TICK_S, "timeout_s": args.timeout,
                   "store": "SQLite file in a temp dir"},
        "result": r,
        "table": text,
    }, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0 if r["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
