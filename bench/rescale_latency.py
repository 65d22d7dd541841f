"""Rescale latency: dyntrain vs torchrun's elastic agent, on this machine, in one run.

For every membership change -- a worker joins, a worker leaves gracefully (SIGTERM), a worker is
SIGKILLed -- it measures the rescale latency (the change -> the first step completed in the new
world) and the steps of work lost, for:

1. dyntrain: ``dyntrain run --workers 1:4 --nproc 2 --events ...`` on the built-in digits workload;
   the schedule cycles join / leave / kill / join (world sizes 2 -> 3 -> 2 -> 1 -> 2) ``--reps``
   times. Numbers come from the run's ``events.jsonl`` and ``metrics.jsonl``.
2. torchrun (``python -m torch.distributed.run``, c10d rendezvous, ``--nnodes 1:4``,
   ``--nproc-per-node 1``, one agent per "node", all on 127.0.0.1) running
   ``bench/torchrun_worker.py`` (same model, data and global batch, plain DDP over gloo, a
   checkpoint every step), in two configurations: torchrun's defaults and tuned-down timeouts. The
   same cycle: start one more agent (join), SIGTERM the newest agent (leave), SIGKILL the worker
   process of one agent (kill; the agent restarts its group and torchrun restarts every worker).
   A third, "shared-store" (tuned, with torch's default rendezvous-store sharing on), only tries
   a join: in torch 2.13 it deadlocks, which is why the other two turn the sharing off.

Writes ``bench/results/rescale_latency.json`` and prints a table. Run it with
``.venv/bin/python bench/rescale_latency.py`` (about 5-6 minutes; ``--quick`` about 2).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    JsonlTail,
    LineReader,
    alive,
    cmdline,
    descendants,
    fmt,
    free_port,
    kill_pids,
    kill_tree,
    machine_info,
    maximum,
    median,
)

BENCH = Path(__file__).resolve().parent
WORKER = BENCH / "torchrun_worker.py"
RESULTS = BENCH / "results" / "rescale_latency.json"
KINDS = ("join", "leave", "kill")
MAX_WORKERS = 4  # headroom above the largest world used (3): a join never fills the job up
EPOCHS = "1000"  # far more steps than a run takes; every run is stopped from outside

# recent torch shares the c10d rendezvous TCPStore with the workers by default; in torch 2.13 that
# deadlocks when a new node joins a running job and rank 0 stays rank 0 (the newcomer waits for
# MASTER_ADDR under the new round's key prefix, which only a *new* rank 0 writes, while rank 0 waits
# for the newcomer's role info). Every measured configuration turns the sharing off; the
# "shared-store" probe shows the hang.
NO_SHARE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
TUNED_ARGS = ["--max-restarts", "1000", "--monitor-interval", "0.05", "--rdzv-conf",
              "join_timeout=60,last_call_timeout=1,close_timeout=1,"
              "keep_alive_interval=1,keep_alive_max_attempt=3"]
TORCHRUN_CONFIGS = {
    # torchrun's own defaults (monitor interval 0.1 s in this torch, last_call_timeout 30 s,
    # keep-alive 5 s x 3, ...) except --max-restarts: its default, 0, ends the whole job on the
    # first worker failure, so neither a kill nor a leave (whose peers then fail) would be survived.
    "default": {"args": ["--max-restarts", "100"], "env": NO_SHARE},
    # as fast as torchrun lets itself be made: timeouts are whole seconds (>= 1). A keep-alive
    # expiry of 2 intervals (keep_alive_max_attempt=2) split the job into two worlds in a trial run
    # (a live agent looked dead), so 3 is used.
    "tuned": {"args": TUNED_ARGS, "env": NO_SHARE},
    # the tuned settings with torch's default store sharing left on: only a join is tried
    "shared-store": {"args": TUNED_ARGS, "env": {}},
}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# dyntrain
# ---------------------------------------------------------------------------------------------

def dyntrain_schedule(reps: int, gap: int = 30) -> list[str]:
    """join, leave, kill, join per repetition (world 2 -> 3 -> 2 -> 1 -> 2), by step triggers.

    Events fire one at a time, each once the previous one took effect, so a trigger that is
    already due fires right after the previous change completed its first step.
    """
    items, step = [], 0
    for _ in range(reps):
        for action in ("join=1", "leave=1", "kill=1", "join=1"):
            step += gap
            items.append(f"step={step}:{action}")
    return items


def run_dyntrain(reps: int, work: Path, timeout: float) -> dict:
    out = work / "dyntrain"
    events = dyntrain_schedule(reps)
    expected = {"join": 2 * reps, "leave": reps, "crash": reps}
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", f"1:{MAX_WORKERS}",
           "--nproc", "2", "--events", ",".join(events), "--out", str(out),
           "-m", "dyntrain.workloads.digits", "--epochs", EPOCHS]
    say(f"dyntrain: {' '.join(cmd[3:])}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    reader = LineReader(proc.stdout, echo_to=work / "dyntrain-launcher.log")
    tail = JsonlTail(out / "events.jsonl")
    seen_workers: set[int] = set()
    status = "timeout"
    try:
        while time.time() - t0 < timeout:
            tail.poll()
            seen_workers |= set(descendants(proc.pid))
            got = _count_kinds(tail.records)
            if all(got.get(k, 0) >= n for k, n in expected.items()):
                status = "ok"
                break
            if proc.poll() is not None:
                status = f"launcher exited with code {proc.returncode}"
                break
            time.sleep(0.05)
    finally:
        kill_tree(proc, extra=seen_workers)
        reader.join()
    tail.poll()
    wall = time.time() - t0
    metrics = JsonlTail(out / "metrics.jsonl")
    metrics.poll()
    changes, notes = _dyntrain_changes(tail.records, metrics.records, reader.lines)
    if status != "ok":
        notes.append(f"status: {status} (events so far: {_count_kinds(tail.records)})")
    say(f"dyntrain: {status}, {len(changes)} changes in {wall:.1f} s")
    return {"system": "dyntrain", "config": "default", "status": status, "wall_s": round(wall, 1),
            "command": " ".join(["dyntrain", *cmd[4:]]), "events": events,
            "changes": changes, "notes": notes, "raw_events": tail.records}


def _count_kinds(records: list[dict]) -> dict[str, int]:
    gens: dict[str, set] = {}
    for r in records:
        gens.setdefault(r["event"], set()).add(r.get("generation"))
    return {k: len(v) for k, v in gens.items()}


def _dyntrain_changes(records, metrics, lines) -> tuple[list[dict], list[str]]:
    notes: list[str] = []
    # first and last metrics time per generation (unix), in file order
    first_time: dict[int, float] = {}
    last_before: dict[int, float | None] = {}
    prev_time = None
    for m in metrics:
        g = m["gen"]
        if g not in first_time:
            first_time[g] = m["time"]
            last_before[g] = prev_time
        prev_time = m["time"]
    spawned = {}  # worker id -> when the launcher started its process (unix, line arrival)
    for t, line in lines:
        m = re.search(r"event \S+:join=\d+: started (.+)$", line)
        if m:
            for w in m.group(1).split(","):
                spawned[w.strip()] = t
    by_gen: dict[tuple[int, str], list[dict]] = {}
    for r in records:
        if r["event"] in ("start", "resume"):
            continue
        by_gen.setdefault((r["generation"], r["event"]), []).append(r)
    changes = []
    for (gen, event), recs in sorted(by_gen.items()):
        if len(recs) > 1:
            notes.append(f"generation {gen}: {len(recs)} '{event}' records for one change "
                         f"(workers {[r['workers'] for r in recs]}); counted once")
            recs = sorted(recs, key=lambda r: (not r["workers"], r["requested_at"]))
        r = recs[0]
        kind = "kill" if event == "crash" else event
        redone = r.get("steps_redone", 0)
        c = {
            "kind": kind,
            "workers": r["workers"],
            "world_before": r["world_before"],
            "world_after": r.get("world_after"),
            "latency_s": r["latency_s"],
            "detect_s": round(r["detected_at"] - r["requested_at"], 4),
            "reform_s": round(r["reformed_at"] - r["requested_at"], 4),
            "steps_lost": redone,
            "steps_lost_max": redone + (1 if kind == "kill" else 0),
            "pause_s": None,
        }
        if gen in first_time and last_before.get(gen) is not None:
            c["pause_s"] = round(first_time[gen] - last_before[gen], 4)
        if kind == "join" and gen in first_time:
            w = r["workers"][0] if r["workers"] else None
            if w in spawned:
                c["latency_from_process_start_s"] = round(first_time[gen] - spawned[w], 4)
        changes.append(c)
    return changes, notes


# ---------------------------------------------------------------------------------------------
# torchrun
# ---------------------------------------------------------------------------------------------

# torchrun with its rendezvous's DEBUG log on, dumping its threads' stacks on SIGUSR2 (to see why
# a rendezvous takes long or hangs)
DEBUG_RDZV = (
    "import faulthandler, logging, runpy, signal, sys; "
    "faulthandler.register(signal.SIGUSR2, all_threads=True); "
    "logging.getLogger('torch.distributed.elastic.rendezvous.dynamic_rendezvous')"
    ".setLevel(logging.DEBUG); "
    "sys.argv[0] = 'torchrun'; "
    "runpy.run_module('torch.distributed.run', run_name='__main__')"
)


class TorchrunJob:
    """A torchrun elastic job: one agent process per simulated node, all on 127.0.0.1."""

    def __init__(self, name: str, config: dict, work: Path, debug: bool = False) -> None:
        self.name, self.work, self.debug = name, work, debug
        self.extra, self.env = config["args"], config["env"]
        work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.rdzv_id = f"rescale-{name}-{os.getpid()}"
        self.ckpt = work / "ckpt.pt"
        self.log = JsonlTail(work / "steps.jsonl")
        self.agents: list[dict] = []  # {"proc", "started", "log", "index"}
        self.seen: set[int] = set()

    def command(self) -> list[str]:
        launcher = ["-c", DEBUG_RDZV] if self.debug else ["-m", "torch.distributed.run"]
        return [sys.executable, *launcher, "--nnodes", f"1:{MAX_WORKERS}",
                "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", self.rdzv_id,
                *self.extra, str(WORKER), "--ckpt", str(self.ckpt),
                "--step-log", str(self.log.path), "--epochs", EPOCHS]

    def start_agent(self) -> dict:
        index = len(self.agents)
        log_path = self.work / f"agent{index}.log"
        env = {**os.environ, "LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
               **self.env}
        started = time.time()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        agent = {"proc": proc, "started": started, "log": log_path, "index": index}
        self.agents.append(agent)
        return agent

    def live_agents(self) -> list[dict]:
        return [a for a in self.agents if a["proc"].poll() is None]

    def worker_pids(self, agent: dict) -> list[int]:
        return [p for p in descendants(agent["proc"].pid) if str(WORKER) in cmdline(p)]

    def track(self) -> None:
        for a in self.live_agents():
            self.seen |= set(descendants(a["proc"].pid))

    def stop(self) -> None:
        self.track()
        for a in self.agents:
            if a["proc"].poll() is None:
                kill_tree(a["proc"], extra=set())
        leftovers = [p for p in self.seen if alive(p) and str(WORKER) in cmdline(p)]
        kill_pids(leftovers, signal.SIGKILL)

    def wait_for(self, cond, timeout: float):
        """Poll the step log until ``cond(index, record)`` holds; the record's index or None."""
        deadline = time.time() + timeout
        checked = 0
        while time.time() < deadline:
            self.log.poll()
            self.track()
            recs = self.log.records
            for i in range(checked, len(recs)):
                if cond(i, recs[i]):
                    return i
            checked = len(recs)
            if not self.live_agents():
                return None
            time.sleep(0.02)
        return None


_LOG_LINE = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")


def agent_log_times(log_path: Path, text: str) -> list[float]:
    """When an agent logged a line containing ``text`` (its INFO log: local time, to the ms)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    year, found = dt.datetime.now().year, []
    for line in lines:
        m = _LOG_LINE.match(line)
        if m and text in line:
            mo, d, h, mi, s, us = map(int, m.groups())
            found.append(dt.datetime(year, mo, d, h, mi, s, us).timestamp())
    return found


def rdzv_started_at(log_path: Path) -> float | None:
    """When an agent began its first rendezvous."""
    times = agent_log_times(log_path, "Rendezvous'ing worker group")
    return times[0] if times else None


def rendezvous_states(job: TorchrunJob, since: float) -> str:
    """Which live agents entered a rendezvous after ``since`` and which of them got through it."""
    entered = completed = 0
    for a in job.live_agents():
        starts = [t for t in agent_log_times(a["log"], "Rendezvous'ing worker group")
                  if t >= since - 0.01]
        if starts:
            entered += 1
            done = agent_log_times(a["log"], "Rendezvous complete for workers")
            completed += any(t >= starts[-1] for t in done)
    return (f"{entered} of {len(job.live_agents())} live agents entered a rendezvous after the "
            f"change, {completed} of them got through it")


def run_torchrun(name: str, reps: int, work: Path, change_timeout: float,
                 kinds: tuple[str, ...] = KINDS, debug: bool = False) -> dict:
    job = TorchrunJob(name, TORCHRUN_CONFIGS[name], work / f"torchrun-{name}", debug)
    say(f"torchrun/{name}: {' '.join(job.command()[1:])}")
    changes: list[dict] = []
    notes: list[str] = []
    status = "ok"
    startup = None
    t0 = time.time()
    try:
        job.start_agent()
        time.sleep(0.3)
        job.start_agent()
        i = job.wait_for(lambda i, r: r["kind"] == "step" and r["world_size"] == 2,
                         change_timeout)
        if i is None:
            raise _Abort("the first world of 2 never trained")
        first = job.log.records[i]
        startup = {"first_step_s": round(first["time"] - t0, 3)}
        say(f"torchrun/{name}: world of 2 trains, {startup['first_step_s']:.1f} s after start")
        _settle(job, i, 2)
        for rep in range(reps):
            for kind in kinds:
                c = _torchrun_change(job, kind, change_timeout)
                c["rep"] = rep
                changes.append(c)
                say(f"torchrun/{name}: {kind} -> {fmt(c['latency_s'])} s "
                    f"(lost {c['steps_lost']}, pause {fmt(c['pause_s'])} s)"
                    + (f" [{c['note']}]" if c.get("note") else ""))
                if c["latency_s"] is None:
                    raise _Abort(f"{kind} (rep {rep}): {c.get('note')}")
                _settle(job, c["_index"], c["world_after"])
    except _Abort as exc:
        status = f"aborted: {exc}"
        notes.append(status)
        say(f"torchrun/{name}: {status}")
    finally:
        job.stop()
    for c in changes:
        c.pop("_index", None)
    return {"system": "torchrun", "config": name, "status": status,
            "wall_s": round(time.time() - t0, 1),
            "command": " ".join(["torchrun", *job.command()[3:]]),
            "changes": changes, "notes": notes, "startup": startup}


class _Abort(Exception):
    pass


def _settle(job: TorchrunJob, index: int, world: int, steps: int = 20,
            timeout: float = 15.0) -> None:
    """Let the new world run ``steps`` steps in one incarnation before the next change."""
    ref = job.log.records[index]
    job.wait_for(lambda i, r: i > index and r["kind"] == "step" and r["world_size"] == world
                 and r["proc_t0"] == ref["proc_t0"] and r["step"] >= ref["step"] + steps,
                 timeout)


def _torchrun_change(job: TorchrunJob, kind: str, timeout: float) -> dict:
    job.log.poll()
    live = job.live_agents()
    world_before = len(live)
    n_before = len(job.log.records)
    c: dict = {"kind": kind, "world_before": world_before}
    if kind == "join":
        agent = job.start_agent()
        t_req = agent["started"]
        world_after = world_before + 1
    elif kind == "leave":
        agent = live[-1]  # the newest agent; the first one hosts the c10d rendezvous store
        t_req = time.time()
        agent["proc"].send_signal(signal.SIGTERM)
        world_after = world_before - 1
    else:
        agent = live[1] if len(live) > 1 else live[0]
        workers = job.worker_pids(agent)
        if not workers:
            c.update(latency_s=None, note=f"agent{agent['index']} has no worker process",
                     world_after=world_before, steps_lost=None, pause_s=None, _index=None)
            return c
        t_req = time.time()
        kill_pids(workers, signal.SIGKILL)
        world_after = world_before
        c["killed_pids"] = workers
    c["agent"] = agent["index"]
    c["world_after"] = world_after
    i = job.wait_for(lambda i, r: r["kind"] == "step" and r["proc_t0"] > t_req
                     and r["world_size"] == world_after, timeout)
    recs = job.log.records
    if i is None:
        worlds = sorted({r["world_size"] for r in recs[n_before:] if r["proc_t0"] > t_req})
        c.update(latency_s=None, steps_lost=None, pause_s=None, _index=None,
                 note=f"no step in a world of {world_after} within {timeout:g} s"
                 + (f" (worlds seen after the change: {worlds})" if worlds else "")
                 + f"; {rendezvous_states(job, t_req)}")
        if job.debug:  # the debug launcher dumps every thread's stack on SIGUSR2
            kill_pids([a["proc"].pid for a in job.live_agents()], signal.SIGUSR2)
            time.sleep(1.0)
        return c
    first = recs[i]
    c["latency_s"] = round(first["time"] - t_req, 4)
    c["_index"] = i
    if kind == "join":
        rdzv = rdzv_started_at(agent["log"])
        if rdzv is not None:
            c["latency_from_rendezvous_s"] = round(first["time"] - rdzv, 4)
    old_steps = [r for r in recs[:i] if r["kind"] == "step" and r["proc_t0"] < t_req]
    last_old = old_steps[-1] if old_steps else None
    c["pause_s"] = round(first["time"] - last_old["time"], 4) if last_old else None
    # work lost: steps applied before a (re)start that the restarted world did again
    highest = max((r["step"] for r in recs[:n_before] if r["kind"] == "step"), default=0)
    lost, incarnations = 0, []
    for r in recs[n_before : i + 1]:
        if r["kind"] == "start":
            lost += max(0, highest - r["step"])
            if r["proc_t0"] > t_req:
                incarnations.append(r["world_size"])
        elif r["kind"] == "step":
            highest = max(highest, r["step"])
    c["steps_lost"] = lost
    c["steps_lost_max"] = lost + 1  # the step in flight when the workers were stopped
    c["restarts"] = len(incarnations)
    if len(incarnations) > 1:
        c["note"] = f"restarted {len(incarnations)} times (worlds {incarnations})"
    return c


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def _label(system: str, config: str) -> str:
    return system if system == "dyntrain" else f"torchrun/{config}"


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for run in runs:
        for kind in KINDS:
            cs = [c for c in run["changes"] if c["kind"] == kind]
            if not cs:
                continue
            ok = [c for c in cs if c.get("latency_s") is not None]
            row = {
                "system": run["system"], "config": run["config"], "kind": kind,
                "n": len(ok), "failed": len(cs) - len(ok),
                "failures": [c.get("note") for c in cs if c.get("latency_s") is None],
                "median_s": median([c["latency_s"] for c in ok]),
                "max_s": maximum([c["latency_s"] for c in ok]),
                "pause_median_s": median([c.get("pause_s") for c in ok]),
                "pause_max_s": maximum([c.get("pause_s") for c in ok]),
                "steps_lost_median": median([c.get("steps_lost") for c in ok]),
                "steps_lost_max": maximum([c.get("steps_lost") for c in ok]),
                "steps_lost_bound": maximum([c.get("steps_lost_max") for c in ok]),
            }
            if kind == "join":
                key = ("latency_from_process_start_s" if run["system"] == "dyntrain"
                       else "latency_from_rendezvous_s")
                row["alt_median_s"] = median([c.get(key) for c in ok])
                row["alt_max_s"] = maximum([c.get(key) for c in ok])
                row["alt_what"] = ("from the new worker's process start" if run["system"] ==
                                   "dyntrain" else "from the new agent's rendezvous attempt")
            rows.append(row)
    return rows


def _lost_text(row: dict) -> str:
    lo, hi, bound = row["steps_lost_median"], row["steps_lost_max"], row["steps_lost_bound"]
    if lo is None:
        return "-"
    text = f"{lo:g}" if lo == hi else f"{lo:g} (max {hi:g})"
    if bound is not None and bound > (hi or 0):
        text += f" + <={bound - hi:g} in flight"
    return text


def compute_ratios(rows: list[dict]) -> tuple[dict, dict]:
    dyn = {r["kind"]: r for r in rows if r["system"] == "dyntrain"}
    tr = [r for r in rows if r["system"] == "torchrun" and r["median_s"] is not None]
    ratios: dict = {"latency": {}, "pause": {}, "join_from_process_start": {}}
    for r in tr:
        d = dyn.get(r["kind"])
        if not d:
            continue
        if d["median_s"]:
            ratios["latency"].setdefault(r["kind"], {})[r["config"]] = round(
                r["median_s"] / d["median_s"], 1)
        if d["pause_median_s"] and r["pause_median_s"] is not None:
            ratios["pause"].setdefault(r["kind"], {})[r["config"]] = round(
                r["pause_median_s"] / d["pause_median_s"], 1)
        if r["kind"] == "join" and d.get("alt_median_s"):
            ratios["join_from_process_start"][r["config"]] = round(
                r["median_s"] / d["alt_median_s"], 1)
    goal = {"dyntrain_median_below_s": 1.0, "min_speedup_vs_torchrun_default": 20.0,
            "per_kind": {}}
    for kind in KINDS:
        d = dyn.get(kind)
        med = d["median_s"] if d else None
        speed = ratios["latency"].get(kind, {}).get("default")
        goal["per_kind"][kind] = {
            "dyntrain_median_s": med, "speedup_vs_default": speed,
            "below_1s": None if med is None else med < 1.0,
            "speedup_ok": None if speed is None else speed >= 20.0,
        }
    checks = [v[k] for v in goal["per_kind"].values() for k in ("below_1s", "speedup_ok")]
    goal["met"] = (False if any(c is False for c in checks)
                   else None if any(c is None for c in checks) else True)
    return ratios, goal


def print_report(rows: list[dict], runs: list[dict], ratios: dict, goal: dict) -> None:
    print()
    print("Rescale latency: membership change -> first step completed in the new world")
    head = (f"{'system/config':<23} {'change':<6} {'n':>3} {'median s':>9} {'max s':>8} "
            f"{'pause s':>8}  steps lost (median)")
    print(head)
    print("-" * len(head))
    for r in rows:
        n = f"{r['n']}" if not r["failed"] else f"{r['n']}+{r['failed']}F"
        line = (f"{_label(r['system'], r['config']):<23} {r['kind']:<6} {n:>3} "
                f"{fmt(r['median_s']):>9} {fmt(r['max_s']):>8} {fmt(r['pause_median_s']):>8}  "
                f"{_lost_text(r)}")
        if r["failed"]:
            line += f"  [F: {r['failures'][0]}]"
        print(line)
    print("  (n+kF: k changes never reached a step in the new world; see notes)")
    print()
    print("Joins on the other basis (median / max s):")
    for r in rows:
        if r["kind"] == "join" and r.get("alt_median_s") is not None:
            print(f"  {_label(r['system'], r['config']):<23} {fmt(r['alt_median_s']):>7} / "
                  f"{fmt(r['alt_max_s'])}  {r['alt_what']}")
    print()
    print("torchrun / dyntrain, ratio of medians (higher = dyntrain faster):")
    for what, title in (("latency", "latency"), ("pause", "pause (training stopped)")):
        for kind in KINDS:
            parts = [f"{cfg} {v:g}x" for cfg, v in ratios[what].get(kind, {}).items()]
            if parts:
                print(f"  {title:<25} {kind:<6} " + "  ".join(parts))
    if ratios["join_from_process_start"]:
        parts = [f"{cfg} {v:g}x" for cfg, v in ratios["join_from_process_start"].items()]
        print("  latency, both from process start (join): " + "  ".join(parts))
    print()
    print(f"Goal: dyntrain median < {goal['dyntrain_median_below_s']:g} s and >= "
          f"{goal['min_speedup_vs_torchrun_default']:g}x faster than torchrun defaults, per kind")
    verdict = {True: "ok", False: "MISSED", None: "not measured"}
    for kind, res in goal["per_kind"].items():
        speed = res["speedup_vs_default"]
        print(f"  {kind:<6} dyntrain median {fmt(res['dyntrain_median_s'])} s "
              f"({verdict[res['below_1s']]}); torchrun-default / dyntrain "
              f"{'-' if speed is None else f'{speed:g}x'} ({verdict[res['speedup_ok']]})")
    overall = {True: "MET", False: "NOT MET", None: "INCOMPLETE (not every kind measured)"}
    print(f"  overall: {overall[goal['met']]}")
    print()
    print("Notes:")
    for line in NOTES:
        print(f"  - {line}")
    for run in runs:
        label = _label(run["system"], run["config"])
        for note in run.get("notes", []):
            print(f"  - {label}: {note}")


NOTES = [
    "latency: dyntrain join = from the new worker's hello reaching the coordinator to the first "
    "step with it (its process start-up runs while the others keep training); torchrun join = "
    "from starting the new agent process, so it includes that agent's and the restarted "
    "workers' start-up. 'Joins on the other basis' gives each the other way round.",
    "leave = SIGTERM (dyntrain: the worker finishes its step and hands over; torchrun: SIGTERM to "
    "the newest agent, which stops its worker; the other workers then fail in gloo and their "
    "agents restart them). kill = SIGKILL of one worker process (torchrun: an agent's child, not "
    "the agent; every agent then restarts its workers).",
    "pause = last step completed in the old world -> first step in the new one.",
    "steps lost: dyntrain = steps_redone (graceful changes lose nothing more); for a crash the "
    "interrupted in-flight step is lost too (<= steps_redone + 1). torchrun = checkpointed "
    "steps recomputed after the restart (it checkpoints every step) + the step in flight when "
    "its workers were stopped (<= 1: torchrun stops every worker on every change).",
    "torchrun/default = torchrun's defaults except --max-restarts 100 (the default 0 ends the job "
    "on the first worker failure, so a kill or leave would not be survived) and "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (see torchrun/shared-store). torchrun/tuned = "
    "--monitor-interval 0.05, last_call_timeout=1 and keep-alive 1 s x 3 (timeouts are whole "
    "seconds); keep_alive_max_attempt=2 split the job into two worlds in a trial run.",
    "torchrun/shared-store = tuned, with torch's default rendezvous-store sharing left on: in "
    "torch 2.13 a node joining a running job deadlocks (the newcomer waits for MASTER_ADDR under "
    "the new round's key prefix, which only a newly elected rank 0 writes; rank 0 waits for the "
    "newcomer's role info), so the join never completes. Stack dumps (--debug-rdzv) show the "
    "newcomer in RendezvousStoreInfo.build (store.get) and rank 0 in _assign_worker_ranks "
    "(multi_get).",
    "The c10d rendezvous store lives in the first torchrun agent; it is never the one that leaves.",
    f"--workers/--nnodes 1:{MAX_WORKERS}: a join never fills the job to its maximum (a torchrun "
    "rendezvous that reaches max nodes completes without waiting last_call_timeout).",
    "All processes share this machine's cores; other processes running at the same time (see "
    "machine.loadavg_* in the JSON) slow process start-up and steps for both systems.",
]


# ---------------------------------------------------------------------------------------------

def _short(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions of the join/leave/kill cycle for dyntrain and tuned torchrun")
    ap.add_argument("--default-reps", type=int, default=1,
                    help="repetitions for torchrun with its defaults (~2 min each)")
    ap.add_argument("--quick", action="store_true",
                    help="one repetition each; torchrun defaults measured for the kill only")
    ap.add_argument("--only", default="dyntrain,tuned,shared-store,default",
                    help="comma list of dyntrain, tuned, shared-store (the join-hang probe), "
                    "default")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep run folders and logs here (default: a temporary folder, removed)")
    ap.add_argument("--tuned-rdzv-conf", default=None,
                    help="override the tuned configuration's --rdzv-conf")
    ap.add_argument("--debug-rdzv", action="store_true",
                    help="torchrun agents log their rendezvous at DEBUG level (see --workdir)")
    args = ap.parse_args(argv)
    if args.tuned_rdzv_conf:
        conf = TORCHRUN_CONFIGS["tuned"]["args"]
        conf[conf.index("--rdzv-conf") + 1] = args.tuned_rdzv_conf
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    reps, default_reps = (1, 1) if args.quick else (args.reps, args.default_reps)
    default_kinds = ("kill",) if args.quick else KINDS

    if args.quick:
        only.discard("shared-store")

    def on_sigterm(signum, frame):  # let the finally blocks stop every process we started
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rescale_latency_"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    load_before = os.getloadavg()
    runs = []
    try:
        if "dyntrain" in only:
            runs.append(run_dyntrain(reps, work, timeout=60 + 25 * reps))
        if "tuned" in only:
            runs.append(run_torchrun("tuned", reps, work, change_timeout=45,
                                     debug=args.debug_rdzv))
        if "shared-store" in only:
            runs.append(run_torchrun("shared-store", 1, work, change_timeout=25,
                                     kinds=("join",), debug=args.debug_rdzv))
        if "default" in only:
            runs.append(run_torchrun("default", default_reps, work, change_timeout=120,
                                     kinds=default_kinds, debug=args.debug_rdzv))
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = summarize(runs)
    ratios, goal = compute_ratios(rows)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_report(rows, runs, ratios, goal)
    report = buf.getvalue()
    print(report, end="")
    result = {
        "benchmark": "rescale_latency",
        "machine": {**machine_info(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "command": " ".join([_short(sys.executable), *sys.argv]) if argv is None else argv,
        "settings": {"reps": reps, "default_reps": default_reps, "quick": args.quick,
                     "max_workers": MAX_WORKERS, "torchrun_configs": TORCHRUN_CONFIGS},
        "wall_s": round(time.time() - t0, 1),
        "summary": rows, "ratios": ratios, "goal": goal, "notes": NOTES,
        "runs": [{k: v for k, v in r.items() if k != "raw_events"} for r in runs],
        "dyntrain_events": next((r["raw_events"] for r in runs if r["system"] == "dyntrain"),
                                None),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".txt").write_text(
        f"{result['machine']['date']}  {result['command']}\n{report}")
    print(f"\nwrote {args.out} and {args.out.with_suffix('.txt').name} "
          f"({result['wall_s']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
