"""The control plane at many members: the real coordinator and TCPStore, simulated members.

Members speak the real protocol through a real TCPStore (a hello on their inbox and the roster,
a heartbeat counter bumped every 0.5 s as ``WorkerChannel`` does, a ``Ready`` when their
generation is told to re-form or is aborted, silence when they vanish) but run no torch and
train nothing, so that N = 64, 256 and 1,024 members fit on one machine. The coordinator is the
one a job runs (``dyntrain.elastic.membership.coordinator``), ticking every 10 ms on its own
thread as ``dyntrain run`` ticks it, over its own client connection to the store; the members
run in a few driver processes of their own.

For each N:

- **formation**: N - W members say hello at once (W = min(256, N/2)); the seconds until a
  generation of all of them is published.
- **wave of joins**: W more at once while that generation runs; the seconds until the
  generation of all N is published (its members are told to re-form and answer ``Ready``).
- **steady state**: the coordinator's CPU seconds per tick and per wall second, and its store
  operations per second, over a few seconds with all N beating.
- **one silent member**: one stops beating; the seconds from its last beat until the coordinator
  declares it lost, and until a generation without it is published, each beyond the failure
  timeout.
- **loss of half**: N/2 stop beating at once; the same, for the last of them declared lost and
  the generation without all of them.

    .venv/bin/python bench/control_plane.py                 # N = 64, 256, 1024
    .venv/bin/python bench/control_plane.py --sizes 64 --out /tmp/cp.json

Writes ``bench/results/control_plane.json``; ``make bench-report`` renders
``docs/benchmarks/control-plane.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from dyntrain.elastic import protocol as p
from dyntrain.elastic.admission import CanaryDigest
from dyntrain.elastic.membership.coordinator import Coordinator
from dyntrain.elastic.membership.members import CoordinatorConfig
from dyntrain.testing.wait import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TICK = 0.01  # as dyntrain run ticks its coordinator
BEAT = 0.5  # as WorkerChannel beats
SETTINGS = {"torch": "2.13.0", "threads": 1, "cpu_capability": "AVX2"}
CANARY = CanaryDigest("d0", "c0")


class CountingStore:
    """The coordinator's store client, counting the operations it sends."""

    def __init__(self, store: dist.Store) -> None:
        self._store, self.ops = store, 0

    def __getattr__(self, name: str):
        method = getattr(self._store, name)

        def counted(*args, **kwargs):
            self.ops += 1
            return method(*args, **kwargs)

        return counted


class QuietSink:
    """Where the coordinator's events go: kept in memory, printed nowhere; when each member was
    declared lost."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.lost_at: dict[str, float] = {}

    def event(self, record: dict) -> None:
        self.events.append(record)

    def metrics(self, record: dict) -> None:
        pass

    def log(self, line: str) -> None:
        if line.startswith("worker ") and " lost: " in line:
            self.lost_at.setdefault(line.split()[1], time.time())

    def result(self, record: dict) -> None:
        pass

    def numerics(self, record) -> None:
        pass


def _client(port: int) -> dist.Store:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))


def _driver(port: int, conn) -> None:
    """One driver process: its members say hello, beat, answer their generation's control word
    with ``Ready``, and fall silent, as it is told through ``conn``."""
    store = _client(port)
    conn.send("ready")
    mine: list[str] = []
    silent: set[str] = set()
    last_beat: dict[str, float] = {}
    answered: dict[str, int] = {}  # member -> the generation it sent Ready for
    seq: dict[str, int] = {}

    def send(member: str, msg: p.Message) -> None:
        n = seq.get(member, 0)
        store.multi_set([p.inbox_key(member, n), p.inbox_count_key(member)],
                        [p.encode(member, msg), str(n + 1)])
        seq[member] = n + 1

    while True:
        while conn.poll():
            command, names = conn.recv()
            if command == "stop":
                return
            if command == "hello":
                for name in names:
                    last_beat[name] = time.time()
                    send(name, p.Hello("fp", {"global_batch": 1024}, host="sim",
                                       pid=os.getpid(), numerics=SETTINGS, canary=CANARY))
                    store.add(p.heartbeat_key(name), 1)
                    store.append(p.ROSTER, name + " ")
                    store.add(p.ROSTER_COUNT, 1)
                mine += names
                conn.send(None)
            elif command == "silence":
                hit = [n for n in names if n in last_beat]
                silent.update(hit)
                conn.send(max((last_beat[n] for n in hit), default=0.0))
        now = time.time()
        latest = int(store.get(p.GEN_LATEST)) if store.check([p.GEN_LATEST]) else -1
        for member in mine:
            if member in silent:
                continue
            if now - last_beat[member] >= BEAT:
                store.add(p.heartbeat_key(member), 1)
                last_beat[member] = now
            if latest >= 0 and answered.get(member, -1) < latest:
                key = p.ctl_key(latest, member)
                if store.check([key]):
                    word = p.Control(store.get(key).decode())
                    if word in (p.Control.REFORM, p.Control.ABORT):
                        reason = (p.ReadyReason.BOUNDARY if word is p.Control.REFORM
                                  else p.ReadyReason.ABORT)
                        send(member, p.Ready(latest, 0, reason))
                        answered[member] = latest
        time.sleep(0.02)


class Members:
    """Simulated members in a few driver processes (so that they take no time from the
    coordinator's process, as members on other hosts would not), each with its own store
    connection."""

    def __init__(self, port: int, drivers: int) -> None:
        ctx = mp.get_context("spawn")
        pipes = [ctx.Pipe() for _ in range(drivers)]
        self.conns = [mine for mine, _ in pipes]
        self.procs = [ctx.Process(target=_driver, args=(port, theirs), daemon=True)
                      for _, theirs in pipes]
        for proc in self.procs:
            proc.start()
        for conn in self.conns:  # started, connected: what is timed from here is the plane's
            conn.recv()

    def _all(self, command: str, shares: list[list[str]]) -> list:
        for conn, share in zip(self.conns, shares, strict=True):
            conn.send((command, share))
        return [conn.recv() for conn in self.conns]

    def hello(self, names: list[str]) -> None:
        """They say hello at once, spread over the drivers; returns once every hello is sent."""
        self._all("hello", [names[i::len(self.conns)] for i in range(len(self.conns))])

    def silence(self, names: list[str]) -> float:
        """They stop beating (each driver silences those it drives); returns the newest of
        their last beats."""
        return max(self._all("silence", [names] * len(self.conns)))

    def close(self) -> None:
        for conn in self.conns:
            conn.send(("stop", []))
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


class Plane:
    """One coordinator over a fresh store, ticking on its own thread, and its members."""

    def __init__(self, n: int, failure_timeout: float, drivers: int) -> None:
        self.server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=120))
        client = dist.TCPStore("127.0.0.1", self.server.port, is_master=False,
                               timeout=timedelta(seconds=120))
        self.store = CountingStore(client)
        self.sink = QuietSink()
        config = CoordinatorConfig(min_workers=1, max_workers=n, expected_initial=n - wave_size(n),
                                   settle_seconds=0.2, failure_timeout=failure_timeout)
        self.coord = Coordinator(self.store, config, self.sink, lambda: None)
        self.ticks, self.cpu = 0, 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.members = Members(self.server.port, drivers)

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.thread_time()
            self.coord.tick()
            self.cpu += time.thread_time() - start
            self.ticks += 1
            self.stop.wait(TICK)

    def generation(self) -> p.Generation | None:
        return self.coord.current

    def wait_members(self, wanted: set[str], timeout: float) -> float:
        """Seconds until a generation of exactly ``wanted`` is published."""
        def formed():
            gen = self.generation()
            return gen is not None and set(gen.members) == wanted
        wait_until(formed, f"a generation of {len(wanted)} members", timeout=timeout,
                   poll=0.005, max_poll=0.005)
        return time.time()

    def close(self) -> None:
        self.members.close()
        self.stop.set()
        self.thread.join(10)


def wave_size(n: int) -> int:
    return min(256, n // 2)


def measure(n: int, failure_timeout: float, drivers: int, steady_s: float) -> dict:
    plane = Plane(n, failure_timeout, drivers)
    timeout = 120 + n / 4
    try:
        first = [f"m{i:04d}" for i in range(n - wave_size(n))]
        start = time.time()
        plane.members.hello(first)
        formation = plane.wait_members(set(first), timeout) - start

        second = [f"m{i:04d}" for i in range(n - wave_size(n), n)]
        start = time.time()
        plane.members.hello(second)
        everyone = set(first) | set(second)
        wave = plane.wait_members(everyone, timeout) - start

        ops0, cpu0, ticks0, t0 = plane.store.ops, plane.cpu, plane.ticks, time.time()
        time.sleep(steady_s)  # the steady state is what is measured: nothing to wait for
        wall = time.time() - t0
        ticks = plane.ticks - ticks0
        steady = {"wall_s": wall, "ticks": ticks,
                  "cpu_per_tick_ms": 1000 * (plane.cpu - cpu0) / max(ticks, 1),
                  "cpu_per_wall_s": (plane.cpu - cpu0) / wall,
                  "store_ops_per_s": (plane.store.ops - ops0) / wall,
                  "tick_interval_ms": 1000 * wall / max(ticks, 1)}

        lone = second[-1]
        last = plane.members.silence([lone])
        everyone.discard(lone)
        one_lost = plane.wait_members(everyone, timeout + failure_timeout) - last
        one_declared = plane.sink.lost_at[lone] - last

        half = sorted(everyone)[: n // 2]
        last = plane.members.silence(half)
        everyone -= set(half)
        half_lost = plane.wait_members(everyone, timeout + failure_timeout) - last
        half_declared = max(plane.sink.lost_at[m] for m in half) - last
        return {"n": n, "formation_s": formation, "wave_joins": len(second),
                "wave_join_s": wave, "steady": steady, "failure_timeout_s": failure_timeout,
                "one_silent": {"declared_lost_s": one_declared, "published_s": one_lost},
                "half_silent": {"members": len(half), "declared_lost_s": half_declared,
                                "published_s": half_lost}}
    finally:
        plane.close()


def _after(case: dict, timeout: float) -> str:
    return (f"timeout+{case['declared_lost_s'] - timeout:.2f} s (published "
            f"+{case['published_s'] - timeout:.2f} s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--failure-timeout", type=float, default=3.0,
                        help="seconds of silence before a member is lost (the job default: 3)")
    parser.add_argument("--drivers", type=int, default=4,
                        help="processes that drive the simulated members")
    parser.add_argument("--steady-seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "control_plane.json")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 4 or max(sizes) > 4096:
        sys.exit("control_plane: error: --sizes takes member counts from 4 to 4096, "
                 "e.g. 64,256,1024")
    load = os.getloadavg()
    results = []
    for n in sizes:
        row = measure(n, args.failure_timeout, args.drivers, args.steady_seconds)
        results.append(row)
        print(f"N={n:5d}  formation {row['formation_s']:.2f} s  wave of {row['wave_joins']} "
              f"joins {row['wave_join_s']:.2f} s  tick CPU "
              f"{row['steady']['cpu_per_tick_ms']:.2f} ms ({row['steady']['cpu_per_wall_s']:.2f}"
              f" CPU-s/s)  store {row['steady']['store_ops_per_s']:.0f} ops/s  one lost "
              f"{_after(row['one_silent'], args.failure_timeout)}  half lost "
              f"{_after(row['half_silent'], args.failure_timeout)}", flush=True)
    data = {"machine": machine_info(),
            "load_before": list(load), "load_after": list(os.getloadavg()),
            "command": " ".join(["bench/control_plane.py", *(argv or sys.argv[1:])]),
            "tick_s": TICK, "beat_s": BEAT, "drivers": args.drivers, "sizes": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
