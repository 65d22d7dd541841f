"""Time from capacity appearing in a compute environment to an elastic job running on it.

In one process: a SQLite store in a temp dir, a ``LocalExecutor`` and a ``Controller``
(``schedule_every=0.05``) driven by this script's own loop (``step()``, then ~20 ms sleep). A
SPOT environment (slots of 0.25 cpus) starts with 1 slot; an elastic job (workers 1..3) runs
``tests/scripts/ledger_train.py`` with more epochs than it will ever reach. Once it trains, the
script alternates:

* up: ``desired_slots`` 1 -> 2 (capacity appears). Phases, all on one clock (``time.time()``):
  a) capacity -> the controller started the new worker process (its worker row's started_at);
  b1) worker start-up: process started -> its hello reached the coordinator (Python, the
      wrapper, ``import torch``, the script building its model, connecting);
  b2) hello -> the group re-formed with it (the running members finish their step first);
  c) re-formed -> the first step completed in the world of 2 (the first metrics.jsonl row with
     world_size 2; rows carry the worker's unix ``time``).
  Hello and re-form times come from the job's ``membership.join`` event (seconds since the
  coordinator started, which runs in this process, so its start time is known).
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
into: spawn -> Python up (two interpreters: the executor's wrapper, then the worker), the
imports, and the script's own set-up up to its hello being read by the coordinator
(``--no-shim`` runs the script directly). For reference it also times
``python -c "import torch"``, idle before the job starts and again while the job trains at
world 1: that is the floor under b1 here.

The goal is under 2 s from capacity appearing to the job running on it; a new worker process's
start-up dominates that, so the table also gives the total without b1.

    .venv/bin/python bench/service_capacity.py            # ~1-2 minutes
    .venv/bin/python bench/service_capacity.py --reps 3

Writes a table to stdout and ``bench/results/service_capacity.json``. The machine is shared
(2 cores here): numbers are noisy, so medians (and maxima) are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import JsonlTail, fmt, machine_info, maximum, median  # noqa: E402
from dyntrain.service.controller import Controller, ControllerConfig  # noqa: E402
from dyntrain.service.executors.local import LocalExecutor  # noqa: E402
from dyntrain.service.model import (  # noqa: E402
    CapacityType,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    Resources,
)
from dyntrain.service.store import WORKER_EXITED, Store  # noqa: E402

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LEDGER = ROOT / "tests" / "scripts" / "ledger_train.py"
RESULTS = BENCH / "results" / "service_capacity.json"
SLOT = Resources(0.25, 0, 256)
GOAL_S = 2.0
TICK_S = 0.02
PHASE_TIMEOUT_S = 90.0

STARTUP_PHASES = [
    ("su_spawn_to_python", "spawn -> worker interpreter up (2 Pythons)"),
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
    def __init__(self, tmp: Path, epochs: int, step_delay: float, shim: bool) -> None:
        self.store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
        self.store.create_all()
        self.store.create_compute_environment(ComputeEnvironmentSpec(
            "spot", CapacityType.SPOT, 0.3, SLOT, 0, 1, 8))
        self.store.create_job_queue(JobQueueSpec("q", 1, ("spot",)))
        executor = LocalExecutor(tmp / "executor", cpus=2, memory_mib=16_384)
        self.c = Controller(self.store, executor, ControllerConfig(
            tmp / "runs", grace_seconds=30.0, schedule_every=0.05))
        command = [sys.executable, str(LEDGER), "--epochs", str(epochs),
                   "--step-delay", str(step_delay)]
        if shim:
            (tmp / "shim.py").write_text(SHIM)
            command.insert(1, str(tmp / "shim.py"))
        self.job = self.store.submit(queue="q", command=command, resources=SLOT, workers=(1, 3))
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
        events = self.store.list_events(self.job.id, limit=100_000)
        for e in events[self.events_seen:]:
            if e.kind == kind:
                return e
        return None

    def coordinator_t0(self) -> float:
        return self.c.attempts[self.job.id].host.coordinator.started_at

    def workers(self):
        return self.store.list_workers(self.job.id, active=False)

    def set_slots(self, n: int) -> float:
        self.events_seen = len(self.store.list_events(self.job.id, limit=100_000))
        t = time.time()
        self.store.update_compute_environment("spot", desired_slots=n)
        return t

    # ---- one change each way --------------------------------------------------------------

    def up(self) -> dict:
        before = {w.id for w in self.workers()}
        t_cap = self.set_slots(2)
        new = self.drive(lambda: [w for w in self.workers() if w.id not in before],
                         "the new worker to start")[0]
        row = self.drive(lambda: self.first_row(2, t_cap), "a step at world 2")
        event = self.drive(lambda: self.new_event("membership.join"), "the join event")
        t0 = self.coordinator_t0()
        hello = t0 + event.payload["requested_at"]
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
                                   if w.id == leaving.id and w.state == WORKER_EXITED],
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
            self.drive(lambda: self.store.get_job(self.job.id).status.is_terminal(),
                       "the job to stop", timeout=60)
        finally:
            for w in self.store.list_workers(self.job.id, active=True):
                try:
                    self.c.executor.signal(w.id, "KILL")
                except Exception:
                    pass
            self.store.close()


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
    imports_busy: list[float] = []

    ups, downs, failures = [], [], []
    with tempfile.TemporaryDirectory(prefix="svc-capacity-") as tmp:
        b = Bench(Path(tmp), args.epochs, args.step_delay, not args.no_shim)
        started = time.time()
        try:
            b.drive(lambda: len([r for r in b.metrics.records if r["world_size"] == 1]) >= 20,
                    "the job to train at world 1", timeout=120)
            print(f"job trains at world 1 ({time.time() - started:.1f} s after submit)",
                  flush=True)
            for _ in range(3):  # the controller keeps stepping while torch imports
                proc = subprocess.Popen([sys.executable, "-c", "import torch"])
                t = time.perf_counter()
                b.drive(lambda p=proc: p.poll() is not None, "import torch")
                imports_busy.append(time.perf_counter() - t)
            print("python -c 'import torch' (job training at world 1): "
                  f"{', '.join(f'{x:.2f}' for x in imports_busy)} s", flush=True)
            for i in range(args.reps):
                for kind, fn, out in (("up", b.up, ups), ("down", b.down, downs)):
                    try:
                        rec = fn()
                    except TimeoutError as e:
                        failures.append({"rep": i, "kind": kind, "error": str(e)})
                        print(f"rep {i} {kind}: FAILED {e}", flush=True)
                        raise
                    rec["rep"] = i
                    out.append(rec)
                    key = f"{kind}_total"
                    print(f"rep {i} {kind:4s}: capacity -> first step {rec[key]:.3f} s "
                          f"({rec['worker']})", flush=True)
        finally:
            step_times = list(b.step_times)
            job = b.store.get_job(b.job.id)
            final = {"status_before_stop": job.status.value, "attempts": job.attempts,
                     "preemptions": job.preemptions}
            b.stop()
    machine["loadavg_after"] = list(os.getloadavg())

    up_sum, down_sum = summarise(ups, UP_PHASES), summarise(downs, DOWN_PHASES)
    su_sum = summarise(ups, STARTUP_PHASES)
    lines = [f"Capacity -> elastic job running on it ({args.reps} changes each way, medians "
             "and maxima; shared 2-core machine: noisy)",
             f"{'phase':46s} {'n':>3s} {'median s':>9s} {'max s':>8s}", "-" * 70]
    for title, phases, summ in (
            ("capacity up: desired_slots 1 -> 2", UP_PHASES, up_sum),
            ("b1 split (shim timestamps in the worker's log)", STARTUP_PHASES, su_sum),
            ("capacity down: desired_slots 2 -> 1", DOWN_PHASES, down_sum)):
        if not any(summ[key]["n"] for key, _ in phases):
            continue
        lines.append(title)
        for key, label in phases:
            s = summ[key]
            digits = 0 if key.endswith("redone") else 3
            lines.append(f"  {label:44s} {s['n']:>3d} {fmt(s['median'], digits):>9s} "
                         f"{fmt(s['max'], digits):>8s}")
    for label, vals in (("idle, before the job", imports),
                        ("while the job trains at world 1", imports_busy)):
        if vals:
            lines.append(f"reference: python -c 'import torch', {label}: median "
                         f"{statistics.median(vals):.3f} s, max {max(vals):.3f} s")
    steps_ms = sorted(x * 1000 for x in step_times)
    lines.append(f"controller step(): median {statistics.median(steps_ms):.1f} ms, "
                 f"max {steps_ms[-1]:.1f} ms over {len(steps_ms)} steps")
    up_med = up_sum["up_total"]["median"]
    svc_med = up_sum["up_total_minus_startup"]["median"]
    met = up_med is not None and up_med < GOAL_S
    lines.append(f"Goal: capacity appearing -> job running on it < {GOAL_S:g} s: median "
                 f"{fmt(up_med)} s -> {'MET' if met else 'NOT MET'}; without the new worker's "
                 f"start-up (b1): median {fmt(svc_med)} s")
    table = "\n".join(lines)
    print(table)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "service_capacity",
        "command": " ".join([".venv/bin/python", "bench/service_capacity.py", *sys.argv[1:]]),
        "machine": machine,
        "config": {"reps": args.reps, "epochs": args.epochs, "step_delay": args.step_delay,
                   "slot": {"cpus": SLOT.cpus, "memory_mib": SLOT.memory_mib},
                   "workers": [1, 3], "schedule_every": 0.05, "tick_sleep_s": TICK_S,
                   "shim": not args.no_shim,
                   "executor": "LocalExecutor(cpus=2, memory_mib=16384)",
                   "store": "SQLite file in a temp dir", "clock": "time.time()"},
        "goal": {"capacity_to_running_s": GOAL_S, "median_s": up_med, "met": met,
                 "median_without_worker_startup_s": svc_med},
        "import_torch_s": {"idle": imports, "job_training": imports_busy},
        "up": {"summary": up_sum, "startup_split": su_sum, "runs": ups},
        "down": {"summary": down_sum, "runs": downs},
        "controller_step_ms": {"n": len(steps_ms), "median": statistics.median(steps_ms),
                               "max": steps_ms[-1]},
        "job": final,
        "failures": failures,
        "table": table,
    }, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
