"""Time from capacity appearing in a compute environment to an elastic job running on it.

Twice, side by side in one run: "cold" (``warm_workers=0``: every worker starts a new Python)
and "warm" (``warm_workers=1``: the executor's supervisor keeps one Python with torch imported
ready once the job's first worker, which starts cold, asked for one; a worker becomes it, and a
new one is forked at once by the supervisor's zygote). In each, in one process: a
SQLite store in a temp dir, a ``LocalExecutor`` and a ``Controller`` (``schedule_every=0.05``)
driven by this script's own loop (``step()``, then ~20 ms sleep). A SPOT environment (slots of
0.25 cpus) starts with 1 slot; an elastic job (workers 1..3) runs
``tests/scripts/ledger_train.py`` with more epochs than it will ever reach. Once it trains, the
script alternates:

* up: ``desired_slots`` 1 -> 2 (capacity appears). Phases, all on one clock (``time.time()``):
  a) capacity -> the controller started the new worker process (its worker row's started_at);
  b1) worker start-up: process started -> its hello reached the coordinator (Python,
      ``import torch``, the script building its model, connecting; warm: the script only);
  b2) hello -> the group re-formed with it (the running members finish their step first);
  c) re-formed -> the first step completed in the world of 2 (the first metrics.jsonl row with
     world_size 2; rows carry the worker's unix ``time``).
  Hello and re-form times come from the job's ``membership.join`` event (``detected_at`` and
  ``reformed_at``, seconds since the coordinator started, which runs in this process, so its
  start time is known). The event's own ``latency_s`` (``event_latency_s`` in the result file)
  counts from ``requested_at``, when the service asked its executor for the worker: phases b1,
  b2 and c and the end of a.
* down: ``desired_slots`` 2 -> 1 (capacity taken back; the scheduler shrinks the job and the
  newest worker gets a graceful notice, SIGTERM). Phases: capacity -> notice (worker row
  leave_at); notice -> group re-formed; re-formed -> first step at world 1; plus when the
  leaving process exited (worker row stopped_at; with the shim, split at the worker's
  ``atexit``: Python code done vs interpreter teardown and reaping) and the steps redone
  (``steps_redone`` of the ``membership.leave`` event; none expected for a graceful leave).

The worker runs the ledger script through a small shim (``runpy``, same process) that prints
``time.time()`` when its interpreter runs its first line, after ``import torch``, after
``import torch._dynamo`` (which ``torch.optim.SGD(...)`` in the script imports lazily anyway:
well over a second here) and after ``import dyntrain``; from the worker's log those split b1
into: spawn -> the worker's first line, the imports (none left when warm), and the script's
own set-up up to its hello being read by the coordinator
(``--no-shim`` runs the script directly). For reference it also times
``python -c "import torch"``, idle before the job starts and again while the job trains at
world 1: that is the floor under a cold b1 here. In the warm run, capacity appears only once a
warm worker is ready (its "ready" line in the supervisor's log), and the RSS and PSS of an idle
warm worker are read from /proc: what the pool costs in memory.

The goal is under 1 s (warm median) from capacity appearing to the job running on it.

    .venv/bin/python bench/service_capacity.py            # ~2-3 minutes
    .venv/bin/python bench/service_capacity.py --reps 3

Writes a table to stdout and ``bench/results/service_capacity.json``. The machine is shared
(2 cores here): numbers are noisy, so medians (and maxima) are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import JsonlTail, fmt, machine_info, maximum, median  # noqa: E402
from dyntrain.service.core.model import (  # noqa: E402
    CapacityType,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    Resources,
    WorkerState,
)
from dyntrain.service.engine.config import ControllerConfig  # noqa: E402
from dyntrain.service.engine.controller import Controller  # noqa: E402, ControllerConfig  # noqa: E402
from dyntrain.service.executors.local import LocalExecutor  # noqa: E402
from dyntrain.service.store import Store  # noqa: E402

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LEDGER = ROOT / "tests" / "scripts" / "ledger_train.py"
RESULTS = BENCH / "results" / "service_capacity.json"
SLOT = Resources(0.25, 0, 256)
GOAL_S = 1.0
TICK_S = 0.02
PHASE_TIMEOUT_S = 90.0
WARM_READY = re.compile(r"dyntrain warm worker (\d+) ready")

STARTUP_PHASES = [
    ("su_spawn_to_python", "spawn -> the worker's first line runs"),
    ("su_import_torch", "import torch"),
    ("su_import_dynamo", "import torch._dynamo (SGD's lazy import)"),
    ("su_import_dyntrain", "import dyntrain (ElasticTrainer)"),
    ("su_script_to_hello", "script set-up -> hello read by coordinator"),
]
SHIM = """import atexit, sys, time
print(f"BENCH-T python {time.time():.6f}", flush=True)
atexit.register(lambda: print(f"BENCH-T atexit {time.time():.6f}", flush=True))
import torch  # noqa: F401
print(f"BENCH-T torch {time.time():.6f}", flush=True)
import torch._dynamo  # noqa: F401  (torch.optim's constructor imports it lazily anyway)
print(f"BENCH-T dynamo {time.time():.6f}", flush=True)
from dyntrain import ElasticTrainer  # noqa: F401
print(f"BENCH-T dyntrain {time.time():.6f}", flush=True)
import runpy
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

UP_PHASES = [
    ("up_a_capacity_to_process", "a  capacity -> worker process started"),
    ("up_b1_worker_startup", "b1 worker start-up: process -> hello"),
    ("up_b2_hello_to_reformed", "b2 hello -> group re-formed with it"),
    ("up_c_reformed_to_first_step", "c  re-formed -> first step at world 2"),
    ("up_total", "total: capacity -> first step at world 2"),
    ("up_total_minus_startup", "total minus b1 (service's own part)"),
]
DOWN_PHASES = [
    ("down_a_capacity_to_notice", "a  capacity -> leave notice (SIGTERM)"),
    ("down_b_notice_to_reformed", "b  notice -> group re-formed without it"),
    ("down_c_reformed_to_first_step", "c  re-formed -> first step at world 1"),
    ("down_total", "total: capacity -> first step at world 1"),
    ("down_process_exited", "capacity -> leaving process exited"),
    ("down_notice_to_atexit", "  of which: notice -> its Python at atexit"),
    ("down_atexit_to_reaped", "  of which: atexit -> exit reaped (teardown)"),
    ("down_steps_redone", "steps redone (lost work)"),
]


class Bench:
    def __init__(self, tmp: Path, epochs: int, step_delay: float, shim: bool,
                 warm: int = 0) -> None:
        self.warm, self.supervisor_log = warm, tmp / "executor" / "workers" / "supervisor.log"
        self.store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
        self.store.create_all()
        self.store.environments.create_compute_environment(ComputeEnvironmentSpec(
            "spot", CapacityType.SPOT, 0.3, SLOT, 0, 1, 8))
        self.store.environments.create_job_queue(JobQueueSpec("q", 1, ("spot",)))
        executor = LocalExecutor(tmp / "executor", cpus=2, memory_mib=16_384,
                                 warm_workers=warm)
        self.c = Controller(self.store, executor, ControllerConfig(
            tmp / "runs", grace_seconds=30.0, schedule_every=0.05))
        command = [sys.executable, str(LEDGER), "--epochs", str(epochs),
                   "--step-delay", str(step_delay)]
        if shim:
            (tmp / "shim.py").write_text(SHIM)
            command.insert(1, str(tmp / "shim.py"))
        self.job = self.store.jobs.submit(queue="q", command=command, resources=SLOT, workers=(1,
                                                                                               3))
        self.metrics = JsonlTail(self.c.run_dir(self.job.id) / "metrics.jsonl")
        self.step_times: list[float] = []
        self.events_seen = 0

    def tick(self) -> None:
        t = time.perf_counter()
        self.c.step()
        self.step_times.append(time.perf_counter() - t)
        self.metrics.poll()
        time.sleep(TICK_S)

    def drive(self, until, what: str, timeout: float = PHASE_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            got = until()
            if got:
                return got
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")

    def first_row(self, world: int, after: float) -> dict | None:
        """The first metrics row at ``world`` workers completed at or after ``after``."""
        for row in self.metrics.records:
            if row.get("time", 0) >= after and row.get("world_size") == world:
                return row
        return None

    def new_event(self, kind: str):
        events = self.store.logs.list_events(self.job.id, limit=100_000)
        for e in events[self.events_seen:]:
            if e.kind == kind:
                return e
        return None

    def coordinator_t0(self) -> float:
        return self.c.attempts[self.job.id].host.coordinator.started_at

    def workers(self):
        return self.store.workers.list_workers(self.job.id, active=False)

    def set_slots(self, n: int) -> float:
        self.events_seen = len(self.store.logs.list_events(self.job.id, limit=100_000))
        t = time.time()
        self.store.environments.update_compute_environment("spot", desired_slots=n)
        return t

    # ---- one change each way --------------------------------------------------------------

    def ready_warm_workers(self) -> list[int]:
        """Warm workers that finished their imports and were not given a worker yet."""
        try:
            text = self.supervisor_log.read_text(errors="replace")
        except OSError:
            return []
        used = {int(w.handle["ref"].split(":")[0]) for w in self.workers() if w.handle}
        return [int(pid) for pid in WARM_READY.findall(text) if int(pid) not in used]

    def up(self) -> dict:
        before = {w.id for w in self.workers()}
        if self.warm:  # capacity appears when the pool is ready (refilled after the last up)
            self.drive(self.ready_warm_workers, "a warm worker to be ready")
        t_cap = self.set_slots(2)
        new = self.drive(lambda: [w for w in self.workers() if w.id not in before],
                         "the new worker to start")[0]
        row = self.drive(lambda: self.first_row(2, t_cap), "a step at world 2")
        event = self.drive(lambda: self.new_event("membership.join"), "the join event")
        t0 = self.coordinator_t0()
        hello = t0 + event.payload["detected_at"]  # requested_at: when the service started it
        reformed = t0 + event.payload["reformed_at"]
        first = row["time"]
        rec = {
            "worker": new.id, "t_capacity": t_cap, "t_process_started": new.started_at,
            "t_hello": hello, "t_reformed": reformed, "t_first_step": first,
            "first_step_event": t0 + event.payload["first_step_at"],
            "event_latency_s": event.payload["latency_s"],
            "steps_redone": event.payload.get("steps_redone"),
            "up_a_capacity_to_process": new.started_at - t_cap,
            "up_b1_worker_startup": hello - new.started_at,
            "up_b2_hello_to_reformed": reformed - hello,
            "up_c_reformed_to_first_step": first - reformed,
            "up_total": first - t_cap,
        }
        rec["up_total_minus_startup"] = rec["up_total"] - rec["up_b1_worker_startup"]
        marks = self.shim_marks(new.id)
        if {"python", "torch", "dynamo", "dyntrain"} <= set(marks):
            rec.update(su_spawn_to_python=marks["python"] - new.started_at,
                       su_import_torch=marks["torch"] - marks["python"],
                       su_import_dynamo=marks["dynamo"] - marks["torch"],
                       su_import_dyntrain=marks["dyntrain"] - marks["dynamo"],
                       su_script_to_hello=hello - marks["dyntrain"])
        # let it train a little at world 2 before the next change
        n = len(self.metrics.records)
        self.drive(lambda: len(self.metrics.records) >= n + 15, "steps at world 2")
        return rec

    def shim_marks(self, worker_id: str) -> dict[str, float]:
        path = self.c.run_dir(self.job.id) / "logs" / f"{worker_id}.log"
        marks = {}
        try:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("BENCH-T "):
                    _, name, value = line.split()
                    marks[name] = float(value)
        except (OSError, ValueError):
            pass
        return marks

    def down(self) -> dict:
        t_cap = self.set_slots(1)
        leaving = self.drive(lambda: [w for w in self.workers() if w.leave_at is not None
                                      and w.leave_at >= t_cap], "the leave notice")[0]
        row = self.drive(lambda: self.first_row(1, t_cap), "a step at world 1")
        event = self.drive(lambda: self.new_event("membership.leave"), "the leave event")
        gone = self.drive(lambda: [w for w in self.workers()
                                   if w.id == leaving.id and w.state == WorkerState.EXITED],
                          "the leaving process to exit")[0]
        t0 = self.coordinator_t0()
        reformed = t0 + event.payload["reformed_at"]
        first = row["time"]
        window = [r for r in self.metrics.records if r.get("time", 0) >= t_cap]
        rec = {
            "worker": leaving.id, "t_capacity": t_cap, "t_notice": leaving.leave_at,
            "t_reformed": reformed, "t_first_step": first, "t_process_exited": gone.stopped_at,
            "exit_code": gone.exit_code, "event_latency_s": event.payload["latency_s"],
            "down_a_capacity_to_notice": leaving.leave_at - t_cap,
            "down_b_notice_to_reformed": reformed - leaving.leave_at,
            "down_c_reformed_to_first_step": first - reformed,
            "down_total": first - t_cap,
            "down_process_exited": gone.stopped_at - t_cap,
            "down_steps_redone": event.payload.get("steps_redone"),
            "recomputed_rows": sum(1 for r in window if r.get("recomputed")),
        }
        marks = self.shim_marks(leaving.id)
        if "atexit" in marks:
            rec["down_notice_to_atexit"] = marks["atexit"] - leaving.leave_at
            rec["down_atexit_to_reaped"] = gone.stopped_at - marks["atexit"]
        n = len(self.metrics.records)
        self.drive(lambda: len(self.metrics.records) >= n + 15, "steps at world 1")
        return rec

    def stop(self) -> None:
        try:
            self.c.terminate(self.job.id)
            self.drive(lambda: self.store.jobs.get_job(self.job.id).status.is_terminal(),
                       "the job to stop", timeout=60)
        finally:
            for w in self.store.workers.list_workers(self.job.id, active=True):
                try:
                    self.c.executor.signal(w.id, "KILL")
                except Exception:
                    pass
            self.store.close()


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (from status) and Pss (from smaps_rollup) of a process, in KiB."""
    out = {}
    for name, field in (("status", "VmRSS:"), ("smaps_rollup", "Pss:")):
        try:
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                if line.startswith(field):
                    out[field.rstrip(":").lower()] = int(line.split()[1])
        except (OSError, ValueError):
            pass
    return out


def time_import_torch(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        out.append(time.perf_counter() - t)
    return out


def summarise(recs: list[dict], phases) -> dict:
    out = {}
    for key, _ in phases:
        vals = [r[key] for r in recs if r.get(key) is not None]
        out[key] = {"n": len(vals), "median": median(vals), "max": maximum(vals),
                    "min": min(vals) if vals else None}
    return out


def run_mode(args, warm: int) -> dict:
    """One job on one controller: changes each way, alternating; ``warm`` warm workers."""
    mode = "warm" if warm else "cold"
    ups, downs, imports_busy, pool = [], [], [], {}
    with tempfile.TemporaryDirectory(prefix="svc-capacity-") as tmp:
        b = Bench(Path(tmp), args.epochs, args.step_delay, not args.no_shim, warm=warm)
        started = time.time()
        try:
            b.drive(lambda: len([r for r in b.metrics.records if r["world_size"] == 1]) >= 20,
                    "the job to train at world 1", timeout=120)
            print(f"[{mode}] job trains at world 1 ({time.time() - started:.1f} s after "
                  "submit)", flush=True)
            if warm:
                ready = b.drive(b.ready_warm_workers, "a warm worker to be ready")
                pool = {"pid": ready[0], **memory_kib(ready[0])}
                print(f"[{mode}] idle warm worker: {pool}", flush=True)
            else:
                for _ in range(3):  # the controller keeps stepping while torch imports
                    proc = subprocess.Popen([sys.executable, "-c", "import torch"])
                    t = time.perf_counter()
                    b.drive(lambda p=proc: p.poll() is not None, "import torch")
                    imports_busy.append(time.perf_counter() - t)
            for i in range(args.reps):
                for kind, fn, out in (("up", b.up, ups), ("down", b.down, downs)):
                    rec = fn()
                    rec["rep"] = i
                    out.append(rec)
                    print(f"[{mode}] rep {i} {kind:4s}: capacity -> first step "
                          f"{rec[f'{kind}_total']:.3f} s ({rec['worker']})", flush=True)
        finally:
            step_times = sorted(x * 1000 for x in b.step_times)
            job = b.store.jobs.get_job(b.job.id)
            final = {"status_before_stop": job.status.value, "attempts": job.attempts,
                     "preemptions": job.preemptions}
            b.stop()
    return {"up": {"summary": summarise(ups, UP_PHASES),
                   "startup_split": summarise(ups, STARTUP_PHASES), "runs": ups},
            "down": {"summary": summarise(downs, DOWN_PHASES), "runs": downs},
            "import_torch_busy_s": imports_busy, "warm_worker_memory_kib": pool,
            "controller_step_ms": {"n": len(step_times),
                                   "median": statistics.median(step_times),
                                   "max": step_times[-1]},
            "job": final}


def table(args, results: dict, imports: list[float]) -> str:
    cold, warm = results["cold"], results["warm"]
    lines = [f"Capacity -> elastic job running on it ({args.reps} changes each way, medians "
             "and maxima; shared 2-core machine: noisy). cold: a new Python per worker; warm: "
             "one warm worker (torch imported) kept ready",
             f"{'phase':46s} {'cold median':>11s} {'max':>7s} {'warm median':>11s} {'max':>7s}",
             "-" * 86]
    for title, phases, part, key in (
            ("capacity up: desired_slots 1 -> 2", UP_PHASES, "up", "summary"),
            ("b1 split (shim timestamps in the worker's log)", STARTUP_PHASES, "up",
             "startup_split"),
            ("capacity down: desired_slots 2 -> 1", DOWN_PHASES, "down", "summary")):
        lines.append(title)
        for phase, label in phases:
            digits = 0 if phase.endswith("redone") else 3
            cells = []
            for mode in (cold, warm):
                s = mode[part][key][phase]
                cells += [fmt(s["median"], digits), fmt(s["max"], digits)]
            lines.append(f"  {label:44s} {cells[0]:>11s} {cells[1]:>7s} {cells[2]:>11s} "
                         f"{cells[3]:>7s}")
    for label, vals in (("idle, before the jobs", imports),
                        ("while the cold job trains at world 1", cold["import_torch_busy_s"])):
        if vals:
            lines.append(f"reference: python -c 'import torch', {label}: median "
                         f"{statistics.median(vals):.3f} s, max {max(vals):.3f} s")
    mem = warm["warm_worker_memory_kib"]
    if mem:
        lines.append(f"an idle warm worker holds RSS {mem.get('vmrss', 0) / 1024:.0f} MiB "
                     f"(PSS {mem.get('pss', 0) / 1024:.0f} MiB)")
    cold_med = cold["up"]["summary"]["up_total"]["median"]
    warm_med = warm["up"]["summary"]["up_total"]["median"]
    met = warm_med is not None and warm_med < GOAL_S
    lines.append(f"Goal: capacity appearing -> job running on it < {GOAL_S:g} s: warm median "
                 f"{fmt(warm_med)} s -> {'MET' if met else 'NOT MET'} (cold: {fmt(cold_med)} s, "
                 f"{cold_med / warm_med:.1f}x slower)" if cold_med and warm_med else "no result")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="changes each way (alternating)")
    ap.add_argument("--epochs", type=int, default=100_000,
                    help="epochs of the job (it is terminated at the end)")
    ap.add_argument("--step-delay", type=float, default=0.004)
    ap.add_argument("--no-shim", action="store_true",
                    help="run the ledger script directly (no start-up timestamps)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    machine = machine_info()
    machine["loadavg_before"] = list(os.getloadavg())
    imports = time_import_torch(3)
    print(f"python -c 'import torch' (idle): {', '.join(f'{x:.2f}' for x in imports)} s",
          flush=True)
    results = {"cold": run_mode(args, warm=0), "warm": run_mode(args, warm=1)}
    machine["loadavg_after"] = list(os.getloadavg())
    text = table(args, results, imports)
    print(text)
    warm_med = results["warm"]["up"]["summary"]["up_total"]["median"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "service_capacity",
        "command": " ".join([".venv/bin/python", "bench/service_capacity.py", *sys.argv[1:]]),
        "machine": machine,
        "config": {"reps": args.reps, "epochs": args.epochs, "step_delay": args.step_delay,
                   "slot": {"cpus": SLOT.cpus, "memory_mib": SLOT.memory_mib},
                   "workers": [1, 3], "schedule_every": 0.05, "tick_sleep_s": TICK_S,
                   "shim": not args.no_shim,
                   "executor": "LocalExecutor(cpus=2, memory_mib=16384, warm_workers=0 | 1)",
                   "store": "SQLite file in a temp dir", "clock": "time.time()"},
        "goal": {"capacity_to_running_s": GOAL_S, "warm_median_s": warm_med,
                 "met": warm_med is not None and warm_med < GOAL_S},
        "import_torch_idle_s": imports,
        **results,
        "table": text,
    }, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
