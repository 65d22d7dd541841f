"""Stall soak: SIGKILL a member at seeded random instants, hundreds of times, and time how long
the survivors take to step again.

One ``dyntrain run --workers 2:3 --nproc 3`` of a small GPT (its gradient ring carries about a
megabyte per step, so that kills land in the middle of messages as well as between steps), with
an ``--events`` schedule drawn from the seed: ``kill=rank:R`` of a random rank at a random time,
then ``join=1`` to bring the world back to three. Events fire one after another, each once the
previous one took effect; each kill's time is drawn a random 0.5-2.5 s after the previous one's,
so that most land at an arbitrary point of a step. After the last kill has taken effect the
launcher gets Ctrl-C (it checkpoints and exits).

For every crash the coordinator records (``events.jsonl``) the time from its detection to the
survivors' first step in the new world (``latency_s``). A **stall** is a re-formation slower
than ``--stall`` seconds (default 2). Reported: their distribution, the stalls, how many process
groups' destructors waited in the background (a gloo operation that severing did not fail: the
workers' logs say ``dropping an abandoned process group ... has taken over 30 s``) and how many
closes held up a re-formation (``closing a process group ... has taken over 2 s``).

    .venv/bin/python bench/stall_soak.py                  # 500 kills, ~15-25 minutes
    .venv/bin/python bench/stall_soak.py --kills 20       # shorter

Writes a table to stdout and ``bench/results/stall_soak.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import descendants, machine_info, read_jsonl, write_result
from dyntrain.procstat import read_stat
from dyntrain.testing.wait import wait_until

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
GPT = ["-m", "dyntrain.workloads.gpt", "--model", "tiny", "--d-model", "128", "--seq-len", "32",
       "--global-batch", "12", "--chunk-size", "2", "--max-steps", "1000000",
       "--warmup-steps", "4", "--val-every", "1000000", "--checkpoint-every", "1000"]


def schedule(seed: int, kills: int, world: int = 3) -> str:
    """The ``--events`` of ``kills`` kills of random ranks at random times, each followed by a
    join that restores ``world`` workers."""
    rng = random.Random(seed)
    at, events = 5.0, []
    for _ in range(kills):
        at += rng.uniform(0.5, 2.5)
        events += [f"t={at:.2f}:kill=rank:{rng.randrange(world)}", "t=0:join=1"]
    return ",".join(events)


def same_process(pid: int, started: int) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` (a pid is reused)."""
    stat = read_stat(pid)
    return stat is not None and stat.start_ticks == started and not stat.state.ended


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--kills", type=int, default=500)
    ap.add_argument("--stall", type=float, default=2.0, help="seconds that make a stall")
    ap.add_argument("--timeout", type=float, default=5400.0)
    ap.add_argument("--out", default=str(BENCH / "results" / "stall_soak.json"))
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dyntrain-stall-soak-") as tmp:
        out = Path(tmp) / "run"
        print(f"run folder: {out} (removed at the end)", flush=True)
        cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "2:3", "--nproc",
               "3", "--failure-timeout", "2", "--quiet", "--out", str(out), "--events",
               schedule(args.seed, args.kills), *GPT]
        began = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

        def crashes() -> list[dict]:
            path = out / "events.jsonl"
            return [e for e in read_jsonl(path) if e["event"] == "crash"] \
                if path.exists() else []

        seen: dict[int, int] = {}  # pid -> start time: every process of the run
        progress = {"fired": 0, "since": time.monotonic()}

        def done() -> bool:
            for pid in descendants(proc.pid):
                if pid not in seen and (stat := read_stat(pid)) is not None:
                    seen[pid] = stat.start_ticks
            fired = len(read_jsonl(out / "fired_events.jsonl")) \
                if (out / "fired_events.jsonl").exists() else 0
            if fired != progress["fired"]:
                progress.update(fired=fired, since=time.monotonic())
            # an event that never takes effect holds up the rest: say so, and stop there
            stuck = time.monotonic() - progress["since"] > 120
            return fired >= 2 * args.kills or proc.poll() is not None or stuck

        wait_until(done, "every kill to take effect", args.timeout, poll=0.5)
        time.sleep(2.0)  # let the last join's world step (its event is then in events.jsonl)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: checkpoint and exit
        stdout, _ = proc.communicate(timeout=300)
        wall = time.monotonic() - began
        try:
            wait_until(lambda: not any(same_process(*p) for p in seen.items()),
                       "the run's processes to end", 30)
        except TimeoutError:
            pass  # reported below as stray processes
        events = crashes()
        latencies = [e["latency_s"] for e in events if e.get("latency_s") is not None]
        logs = "".join(p.read_text(errors="replace") for p in (out / "logs").glob("*.log"))
        result = {
            "exit_code": proc.returncode, "wall_s": round(wall, 1), "kills_asked": args.kills,
            "crashes_recorded": len(events), "stall_threshold_s": args.stall,
            "latency_s": {"median": percentile(latencies, 0.5),
                          "p90": percentile(latencies, 0.9),
                          "p99": percentile(latencies, 0.99), "max": max(latencies)}
            if latencies else None,
            "latencies_s": [round(x, 3) for x in latencies],
            "stalls": [e for e in events if (e.get("latency_s") or 0) > args.stall],
            "slow_closes": logs.count("closing a process group ("),
            "background_drops_over_30s": logs.count("dropping an abandoned process group"),
            "events_fired": progress["fired"],
            "stray_processes": sorted(p for p in seen.items() if same_process(*p)),
            "tail": stdout[-2000:],
        }
    result["load_before"] = [round(x, 1) for x in load_before]
    result["load_after"] = [round(x, 1) for x in os.getloadavg()]
    lat = result["latency_s"] or {}
    print("| kills | crashes recorded | re-formation median / p90 / p99 / max | stalls "
          f"(> {args.stall:g} s) | slow closes | background drops > 30 s | stray |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    print(f"| {args.kills} | {len(events)} | {lat.get('median', 0):.3f} / "
          f"{lat.get('p90', 0):.3f} / {lat.get('p99', 0):.3f} / {lat.get('max', 0):.3f} s | "
          f"{len(result['stalls'])} | {result['slow_closes']} | "
          f"{result['background_drops_over_30s']} | {len(result['stray_processes'])} |")
    if result["exit_code"] not in (0, 130):
        print(result["tail"])
    write_result(args.out, {"benchmark": "stall soak (tiny GPT, CPU, gloo)",
                            "machine": machine_info(), "seed": args.seed, **result})


if __name__ == "__main__":
    main()
