"""The membership numbers of ``bench/multihost.py``, over a real network path and over loopback.

Two paths, each in a job of its own:

* ``veth``: the launcher (coordinator and one local worker) on host 0, listening on host 0's
  address; ``dyntrain worker`` on hosts 1 and 2. Every byte between workers crosses a veth pair
  and the bridge. A worker is cut off by taking its host's link down (``partition``) and
  brought back by bringing it up (``heal``).
* ``loopback``: the same three workers, all on host 0, over 127.0.0.1. Loopback has no link to
  cut: the worker is cut off by SIGSTOP and brought back by SIGCONT (it falls silent the same
  way; a partitioned worker keeps computing, a stopped one does not).

``membership``: the ledger workload (held slow, 50 ms more per chunk); the third worker joins a
job of two (its join), then is cut off and brought back ``cycles`` times: the time from the cut
to being declared lost and to the first step in the smaller world, the steps redone, and from
the heal to the hello of the new worker it starts over as and to the first step with it
(re-admitted, the state handed over afresh).

``handover``: ``bench/rescale_size_worker.py``'s MLP with Adam (25M parameters by default) on one
worker; a second joins ``joins`` times (removed after each: its host lost, or SIGKILL on
loopback), and the join event gives the leader's time in the state hand-over (``state_sync_s``)
and hello -> first step. ``tcp`` sends 256 MiB over one TCP connection on the same path, to read
the hand-over against.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _common import descendants
from dyntrain.testing.hosts import HostBed
from dyntrain.testing.jobs import Output
from dyntrain.testing.wait import wait_until
from multihost_jobs import LEDGER, Job, event_with, signal_process, worker_id

BENCH = Path(__file__).resolve().parent
SIZE_WORKER = BENCH / "rescale_size_worker.py"
PATHS = ("veth", "loopback")

_RECEIVE = """import socket, time
s = socket.socket(); s.bind(("0.0.0.0", 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n, t0 = 0, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    t0 = t0 or time.perf_counter()
    n += len(b)
print(n, time.perf_counter() - t0, flush=True)
"""
_SEND = """import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); buf = bytes(1 << 20)
for _ in range(int(sys.argv[3])):
    c.sendall(buf)
c.close()
"""


class Cut:
    """Cuts one worker off and brings it back, the way its path allows.

    Args:
        bed: the host bed.
        path: ``veth`` (the worker's host link goes down and up) or ``loopback`` (SIGSTOP and
            SIGCONT of the worker's processes).
        host: the worker's host index (veth).
        pid: the worker's process (loopback).
    """

    def __init__(self, bed: HostBed, path: str, host: int, pid: int) -> None:
        self.bed, self.path, self.host, self.pid = bed, path, host, pid
        self._stopped: list[int] = []

    def cut(self) -> None:
        if self.path == "veth":
            self.bed.partition(self.host)
            return
        self._stopped = [self.pid, *descendants(self.pid)]
        for pid in self._stopped:
            signal_process(pid, signal.SIGSTOP)

    def heal(self) -> None:
        if self.path == "veth":
            self.bed.heal(self.host)
            return
        for pid in self._stopped:
            signal_process(pid, signal.SIGCONT)


def membership(bed: HostBed, path: str, cycles: int, logs: Path,
               say: Callable[[str], None]) -> dict:
    """Join, cut off and bring back a worker ``cycles`` times on ``path``; see the module."""
    home = bed.host(0)
    address = home.address if path == "veth" else "127.0.0.1"
    first, third = (bed.host(1), bed.host(2)) if path == "veth" else (home, home)
    gate = bed.shared / f"membership-{path}.hold"
    gate.touch()
    job = Job(home, bed.shared / f"membership-{path}",
              [LEDGER, "--slow-while", gate, "--epochs", "2000"], address,
              ["--workers", "1:3", "--nproc", "1"], logs / f"membership-{path}")
    try:
        job.add_worker(first)
        job.wait_for(lambda: job.world() == 2, "two workers training", 300)
        started = time.time()
        worker = job.add_worker(third)
        wid = worker_id(third, worker)
        join = job.wait_for(lambda: event_with(job, "join", wid), f"{wid} to join", 300)
        row = job.first_row(lambda r: r.get("gen") == join["generation"])
        result = {"joins": [_join(job, join, started, row)], "cycles": []}
        say(f"  {path}: {wid} joined: hello -> first step {join['latency_s']:.3f} s, "
            f"started -> first step {row['time'] - started:.1f} s")
        cut = Cut(bed, path, third.index, worker.proc.pid)
        for n in range(cycles):
            member = wid if n == 0 else f"{wid}.r{n}"
            cycle = _cut_and_heal(job, cut, worker, member, f"{wid}.r{n + 1}")
            result["cycles"].append(cycle)
            result["joins"].append(cycle["rejoin"])
            say(f"  {path} cycle {n + 1}/{cycles}: lost after {cycle['cut_to_lost_s']:.2f} s, "
                f"first step at world 2 after {cycle['cut_to_first_step_s']:.2f} s "
                f"(redone {cycle['cut_steps_redone']}); back -> told {cycle['heal_to_told_s']:.1f}"
                f" s, hello {cycle['heal_to_hello_s']:.1f} s, re-admitted "
                f"{cycle['heal_to_readmitted_s']:.1f} s (redone "
                f"{cycle['rejoin']['steps_redone']})")
        return result
    finally:
        job.save_logs()
        bed.reset()


def _join(job: Job, event: dict, started: float | None, row: dict) -> dict:
    return {"worker": event["workers"], "hello_to_first_step_s": event["latency_s"],
            "started_to_first_step_s": None if started is None else row["time"] - started,
            "state_sync_s": event.get("state_sync_s"), "steps_redone": event["steps_redone"]}


def _cut_and_heal(job: Job, cut: Cut, worker: Output, member: str, again: str) -> dict:
    """One cycle: cut ``member`` off until the others trained two steps without it, bring it
    back, wait until it joined again as ``again``. ``worker``: its output, where it says when
    it learnt that it was declared dead."""
    cut_at = time.time()
    cut.cut()
    try:
        crash = job.wait_for(lambda: event_with(job, "crash", member),
                             f"{member} to be declared lost", 120)
        seen = len(job.metrics())
        job.wait_for(lambda: len(job.metrics()) >= seen + 2, "two steps without it", 120)
    finally:
        healed_at = time.time()
        cut.heal()
    rejoin = job.wait_for(lambda: event_with(job, "join", again),
                          f"{again} to be re-admitted", 300)
    row = job.first_row(lambda r: r.get("gen") == rejoin["generation"])
    clock = job.event_clock()
    said = f"starting over as the new worker {again}"
    told = wait_until(lambda: next((at for at, line in worker.lines if said in line), None),
                      f"{member} to say that it starts over", timeout=30)
    seen = len(job.metrics())
    job.wait_for(lambda: len(job.metrics()) >= seen + 2, "two steps with it again", 120)
    return {"cut_to_lost_s": crash["detected_at"] + clock - cut_at,
            "cut_to_first_step_s": crash["first_step_at"] + clock - cut_at,
            "cut_steps_redone": crash["steps_redone"],
            "heal_to_told_s": told - healed_at,
            "heal_to_hello_s": rejoin["requested_at"] + clock - healed_at,
            "heal_to_readmitted_s": row["time"] - healed_at,
            "rejoin": _join(job, rejoin, None, row)}


def handover(bed: HostBed, path: str, joins: int, params: int, logs: Path,
             say: Callable[[str], None]) -> dict:
    """A worker joins a 25M-parameter job ``joins`` times on ``path``; see the module."""
    home = bed.host(0)
    address = home.address if path == "veth" else "127.0.0.1"
    joiner = bed.host(1) if path == "veth" else home
    job = Job(home, bed.shared / f"handover-{path}",
              [SIZE_WORKER, "--params", str(params), "--steps", "20000"], address,
              ["--workers", "1:2", "--nproc", "1"], logs / f"handover-{path}")
    found = []
    try:
        job.wait_for(job.metrics, "the first step", 300)
        for n in range(joins):
            started = time.time()
            worker = job.add_worker(joiner)
            wid = worker_id(joiner, worker)
            join = job.wait_for(lambda wid=wid: event_with(job, "join", wid),
                                f"{wid} to join", 300)
            row = job.first_row(lambda r, join=join: r.get("gen") == join["generation"])
            found.append(_join(job, join, started, row))
            say(f"  {path} hand-over {n + 1}/{joins}: state sync {join.get('state_sync_s')} s, "
                f"hello -> first step {join['latency_s']:.2f} s")
            if path == "veth":
                bed.lose(joiner.index)
                bed.heal(joiner.index)
            else:
                signal_process(worker.proc.pid, signal.SIGKILL)
            job.wait_for(lambda wid=wid: event_with(job, "crash", wid),
                         f"{wid} to be declared lost", 120)
        return {"joins": found}
    finally:
        job.save_logs()
        bed.reset()


def tcp(bed: HostBed, path: str, mib: int = 256) -> float:
    """MiB/s of one TCP connection from host 1 to host 0 (veth) or within host 0."""
    home = bed.host(0)
    sender = bed.host(1) if path == "veth" else home
    address = home.address if path == "veth" else "127.0.0.1"
    receiver = home.popen([sys.executable, "-c", _RECEIVE], stdout=-1, text=True)
    try:
        port = receiver.stdout.readline().strip()
        sender.run([sys.executable, "-c", _SEND, address, port, str(mib)], check=True,
                   timeout=120)
        size, seconds = receiver.stdout.readline().split()
        receiver.wait(30)
        return int(size) / 2**20 / float(seconds)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
