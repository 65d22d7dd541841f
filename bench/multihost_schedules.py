"""Random fault schedules across 3-4 hosts for ``bench/multihost.py``, each against the static run.

A schedule is a pure function of its seed (``make_schedule``): 3 or 4 hosts and 3-5 faults at
times counted from the moment every host's worker trains. A fault is one of

* ``partition``: the host's link goes down for ``duration`` seconds, then up (``heal``);
* ``freeze``: every process of the host is SIGSTOPped for ``duration`` seconds, then SIGCONTed;
* ``lose``: the host's link goes down and every process on it is SIGKILLed; ``duration``
  seconds later the machine is back, empty, and a new ``dyntrain worker`` joins from it (a new
  host replacing the lost one).

A duration is either a blip (30-60 % of the failure timeout: nobody should be evicted) or
longer than the failure timeout by 1-6 s (evicted; the worker comes back and starts over as a
new member). Faults may overlap on different hosts; a host has one fault at a time. Host 0 runs
the launcher (the coordinator and one local worker): it is partitioned or frozen, never lost (a
lost coordinator ends the job by design; resuming it is another test).

``play`` runs one schedule on a bed: ``dyntrain run --workers 1:H --nproc 1`` on host 0 with the
ledger workload (held slow, 50 ms more per chunk, until the schedule is over and every host's
worker trains again), ``dyntrain worker`` on hosts 1..H-1, the faults at their times; then it
lets the job finish and checks the final model against the static run (bitwise), the ledger's
counts (samples applied twice or never) and what is left on the hosts once every process should
have ended.
"""

from __future__ import annotations

import collections
import enum
import random
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dyntrain.testing.hosts import HostBed
from dyntrain.testing.wait import wait_until
from multihost_jobs import CONNECT_TIMEOUT, LEDGER, Job

#: seconds from a schedule's start by which its job must have ended
SCHEDULE_BOUND = 420.0


class FaultKind(enum.Enum):
    PARTITION = "partition"
    FREEZE = "freeze"
    LOSE = "lose"


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: ``kind`` on ``host`` at ``at`` s for ``duration`` s."""

    at: float
    kind: FaultKind
    host: int
    duration: float

    def describe(self) -> str:
        what = {FaultKind.PARTITION: "partition", FaultKind.FREEZE: "freeze",
                FaultKind.LOSE: "lose"}[self.kind]
        then = "replaced after" if self.kind is FaultKind.LOSE else "for"
        return f"{self.at:.1f}s {what} host{self.host} ({then} {self.duration:.1f} s)"


@dataclass(frozen=True)
class Schedule:
    """A seed's hosts and faults."""

    seed: int
    hosts: int
    faults: tuple[Fault, ...]

    def describe(self) -> str:
        return f"{self.hosts} hosts: " + ", ".join(f.describe() for f in self.faults)

    def to_json(self) -> dict:
        return {"seed": self.seed, "hosts": self.hosts,
                "faults": [{**asdict(f), "kind": f.kind.value} for f in self.faults]}


def make_schedule(seed: int, failure_timeout: float) -> Schedule:
    """The schedule of ``seed`` (see the module docstring): the same seed, the same schedule.

    Args:
        seed: the schedule's seed.
        failure_timeout: the job's heartbeat timeout; durations are chosen around it.
    """
    rng = random.Random(seed)
    hosts = rng.choice((3, 4))
    busy_until = [0.0] * hosts
    faults, at = [], rng.uniform(1.0, 3.0)
    for _ in range(rng.randint(3, 5)):
        free = [h for h in range(hosts) if busy_until[h] <= at]
        if not free:
            at = min(busy_until)
            free = [h for h in range(hosts) if busy_until[h] <= at]
        host = rng.choice(free)
        kinds = [FaultKind.PARTITION, FaultKind.FREEZE] + ([FaultKind.LOSE] if host else [])
        kind = rng.choice(kinds)
        if kind is FaultKind.LOSE:
            duration = rng.uniform(1.0, 5.0)
        elif rng.random() < 0.3:
            duration = failure_timeout * rng.uniform(0.3, 0.6)
        else:
            duration = failure_timeout + rng.uniform(1.0, 6.0)
        faults.append(Fault(round(at, 1), kind, host, round(duration, 1)))
        busy_until[host] = round(at, 1) + round(duration, 1)
        at = round(at, 1) + rng.uniform(1.5, 6.0)
    return Schedule(seed, hosts, tuple(faults))


def _steps(schedule: Schedule) -> list[tuple[float, str, int]]:
    """The schedule as timed actions: (at, action, host), in order."""
    undo = {FaultKind.PARTITION: "heal", FaultKind.FREEZE: "thaw", FaultKind.LOSE: "replace"}
    acts = [(f.at, f.kind.value, f.host) for f in schedule.faults]
    acts += [(round(f.at + f.duration, 1), undo[f.kind], f.host) for f in schedule.faults]
    return sorted(acts, key=lambda a: (a[0], a[1] not in ("heal", "thaw", "replace")))


@dataclass
class Reference:
    """The static run the schedules are compared with.

    Args:
        folder: its run folder (``final.pt``).
        counts: how often each sample must have fed an applied step (the pure sampler).
        epochs: the ledger's ``--epochs``, the same for every run.
    """

    folder: Path
    counts: torch.Tensor
    epochs: int


class Player:
    """Plays schedules on one bed, one after the other.

    Args:
        bed: a bed with at least 4 hosts.
        reference: the static run.
        failure_timeout: ``dyntrain run --failure-timeout``.
        keep: where a schedule's run folder and logs are copied when it did not end bitwise
            equal, did not end, did not get every host back or left a process behind.
        say: where progress lines go.
    """

    def __init__(self, bed: HostBed, reference: Reference, failure_timeout: float, keep: Path,
                 say: Callable[[str], None]) -> None:
        self.bed, self.ref, self.timeout = bed, reference, failure_timeout
        self.keep, self.say = keep, say

    def play(self, number: int, schedule: Schedule) -> dict:
        """Run ``schedule`` (the ``number``-th) and return what came of it."""
        bed, began = self.bed, time.monotonic()
        name = f"schedule-{number:02d}-seed-{schedule.seed}"
        gate = bed.shared / f"{name}.hold"
        gate.touch()
        job = Job(bed.host(0), bed.shared / name,
                  [LEDGER, "--slow-while", gate, "--epochs", str(self.ref.epochs)],
                  bed.host(0).address,
                  ["--workers", f"1:{schedule.hosts}", "--nproc", "1", "--failure-timeout",
                   f"{self.timeout:g}"], bed.shared / f"{name}-logs")
        result = {**schedule.to_json(), "number": number, "applied": 0}
        try:
            for h in range(1, schedule.hosts):
                job.add_worker(bed.host(h))
            job.wait_for(lambda: job.world() == schedule.hosts, "every host's worker training",
                         240)
            result["applied"] = self._faults(job, schedule)
            recovered = self._recover(job, schedule.hosts)
            result["recovered_s"] = recovered
            gate.unlink()
            result["launcher_exit"] = job.launcher.wait(max(30.0, SCHEDULE_BOUND - (
                time.monotonic() - began)))
            if result["launcher_exit"] != 0:
                result["error"] = job.launcher.text().strip().splitlines()[-1][:300]
            result.update(self._ending(job))
        except Exception as exc:  # a schedule that did not end is reported, not fatal
            result["error"] = str(exc).splitlines()[0][:300] if str(exc) else repr(exc)
        finally:
            for frozen in range(schedule.hosts):
                bed.thaw(frozen)
        result["wall_s"] = round(time.monotonic() - began, 1)
        result.update(self._outcome(job))
        job.save_logs()
        if not result.get("bitwise") or result.get("left_behind") or \
                result.get("recovered_s") is None:
            result["kept"] = str(self.keep / name)
            for source, target in ((job.out, "run"), (job.log_dir, "logs")):
                if source.exists():
                    shutil.copytree(source, self.keep / name / target, dirs_exist_ok=True)
        bed.reset()
        return result

    def _faults(self, job: Job, schedule: Schedule) -> int:
        """Apply the schedule's actions at their times; how many faults were applied (the job
        may end before the last ones)."""
        start, applied = time.monotonic(), 0
        for at, action, host in _steps(schedule):
            delay = start + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # a schedule is timed: the faults come when they come
            if action in ("heal", "thaw"):
                getattr(self.bed, action)(host)
            elif action == "replace":
                self.bed.heal(host)
                if job.alive():
                    job.add_worker(self.bed.host(host))
            elif job.alive():
                getattr(self.bed, action)(host)
                applied += 1
            else:
                continue
            self.say(f"    {time.monotonic() - start:5.1f}s {action} host{host}"
                     f" (world {job.world()}, step {len(job.metrics())})")
        return applied

    def _recover(self, job: Job, hosts: int) -> float | None:
        """Seconds until every host's worker trains again (None: the job ended first, or not
        within the bound)."""
        start = time.monotonic()
        try:
            wait_until(lambda: job.world() == hosts or not job.alive(),
                       "every host's worker training again", 180)
        except TimeoutError:
            return None
        return round(time.monotonic() - start, 1) if job.alive() else None

    def _ending(self, job: Job) -> dict:
        """Worker exit codes, and what is left on the hosts once everything should have ended.

        A worker still starting when the job ended (a new process importing torch on a loaded
        machine) tries to reach the coordinator for its ``--connect-timeout`` and then exits
        saying so: the bound is that timeout plus two minutes for the import."""
        ended = time.monotonic()
        deadline = ended + float(CONNECT_TIMEOUT) + 120.0
        codes = {}
        for n, (host, worker) in enumerate(job.workers):
            try:
                codes[f"{host.name}#{n}"] = worker.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[f"{host.name}#{n}"] = None
        while time.monotonic() < deadline and any(h.pids() for h in self.bed.hosts):
            time.sleep(0.2)
        left = [f"{h.name}: {pid} {_cmdline(pid)[:120]}" for h in self.bed.hosts
                for pid in h.pids()]
        return {"worker_exits": codes, "left_behind": left,
                "last_process_s": round(time.monotonic() - ended, 1)}

    def _outcome(self, job: Job) -> dict:
        events = job.events()
        rows = job.metrics()
        found = {"changes": dict(collections.Counter(e["event"] for e in events)),
                 "declared_lost": sum(len(e["workers"]) for e in events if e["event"] == "crash"),
                 "readmitted": sum(1 for e in events if e["event"] == "join"
                                   for w in e["workers"] if ".r" in w),
                 "steps_redone": sum({e.get("generation"): e.get("steps_redone") or 0
                                      for e in events}.values()),
                 "worlds": _worlds(rows)}
        final = job.out / "final.pt"
        if not final.exists():
            return {**found, "bitwise": False, "finished": False}
        got = torch.load(final, weights_only=True)
        want = torch.load(self.ref.folder / "final.pt", weights_only=True)
        diff = max(float((want[k].double() - got[k].double()).abs().max()) for k in want)
        counts = got["counts"]
        return {**found, "finished": True, "max_abs_diff": diff, "bitwise": diff == 0.0,
                "applied_twice": int((counts - self.ref.counts).clamp(min=0).sum()),
                "never_applied": int((self.ref.counts - counts).clamp(min=0).sum())}


def _worlds(rows: list[dict]) -> list[int]:
    sizes = []
    for row in rows:
        if not sizes or sizes[-1] != row["world_size"]:
            sizes.append(row["world_size"])
    return sizes


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"
