"""The torchrun side of ``bench/rescale_latency.py``: torchrun's elastic agent (c10d rendezvous,
one agent per simulated node on 127.0.0.1) running ``bench/torchrun_worker.py``, and each
membership change made and timed on it."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from _common import (
    JsonlTail,
    alive,
    cmdline,
    descendants,
    fmt,
    free_port,
    kill_pids,
    kill_tree,
)

BENCH = Path(__file__).resolve().parent
WORKER = BENCH / "torchrun_worker.py"
MAX_WORKERS = 4  # headroom above the largest world used (3): a join never fills the job up
EPOCHS = "1000"  # far more steps than a run takes; every run is stopped from outside
KINDS = ("join", "leave", "kill")

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

    def __init__(self, name: str, config: dict, work: Path, debug: bool = False,
                 script: Path = WORKER, script_args: list[str] | None = None) -> None:
        """Args:
            name: the configuration's name (in the rendezvous id).
            config: ``{"args": torchrun's extra arguments, "env": extra environment}``.
            work: a folder for the agents' logs, the checkpoint and the step log.
            debug: log the rendezvous at DEBUG level (``DEBUG_RDZV``).
            script: the training script every agent runs (``bench/torchrun_worker.py``).
            script_args: its arguments; by default ``torchrun_worker.py``'s, with the step log
                ``work/steps.jsonl`` (which ``log`` tails) and more epochs than a run takes.
        """
        self.name, self.work, self.debug = name, work, debug
        self.extra, self.env = config["args"], config["env"]
        work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.rdzv_id = f"rescale-{name}-{os.getpid()}"
        self.ckpt = work / "ckpt.pt"
        self.log = JsonlTail(work / "steps.jsonl")
        self.script = script
        self.script_args = script_args if script_args is not None else [
            "--ckpt", str(self.ckpt), "--step-log", str(self.log.path), "--epochs", EPOCHS]
        self.agents: list[dict] = []  # {"proc", "started", "log", "index"}
        self.seen: set[int] = set()

    def command(self) -> list[str]:
        launcher = ["-c", DEBUG_RDZV] if self.debug else ["-m", "torch.distributed.run"]
        return [sys.executable, *launcher, "--nnodes", f"1:{MAX_WORKERS}",
                "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", self.rdzv_id,
                *self.extra, str(self.script), *self.script_args]

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
        return [p for p in descendants(agent["proc"].pid) if str(self.script) in cmdline(p)]

    def track(self) -> None:
        for a in self.live_agents():
            self.seen |= set(descendants(a["proc"].pid))

    def stop(self) -> None:
        self.track()
        for a in self.agents:
            if a["proc"].poll() is None:
                kill_tree(a["proc"], extra=set())
        leftovers = [p for p in self.seen if alive(p) and str(self.script) in cmdline(p)]
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
