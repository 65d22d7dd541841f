"""The simulator checked against the live service: one job mix, run for real and simulated.

``run_live`` starts ``dyntrain server --policy P`` (SQLite, local worker processes, a pool of
warm workers), creates an on-demand environment with a fixed number of slots and a spot
environment that replays a capacity trace (CSV), one queue over both (spot first), and submits
elastic digits jobs at their arrival times (seconds after the trace started), each slowed to a
known scaling curve with ``--step-delay`` (a sleep per chunk, ``chunks`` chunks per step). It
waits for every job and returns each job's completion time, submit to end, as the service
recorded it.

``simulate`` gives the simulator's engine the same inputs (the two environments, the jobs with
their arrivals, work and curves, the start-up and re-formation times) and returns each job's
predicted completion time; ``compare_jobs`` pairs them up.

Used by ``bench/sim_vs_live.py`` and its shorter version in the test suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dyntrain.elastic.runs.log import read_metrics
from dyntrain.elastic.runs.rows import MetricsRow
from dyntrain.service.core.allocation import policy_by_name
from dyntrain.service.core.capacity import parse_trace, trace_from_points
from dyntrain.service.core.model import CapacityType, JobStatus
from dyntrain.service.core.speedup import SpeedupModel
from dyntrain.sim.engine import EnvSpec, SimConfig, run_simulation
from dyntrain.sim.jobs import JobSpec, JobTrace, QueueSpec

SLOT = {"cpus": 0.1, "gpus": 0, "memory_mib": 512}
WARM_READY = re.compile(r"dyntrain warm worker (\d+) ready")
SPOT_PRICE, ON_DEMAND_PRICE = 0.3, 1.0


@dataclass(frozen=True)
class LiveJob:
    """An elastic digits job of the mix: ``steps`` steps of ``global_batch`` samples cut into
    ``global_batch // chunk_size`` chunks, each chunk sleeping ``step_delay`` seconds."""

    name: str
    arrival_s: float
    global_batch: int
    chunk_size: int
    step_delay: float
    steps: int
    min_workers: int = 1
    max_workers: int = 6

    @property
    def chunks(self) -> int:
        return self.global_batch // self.chunk_size

    @property
    def samples(self) -> int:
        return self.steps * self.global_batch

    def command(self) -> list[str]:
        return [sys.executable, "-m", "dyntrain.workloads.digits", "--model", "mlp",
                "--global-batch", str(self.global_batch), "--chunk-size", str(self.chunk_size),
                "--step-delay", str(self.step_delay), "--max-steps", str(self.steps),
                "--epochs", "1000000", "--checkpoint-every", "25", "--lr-schedule", "constant"]

    def model(self, chunk_s: float = 0.0, step_s: float = 0.0,
              comm_s: float = 0.0) -> SpeedupModel:
        """The curve the step delay gives: a worker's share of the chunks, each its sleep plus
        ``chunk_s`` of computing; ``step_s`` per step that no worker count shortens (the
        optimizer, the coordinator) and ``comm_s`` per further worker (the all-reduce)."""
        g = self.global_batch
        return SpeedupModel(serial=step_s / g, parallel=self.chunks * (self.step_delay + chunk_s)
                            / g, comm=comm_s / g, chunks=self.chunks)

    def to_spec(self, model: SpeedupModel, start_s: float, reform_s: float) -> JobSpec:
        return JobSpec(self.name, self.arrival_s, float(self.samples), model, self.min_workers,
                       self.max_workers, start_s, reform_s, "mix")


@dataclass(frozen=True)
class LiveSetup:
    """The capacity of a live run: ``on_demand_slots`` always there, spot following
    ``spot_csv`` (offset_s,slots)."""

    spot_csv: str
    on_demand_slots: int = 1

    def envs(self) -> list[EnvSpec]:
        spot = parse_trace(self.spot_csv, "spot")
        fixed = trace_from_points([(0.0, self.on_demand_slots)], source="on-demand")
        return [EnvSpec("spot", spot, CapacityType.SPOT, SPOT_PRICE),
                EnvSpec("od", fixed, CapacityType.ON_DEMAND, ON_DEMAND_PRICE)]


def _server(state: Path, policy: str, warm: int) -> tuple[subprocess.Popen, str, Path]:
    log = state / "server.log"
    state.mkdir(parents=True, exist_ok=True)
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "dyntrain.cli.main", "server", "--port", "0",
                             "--state-dir", str(state), "--grace-seconds", "10",
                             "--policy", policy, "--warm-workers", str(warm)],
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out.close()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            found = re.findall(r"listening on (http://\S+)", log.read_text())
            if found:
                return proc, found[-1], log
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    except BaseException:  # interrupted: the server and its workers go too
        _stop(proc)
        raise
    _stop(proc)
    raise RuntimeError(f"the server did not start:\n{log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server and every worker it started (its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


@dataclass
class LiveResult:
    """Per job: completion time (submit to end), and the world sizes its steps ran at."""

    jct_s: dict[str, float]
    steps_at_size: dict[str, dict[int, int]]
    step_seconds: dict[str, dict[int, float]]  # median seconds per step at each world size
    wall_s: float


def _prime(c, state: Path, warm: int, timeout_s: float = 300.0) -> None:
    """The warm pool starts with the first worker that asks for one: a one-step job on the
    on-demand slot does, then the pool fills up while nothing else runs."""
    if warm <= 0:
        return
    job = LiveJob("prime", 0, 8, 8, 0.0, 1, 1, 1)
    primer = c.submit(queue="mix", command=job.command(), resources=SLOT, workers=(1, 1),
                      name="prime")["id"]
    deadline = time.monotonic() + timeout_s
    while not JobStatus(c.get_job(primer)["status"]).is_terminal() or \
            _warm_ready(state) < warm:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the warm pool of {warm} was not ready after {timeout_s:g} s")
        time.sleep(0.5)


def _metrics(state: Path, job_id: str) -> list[MetricsRow]:
    """The job's applied steps, from its run folder where the service keeps it (a line that is
    not a step row is passed over)."""
    from dyntrain.service.engine.runfolders import RunFolders  # the service's folder rule

    return read_metrics(RunFolders(state / "runs").run_dir(job_id), on_bad=lambda _: None)


def _warm_ready(state: Path) -> int:
    log = state / "executor" / "workers" / "supervisor.log"
    return len(WARM_READY.findall(log.read_text())) if log.is_file() else 0


def run_live(jobs: list[LiveJob], setup: LiveSetup, policy: str, state: Path,
             warm: int = 8, timeout_s: float = 900.0) -> LiveResult:
    """The mix on a real ``dyntrain server`` (module doc), with ``warm`` warm workers (Python
    with torch imported) ready before the trace starts, so that a worker's start-up is short."""
    from dyntrain.service.client import Client

    started = time.monotonic()
    proc, url, log = _server(state, policy, warm)
    try:
        with Client(url, timeout=60) as c:
            c.create_compute_environment(name="spot", capacity_type="SPOT",
                                         price_per_slot_hour=SPOT_PRICE, slot=SLOT, min_slots=0,
                                         desired_slots=0, max_slots=64)
            c.create_compute_environment(name="od", capacity_type="ON_DEMAND",
                                         price_per_slot_hour=ON_DEMAND_PRICE, slot=SLOT,
                                         min_slots=0, desired_slots=setup.on_demand_slots,
                                         max_slots=setup.on_demand_slots)
            c.create_job_queue(name="mix", compute_environments=["spot", "od"])
            _prime(c, state, warm)
            c.set_capacity_trace("spot", setup.spot_csv)
            t0 = time.time()
            ids: dict[str, str] = {}
            for job in sorted(jobs, key=lambda j: j.arrival_s):
                time.sleep(max(0.0, t0 + job.arrival_s - time.time()))
                ids[job.name] = c.submit(queue="mix", command=job.command(), resources=SLOT,
                                         workers=(job.min_workers, job.max_workers),
                                         name=job.name)["id"]
            deadline = time.monotonic() + timeout_s
            done: dict[str, dict] = {}
            while len(done) < len(ids):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"jobs not done after {timeout_s:g} s: "
                                       f"{sorted(set(ids) - set(done))}\n{log.read_text()[-3000:]}")
                for name, job_id in ids.items():
                    if name in done:
                        continue
                    got = c.get_job(job_id)
                    status = JobStatus(got["status"])
                    if status is JobStatus.FAILED:
                        raise RuntimeError(f"job {name} failed: {got.get('status_reason')}")
                    if status is JobStatus.SUCCEEDED:
                        done[name] = got
                time.sleep(0.5)
    finally:
        _stop(proc)
    result = LiveResult({}, {}, {}, time.monotonic() - started)
    for name, got in done.items():
        result.jct_s[name] = got["stopped_at"] - got["created_at"]
        rows = _metrics(state, ids[name])
        counts: dict[int, int] = {}
        seconds: dict[int, list[float]] = {}
        for prev, row in zip(rows, rows[1:], strict=False):
            w = row.world_size
            counts[w] = counts.get(w, 0) + 1
            if (prev.world_size == w and row.step == prev.step + 1
                    and row.time is not None and prev.time is not None):
                seconds.setdefault(w, []).append(row.time - prev.time)
        result.steps_at_size[name] = dict(sorted(counts.items()))
        result.step_seconds[name] = {w: sorted(v)[len(v) // 2] for w, v in sorted(seconds.items())}
    return result


def simulate(specs: list[JobSpec], setup: LiveSetup, policy: str,
             leave_s: float = 1.0) -> dict[str, float]:
    """Each job's completion time as the simulator predicts it for the same inputs
    (``LiveJob.to_spec``: its arrival, work, curve, start-up and re-formation times)."""
    result = run_simulation(setup.envs(), JobTrace(tuple(specs), (QueueSpec("mix"),)),
                            policy_by_name(policy),
                            SimConfig(pass_every_s=1.0, leave_s=leave_s))
    return {j.id: j.jct_s for j in result.jobs}


def compare_jobs(live: dict[str, float], predicted: dict[str, float]) -> list[dict]:
    """One row per job: live and predicted completion times and the prediction's error."""
    return [{"job": name, "live_s": live[name], "predicted_s": predicted[name],
             "error": (predicted[name] - live[name]) / live[name]} for name in live]
