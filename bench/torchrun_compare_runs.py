"""The three ways ``bench/torchrun_compare.py`` runs the digits job, each through the same capacity
trace, and the static runs their final models are compared with.

A mode is started, ticked until its job ends, and told each change of the trace when the
training reaches the change's progress (``follow_trace``):

* ``TorchrunAlone``: torchrun's elastic agent (c10d rendezvous, tuned timeouts, one agent per
  simulated node on 127.0.0.1, as ``bench/rescale_torchrun.py``) running ``bench/digits_ddp.py``;
  capacity added = one more agent, taken back = SIGTERM to the newest agent, a kill = SIGKILL to
  the second agent's worker.
* ``ServiceMode``: a SQLite store, a ``LocalExecutor`` (one warm worker, as ``dyntrain server``'s
  default) and a ``Controller`` in this process, a SPOT environment whose ``desired_slots`` the
  trace changes, a kill = SIGKILL to the newest worker. With ``launcher="torchrun"`` it runs
  ``bench/digits_ddp.py`` (dyntrain's torchrun mode), without it the built-in digits workload
  (``ElasticTrainer``, the exact mode).

Each mode gives its steps as ``{"time", "world", "progress" (epochs), "inc"}`` (``inc``: the gang
or generation that ran the step), its restarts, the samples it trained and threw away, its
worker-seconds and cost, and its final model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _common import JsonlTail, free_port, kill_pids
from dyntrain.service.core.model import (
    CapacityType,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    Resources,
)
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.controller import Controller
from dyntrain.service.executors.local import LocalExecutor
from dyntrain.service.store import Store
from rescale_torchrun import TORCHRUN_CONFIGS, TorchrunJob

BENCH = Path(__file__).resolve().parent
DDP_SCRIPT = BENCH / "digits_ddp.py"
SLOT = Resources(0.25, 0, 256)
PRICE_PER_SLOT_HOUR = 0.3  # the SPOT environment's price
MAX_WORKERS = 4  # --workers 1:4 / --nnodes 1:4: a join never fills the job
GRACE_S = 10.0
TICK_S = 0.02
WORLD_CHANGE = {"join": 1, "leave": -1, "kill": 0}


@dataclass(frozen=True)
class Settings:
    """What every mode runs: the job's length and speed, and the capacity trace."""

    epochs: int
    chunk_delay: float  # extra seconds per chunk of 8 samples a worker trains (a heavier model)
    trace: tuple[tuple[str, float], ...]  # (join | leave | kill, progress in epochs)
    start_world: int = 2
    timeout_s: float = 300.0


def ddp_args(s: Settings, checkpoint_dir: Path, step_log: Path) -> list[str]:
    return ["--epochs", str(s.epochs), "--checkpoint-dir", str(checkpoint_dir),
            "--step-log", str(step_log), "--chunk-delay", str(s.chunk_delay)]


def exact_args(s: Settings) -> list[str]:
    return ["-m", "dyntrain.workloads.digits", "--epochs", str(s.epochs),
            "--step-delay", str(s.chunk_delay)]


def ddp_steps(records: list[dict]) -> list[dict]:
    return [{"time": r["time"], "world": r["world_size"], "progress": r["progress"],
             "inc": r["proc_t0"]} for r in records if r["kind"] == "step"]


def ddp_restarts(records: list[dict]) -> list[float]:
    """When each gang after the first was ready to train (rank 0's start lines)."""
    starts = sorted(r["time"] for r in records if r["kind"] == "start" and r["rank"] == 0)
    return starts[1:]


def ddp_gang_starts(records: list[dict]) -> list[dict]:
    """Each rank's start: when its process began running the script (``proc_t0``) and when it
    was past the gang's first barrier, ready to train (``time``)."""
    return [{"rank": r["rank"], "proc_t0": r["proc_t0"], "time": r["time"],
             "warm": r.get("torch_preloaded", False)} for r in records if r["kind"] == "start"]


def ddp_rollbacks(records: list[dict]) -> list[dict]:
    """Work thrown away: at each gang's start, the steps an earlier gang trained in the epochs
    it resumes from (past the last checkpoint), which it trains again."""
    steps: list[dict] = []
    out = []
    for r in sorted(records, key=lambda r: r["time"]):
        if r["kind"] == "step":
            steps.append({**r, "undone": False})
        elif r["kind"] == "start" and r["rank"] == 0:
            gone = [x for x in steps if not x["undone"] and x["proc_t0"] != r["proc_t0"]
                    and x["epoch"] >= r["epoch"]]
            for x in gone:
                x["undone"] = True
            if gone:
                out.append({"time": r["time"], "steps": len(gone),
                            "samples": sum(x["samples"] for x in gone)})
    return out


def follow_trace(mode, s: Settings) -> dict:
    """Run ``mode`` to its end; each change of the trace fires once training reached its
    progress and the change before it took effect (a step at the new size by a new gang or
    generation)."""
    pending = list(s.trace)
    world, changes, status = s.start_world, [], "timeout"
    t0 = time.time()
    mode.start()
    try:
        while time.time() - t0 < s.timeout_s:
            mode.tick()
            if mode.finished():
                status = "finished"
                break
            steps = mode.steps()
            if not steps or not pending:
                continue
            if changes and not _took_effect(changes[-1], steps):
                continue
            if steps[-1]["progress"] >= pending[0][1]:
                kind, at = pending.pop(0)
                last = steps[-1]
                t = mode.change(kind)
                world += WORLD_CHANGE[kind]
                changes.append({"kind": kind, "trigger": at, "time": t, "world_after": world,
                                "inc": last["inc"], "progress_at_change": last["progress"]})
    finally:
        ended = mode.ended_at or time.time()
        mode.stop()
    return {"status": status, "wall_s": round(ended - t0, 2), "t0": t0, "changes": changes,
            "not_reached": [k for k, _ in pending]}


def _took_effect(change: dict, steps: list[dict]) -> bool:
    return any(x["time"] > change["time"] and x["inc"] != change["inc"]
               and x["world"] == change["world_after"] for x in reversed(steps))


# ---------------------------------------------------------------------------------------------


class TorchrunAlone:
    """(a) torchrun's elastic agent, one agent per simulated node."""

    label = "torchrun alone"

    def __init__(self, work: Path, s: Settings) -> None:
        self.s, self.checkpoint_dir = s, work / "ckpt"
        self.job = TorchrunJob("compare", TORCHRUN_CONFIGS["tuned"], work, script=DDP_SCRIPT,
                               script_args=ddp_args(s, work / "ckpt", work / "steps.jsonl"))
        self.exited: dict[int, float] = {}
        self.ended_at: float | None = None

    def start(self) -> None:
        for _ in range(self.s.start_world):
            self.job.start_agent()

    def tick(self) -> None:
        time.sleep(TICK_S)
        self.job.log.poll()
        self.job.track()
        for a in self.job.agents:
            if a["index"] not in self.exited and a["proc"].poll() is not None:
                self.exited[a["index"]] = time.time()

    def steps(self) -> list[dict]:
        return ddp_steps(self.job.log.records)

    def finished(self) -> bool:
        if self.ended_at is None and len(self.exited) == len(self.job.agents):
            self.ended_at = max(self.exited.values())
        return self.ended_at is not None

    def change(self, kind: str) -> float:
        live = self.job.live_agents()
        if kind == "join":
            return self.job.start_agent()["started"]
        if kind == "leave":  # the newest agent: the first one hosts the rendezvous store
            t = time.time()
            live[-1]["proc"].send_signal(signal.SIGTERM)
            return t
        workers = self.job.worker_pids(live[1])
        if not workers:
            raise RuntimeError(f"agent{live[1]['index']} has no worker process to kill")
        t = time.time()
        kill_pids(workers, signal.SIGKILL)
        return t

    def stop(self) -> None:
        self.job.stop()

    def summary(self) -> dict:
        records = self.job.log.records
        now = time.time()
        agent_s = sum(self.exited.get(a["index"], now) - a["started"] for a in self.job.agents)
        pids = {r["pid"] for r in records if r["kind"] == "start"}
        return {"restarts": ddp_restarts(records), "rollbacks": ddp_rollbacks(records),
                "gang_starts": ddp_gang_starts(records),
                "worker_processes": len(pids), "worker_seconds": round(agent_s, 2),
                "worker_seconds_basis": "agent (node) lifetimes",
                "cost": agent_s * PRICE_PER_SLOT_HOUR / 3600,
                "final_model": self.checkpoint_dir / "checkpoint.pt",
                "final_epoch": _checkpoint_epoch(self.checkpoint_dir / "checkpoint.pt"),
                "command": " ".join(["torchrun", *self.job.command()[3:]])}


class ServiceMode:
    """(b) dyntrain's torchrun mode or (c) its exact mode, on an in-process service."""

    def __init__(self, work: Path, s: Settings, launcher: str | None) -> None:
        self.s, self.work, self.launcher = s, work, launcher
        self.label = "dyntrain torchrun mode" if launcher else "dyntrain exact mode"
        self.store = Store(f"sqlite:///{work / 'db.sqlite'}")
        self.store.create_all()
        self.store.environments.create_compute_environment(ComputeEnvironmentSpec(
            "spot", CapacityType.SPOT, PRICE_PER_SLOT_HOUR, SLOT, 0, s.start_world, 8))
        self.store.environments.create_job_queue(JobQueueSpec("q", 1, ("spot",)))
        self.executor = LocalExecutor(work / "executor", cpus=2, memory_mib=16_384,
                                      warm_workers=1)
        self.c = Controller(self.store, self.executor, ControllerConfig(
            work / "runs", grace_seconds=GRACE_S, schedule_every=0.05))
        self.slots, self.job, self.tail = s.start_world, None, None
        self.ended_at: float | None = None
        if launcher:
            self.checkpoint_dir = work / "ckpt"
            self.command = [sys.executable, str(DDP_SCRIPT),
                            *ddp_args(s, self.checkpoint_dir, work / "steps.jsonl")]
        else:
            self.command = [sys.executable, *exact_args(s)]

    def start(self) -> None:
        self.job = self.store.jobs.submit(queue="q", command=self.command, resources=SLOT,
                                     workers=(1, MAX_WORKERS), launcher=self.launcher)
        self.tail = JsonlTail(self.work / "steps.jsonl" if self.launcher
                              else self.c.run_dir(self.job.id) / "metrics.jsonl")

    def tick(self) -> None:
        self.c.step()
        self.tail.poll()
        time.sleep(TICK_S)

    def steps(self) -> list[dict]:
        if self.launcher:
            return ddp_steps(self.tail.records)
        return [{"time": r["time"], "world": r["world_size"],
                 "progress": r["step"] * self.s.epochs / r["total_steps"], "inc": r["gen"]}
                for r in self.tail.records if "step" in r]

    def finished(self) -> bool:
        if self.ended_at is None and self.store.jobs.get_job(self.job.id).status.is_terminal():
            self.ended_at = time.time()
        return self.ended_at is not None

    def change(self, kind: str) -> float:
        if kind == "kill":
            victim = self.store.workers.list_workers(self.job.id, active=True)[-1]
            t = time.time()
            self.c.executor.signal(victim.id, "KILL")
            return t
        self.slots += WORLD_CHANGE[kind]
        t = time.time()
        self.store.environments.update_compute_environment("spot", desired_slots=self.slots)
        return t

    def stop(self) -> None:
        try:
            if not self.store.jobs.get_job(self.job.id).status.is_terminal():
                self.c.terminate(self.job.id)
                deadline = time.monotonic() + 60
                while (time.monotonic() < deadline
                       and not self.store.jobs.get_job(self.job.id).status.is_terminal()):
                    self.c.step()
                    time.sleep(TICK_S)
        finally:
            for w in self.store.workers.list_workers(self.job.id, active=True):
                try:
                    self.c.executor.signal(w.id, "KILL")
                except Exception:  # noqa: BLE001 - already gone
                    pass
            self.executor.shutdown()

    def summary(self) -> dict:
        job = self.store.jobs.get_job(self.job.id)
        usage = self.store.workers.job_usage(self.job.id)
        workers = self.store.workers.list_workers(self.job.id, active=False)
        out = {"status": job.status.value,
               "attempts": [a.reason for a in self.store.jobs.list_attempts(self.job.id)],
               "worker_processes": len(workers),
               "worker_seconds": round(sum(u.worker_seconds for u in usage), 2),
               "worker_seconds_basis": "the service's usage records (worker lifetimes)",
               "cost": sum(u.worker_seconds * u.price_per_slot_hour / 3600 for u in usage),
               "command": " ".join(self.command[1:])}
        if self.launcher:
            records = self.tail.records
            out.update(restarts=ddp_restarts(records), rollbacks=ddp_rollbacks(records),
                       gang_starts=ddp_gang_starts(records),
                       worker_stops=sorted(w.stopped_at for w in workers
                                           if w.stopped_at is not None),
                       final_model=self.checkpoint_dir / "checkpoint.pt",
                       final_epoch=_checkpoint_epoch(self.checkpoint_dir / "checkpoint.pt"))
        else:
            run = self.c.run_dir(self.job.id)
            events = JsonlTail(run / "events.jsonl")
            events.poll()
            rows = [r for r in self.tail.records if "step" in r]
            out.update(restarts=[], exact_events=events.records, final_model=run / "final.pt",
                       final_step=rows[-1]["step"] if rows else None,
                       total_steps=rows[-1]["total_steps"] if rows else None)
        self.store.close()
        return out


def _checkpoint_epoch(path: Path) -> int | None:
    import torch

    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)["epoch"]


# ---------------------------------------------------------------------------------------------


def static_ddp(work: Path, s: Settings) -> dict:
    """The plain DDP script under torchrun at a fixed world of ``start_world``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(s.start_world), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(DDP_SCRIPT),
           *ddp_args(s, work / "ckpt", work / "steps.jsonl")]
    return _static(cmd, work, work / "ckpt" / "checkpoint.pt", s)


def static_exact(work: Path, s: Settings) -> dict:
    """The exact mode's digits workload at a fixed world of ``start_world``."""
    n = s.start_world
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", f"{n}:{n}",
           "--out", str(work / "run"), "--quiet", *exact_args(s)]
    return _static(cmd, work, work / "run" / "final.pt", s)


def _static(cmd: list[str], work: Path, final: Path, s: Settings) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    with open(work / "output.log", "wb") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                              stdin=subprocess.DEVNULL, timeout=s.timeout_s, check=False)
    wall = time.time() - t0
    head = "torchrun" if cmd[2] == "torch.distributed.run" else "dyntrain"
    return {"status": "finished" if proc.returncode == 0 else f"exit code {proc.returncode}",
            "wall_s": round(wall, 2), "final_model": final, "command": " ".join([head, *cmd[3:]]),
            "worker_seconds": round(wall * s.start_world, 2),
            "worker_seconds_basis": "wall time x workers",
            "cost": wall * s.start_world * PRICE_PER_SLOT_HOUR / 3600}
