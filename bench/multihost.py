"""Several hosts for real: membership changes over a veth path against loopback, and random fault
schedules across 3-4 hosts against the static run.

Hosts are network namespaces on a bridge (``dyntrain.testing.hosts``: each its own address, a
hostname that resolves to loopback, its own disk); jobs are started the way a user starts them
(``dyntrain run --host`` on host 0, ``dyntrain worker --coordinator`` elsewhere, no environment
variable). Two parts:

* paths (``bench/multihost_paths.py``), over veth (a worker on each of hosts 0-2) and over
  loopback (all three on host 0, 127.0.0.1): join latency; a worker cut off (link down; SIGSTOP
  on loopback) -> declared lost -> first step in the smaller world; brought back (link up;
  SIGCONT) -> re-admitted as a new member; steps redone; the state hand-over of a joiner at 25M
  parameters with Adam; one TCP connection's throughput;
* schedules (``bench/multihost_schedules.py``): N seeded random schedules of partitions, heals,
  freezes and host losses (a new host joins in a lost one's place) on the ledger workload: how
  many ended bitwise equal to the static run, samples applied twice or never, processes left on
  the hosts; then the namespaces, links and files left once the bed is gone. A schedule that
  does not end bitwise equal keeps its run folder and logs (``--keep``) and is named with its
  seed: ``--seed S --schedules 1`` plays it again.

    .venv/bin/python bench/multihost.py               # ~30-40 minutes on 2 loaded cores
    .venv/bin/python bench/multihost.py --quick       # one cycle, one hand-over, 2 schedules
    .venv/bin/python bench/multihost.py --part schedules --seed 1807 --schedules 1
    .venv/bin/python bench/multihost.py --rejudge bench/results/multihost.json

Needs root (network namespaces). Writes a table to stdout and ``bench/results/multihost.json``;
every namespace and process goes when it ends, fails or is interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from _common import machine_info, write_result
from dyntrain.elastic.protocol import FAILURE_TIMEOUT
from dyntrain.testing.hosts import HostBed, unavailable
from dyntrain.testing.jobs import pinned_env
from multihost_jobs import LEDGER, ROOT
from multihost_paths import PATHS, handover, membership, tcp
from multihost_schedules import Player, Reference, make_schedule

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))
from test_elastic_e2e import expected_counts  # noqa: E402 (the ledger's counts, pure sampler)

BEGAN = time.monotonic()


def say(line: str) -> None:
    print(f"[{time.monotonic() - BEGAN:6.0f}s] {line}", flush=True)


class LoadWatch:
    """The 1-minute load average, every 10 s while the benchmark runs."""

    def __init__(self) -> None:
        self.before = [round(x, 2) for x in os.getloadavg()]
        self.samples: list[float] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(10.0):
            self.samples.append(round(os.getloadavg()[0], 2))

    def stop(self) -> dict:
        self._stop.set()
        return {"loadavg_before": self.before,
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "loadavg_during": {"median": statistics.median(self.samples or [0.0]),
                                   "min": min(self.samples, default=None),
                                   "max": max(self.samples, default=None),
                                   "samples": len(self.samples)}}


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run_paths(bed: HostBed, args: argparse.Namespace, logs: Path) -> dict:
    found = {}
    for path in PATHS:
        say(f"{path}: TCP throughput")
        mibs = tcp(bed, path)
        say(f"{path}: one TCP connection {mibs:.0f} MiB/s; membership ({args.cycles} cycles)")
        member = membership(bed, path, args.cycles, logs, say)
        say(f"{path}: hand-over at {args.params / 1e6:g}M parameters ({args.joins} joins)")
        hand = handover(bed, path, args.joins, args.params, logs, say)
        cycles = member["cycles"]
        found[path] = {
            "tcp_mib_s": round(mibs),
            "join_hello_to_first_step_s": _median(j["hello_to_first_step_s"]
                                                  for j in member["joins"]),
            "join_started_to_first_step_s": member["joins"][0]["started_to_first_step_s"],
            "cut_to_lost_s": _median(c["cut_to_lost_s"] for c in cycles),
            "cut_to_first_step_s": _median(c["cut_to_first_step_s"] for c in cycles),
            "heal_to_told_s": _median(c["heal_to_told_s"] for c in cycles),
            "heal_to_hello_s": _median(c["heal_to_hello_s"] for c in cycles),
            "heal_to_readmitted_s": _median(c["heal_to_readmitted_s"] for c in cycles),
            "steps_redone": sum(c["cut_steps_redone"] + c["rejoin"]["steps_redone"]
                                for c in cycles) + member["joins"][0]["steps_redone"],
            "handover_state_sync_s": _median(j["state_sync_s"] for j in hand["joins"]),
            "handover_join_s": _median(j["hello_to_first_step_s"] for j in hand["joins"]),
            "membership": member, "handover": hand}
    return found


PATH_ROWS = [
    ("one TCP connection, MiB/s", "tcp_mib_s", "{:.0f}"),
    ("join: hello -> first step in the new world", "join_hello_to_first_step_s", "{:.3f} s"),
    ("join: `dyntrain worker` started -> first step", "join_started_to_first_step_s",
     "{:.1f} s"),
    ("cut off -> declared lost", "cut_to_lost_s", "{:.2f} s"),
    ("cut off -> first step in the smaller world", "cut_to_first_step_s", "{:.2f} s"),
    ("back -> it learns it was declared dead", "heal_to_told_s", "{:.1f} s"),
    ("back -> hello of the new member (a new process)", "heal_to_hello_s", "{:.1f} s"),
    ("back -> re-admitted (first step with it)", "heal_to_readmitted_s", "{:.1f} s"),
    ("steps redone (every change)", "steps_redone", "{}"),
    ("hand-over at 25M + Adam: leader's state sync", "handover_state_sync_s", "{:.2f} s"),
    ("join at 25M + Adam: hello -> first step", "handover_join_s", "{:.2f} s"),
]


def paths_table(found: dict) -> str:
    lines = ["| | veth (hosts 0-2) | loopback (host 0, 127.0.0.1) |", "| --- | ---: | ---: |"]
    for label, key, form in PATH_ROWS:
        cells = ["–" if found[p][key] is None else form.format(found[p][key]) for p in PATHS]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def static_reference(folder: Path, epochs: int) -> Reference:
    env = pinned_env(DYNTRAIN_OUT=str(folder))  # a job's numerics, as every worker's
    env.pop("DYNTRAIN_COORDINATOR", None)
    subprocess.run([sys.executable, str(LEDGER), "--epochs", str(epochs)], env=env, check=True,
                   cwd=ROOT, capture_output=True, timeout=600)
    return Reference(folder, expected_counts(epochs=epochs), epochs)


def run_schedules(bed: HostBed, args: argparse.Namespace, work: Path) -> dict:
    say(f"the static run (ledger, {args.epochs} epochs)")
    ref = static_reference(work / "static", args.epochs)
    player = Player(bed, ref, args.failure_timeout, Path(args.keep), say)
    played = []
    for n in range(args.schedules):
        schedule = make_schedule(args.seed + n, args.failure_timeout)
        say(f"schedule {n + 1}/{args.schedules} (seed {schedule.seed}): {schedule.describe()}")
        got = player.play(n + 1, schedule)
        played.append(got)
        verdict = ("bitwise equal" if got.get("bitwise") else
                   f"NOT bitwise equal (max |diff| {got.get('max_abs_diff')}), kept in "
                   f"{got.get('kept')}" if got.get("finished") else
                   f"did not finish ({got.get('error')}); kept in {got.get('kept')}")
        say(f"  {verdict}; {got['wall_s']:.0f} s, changes {got['changes']}, "
            f"left behind {len(got.get('left_behind', []))}")
    return {"played": played, **schedule_summary(played)}


def schedule_summary(played: list[dict]) -> dict:
    return {"bitwise": sum(1 for p in played if p.get("bitwise")), "schedules": len(played),
            "applied_twice": sum(p.get("applied_twice", 0) for p in played),
            "never_applied": sum(p.get("never_applied", 0) for p in played),
            "processes_left": sum(len(p.get("left_behind", [])) for p in played),
            "not_bitwise": [{"seed": p["seed"], "kept": p.get("kept"), "error": p.get("error"),
                             "max_abs_diff": p.get("max_abs_diff")}
                            for p in played if not p.get("bitwise")]}


def schedules_table(found: dict) -> str:
    lines = ["| # | seed | hosts | faults (applied) | declared lost | re-admitted | steps redone | "
             "wall | bitwise | twice / never | left |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for p in found["played"]:
        kinds = ", ".join(f"{f['kind']} h{f['host']}" for f in p["faults"])
        lines.append(
            f"| {p['number']} | {p['seed']} | {p['hosts']} | {kinds} ({p['applied']}) | "
            f"{p['declared_lost']} | {p['readmitted']} | {p['steps_redone']} | "
            f"{p['wall_s']:.0f} s | {'yes' if p.get('bitwise') else 'NO'} | "
            f"{p.get('applied_twice', '–')} / {p.get('never_applied', '–')} | "
            f"{len(p.get('left_behind', []))} |")
    return "\n".join(lines)


def rejudge(path: Path) -> None:
    """Compare every schedule a result file kept (``--keep``: those it did not find bitwise
    equal) with a static run trained now with a job's numerics, and rewrite the file saying so:
    for a run whose static reference was trained with the host's threads and kernels."""
    result = json.loads(path.read_text())
    epochs = result["settings"]["epochs"]
    with tempfile.TemporaryDirectory(prefix="dyntrain-multihost-rejudge-") as tmp:
        ref = static_reference(Path(tmp) / "static", epochs)
        want = torch.load(ref.folder / "final.pt", weights_only=True)
        s = result["schedules"]
        for p in s["played"]:
            final = Path(p["kept"]) / "run" / "final.pt" if p.get("kept") else None
            if p.get("bitwise") or final is None or not final.exists():
                continue
            got = torch.load(final, weights_only=True)
            p["max_abs_diff"] = max(float((want[k].double() - got[k].double()).abs().max())
                                    for k in want)
            p["bitwise"] = p["max_abs_diff"] == 0.0
            p["applied_twice"] = int((got["counts"] - ref.counts).clamp(min=0).sum())
            p["never_applied"] = int((ref.counts - got["counts"]).clamp(min=0).sum())
        s.update(schedule_summary(s["played"]))
    result["rejudged"] = ("each schedule's final.pt compared again with a static run trained "
                          "with a job's numerics (the run's own reference had the host's "
                          f"threads and kernels); {time.strftime('%Y-%m-%d %H:%M UTC')}")
    tables = [paths_table(result["paths"])] if "paths" in result else []
    tables += [schedules_table(s),
               f"bitwise equal to the static run: {s['bitwise']} of {s['schedules']}; samples "
               f"applied twice: {s['applied_twice']}, never: {s['never_applied']}; processes "
               f"left on hosts: {s['processes_left']}; namespaces, links or files left: "
               f"{len(result.get('bed_left_behind', []))}"]
    result["table"] = "\n\n".join(tables)
    print(result["table"])
    path.write_text(json.dumps(result, indent=1) + "\n")


def _exit_on_signal(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "paths", "schedules"), default="all")
    ap.add_argument("--rejudge", metavar="RESULT", default=None,
                    help="compare the schedules a result file kept with a static run trained "
                         "now with a job's numerics, and rewrite the file")
    ap.add_argument("--quick", action="store_true",
                    help="one cut-off cycle, one hand-over per path, 2 schedules")
    ap.add_argument("--schedules", type=int, default=20, help="random schedules to play")
    ap.add_argument("--seed", type=int, default=1800, help="schedule k has seed SEED+k-1")
    ap.add_argument("--cycles", type=int, default=3, help="cut-off/back cycles per path")
    ap.add_argument("--joins", type=int, default=2, help="hand-overs per path")
    ap.add_argument("--params", type=float, default=25e6, help="parameters of the hand-over")
    ap.add_argument("--epochs", type=int, default=60, help="ledger epochs of each schedule")
    ap.add_argument("--failure-timeout", type=float, default=FAILURE_TIMEOUT)
    ap.add_argument("--keep", default=f"/tmp/dyntrain-multihost-kept-{time.strftime('%H%M%S')}",
                    help="where schedules that did not end bitwise equal keep their folders")
    ap.add_argument("--out", default=str(BENCH / "results" / "multihost.json"))
    args = ap.parse_args(argv)
    if args.rejudge:
        rejudge(Path(args.rejudge))
        return 0
    if args.quick:
        args.cycles, args.joins, args.schedules = 1, 1, min(args.schedules, 2)
    args.params = int(args.params)
    reason = unavailable()
    if reason:
        print(f"bench/multihost.py: {reason}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    torch.set_num_threads(1)
    load, machine = LoadWatch(), machine_info()  # the date: when it started
    say(f"load average {load.before[0]:.1f}; part {args.part}")
    result = {"benchmark": "several hosts: veth against loopback, random fault schedules",
              "command": " ".join([".venv/bin/python bench/multihost.py", *sys.argv[1:]]),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "keep")}}
    with tempfile.TemporaryDirectory(prefix="dyntrain-multihost-") as tmp, HostBed(4) as bed:
        say(f"bed {bed.token}: {', '.join(f'{h.name} {h.address}' for h in bed.hosts)}")
        if args.part in ("all", "paths"):
            result["paths"] = run_paths(bed, args, Path(tmp) / "logs")
        if args.part in ("all", "schedules"):
            result["schedules"] = run_schedules(bed, args, Path(tmp))
    left = bed.leftovers()  # namespaces' processes, links and files once the bed is closed
    result["bed_left_behind"] = left
    result["machine"] = {**machine, "ended": machine_info()["date"], **load.stop()}
    tables = []
    if "paths" in result:
        tables.append(paths_table(result["paths"]))
    if "schedules" in result:
        s = result["schedules"]
        tables.append(schedules_table(s))
        tables.append(f"bitwise equal to the static run: {s['bitwise']} of {s['schedules']}; "
                      f"samples applied twice: {s['applied_twice']}, never: "
                      f"{s['never_applied']}; processes left on hosts: {s['processes_left']}; "
                      f"namespaces, links or files left: {len(left)}")
    result["table"] = "\n\n".join(tables)
    print("\n" + result["table"])
    during = result["machine"]["loadavg_during"]
    print(f"load average: {load.before[0]:.1f} before, {during['median']:.1f} median during "
          f"(max {during['max']}), {result['machine']['loadavg_after'][0]:.1f} after")
    result["total_seconds"] = time.monotonic() - BEGAN
    write_result(args.out, result)
    return 0


def run(argv: list[str] | None = None) -> int:
    """``main``, with an interruption said in one line (the bed is gone by then)."""
    try:
        return main(argv)
    except KeyboardInterrupt as exc:
        print(f"bench/multihost.py: interrupted ({exc or 'Ctrl-C'}); every host, namespace and "
              "process of the bed was removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(run())
