"""Sharded data parallelism on CPU/gloo: memory per worker and step time of dyntrain's shard
levels beside plain DDP and torch's FSDP2, and re-shard latency through a join, a leave and a
crash.

The GPT workload (``dyntrain.workloads.gpt``, presets ``25m`` and ``100m``) with AdamW, weight
decay and clipping, one torch thread per worker, gloo on loopback; every run trains
``--steps`` steps of the same global batch (``--global-batch`` windows of ``--seq-len`` bytes,
micro-batches/chunks of ``--chunk-size``):

* **memory and step time** (``SETUPS``): each setup at each of its world sizes, one run each;
  dyntrain setups through ``dyntrain run --workers N:N --nproc N``, the torch baselines as N
  plain processes (``sharded_worker.py``). After the last step every worker counts the bytes of
  the tensors it holds (parameters, gradients, optimizer state, the rest; the data set
  apart) and its peak RSS so far. The step time is the median time between step ends,
  leaving out the first step and the last (which includes the count);
* **re-shard latency** (``--reshard-models``): one ``dyntrain run --workers 1:3 --nproc 3`` at
  ``--reshard-level`` (default 1; ``r = 2``) with a graceful leave (3 -> 2), a join (2 -> 3)
  and a SIGKILL (3 -> 2); per change the latency of ``events.jsonl`` (the request, or the
  joiner's hello, to the first step of the new world), the state hand-over inside it, and from
  the members' probes the time in the re-sharding (the last member's entry to the last exit,
  and per part the slowest member's: the survey's all-reduce, the plan, the moves, parameters
  sent again), the bytes of optimizer state the members received against the bytes of the
  tensors whose owners changed (``shardplan.diff_plans``), and the bytes of parameters they
  received.

Levels 2 and 3 are entries of ``SETUPS`` too (``l2r2``, ``l3r2``, ``l3r1``).

    .venv/bin/python bench/sharded.py                          # ~30 minutes on 2 loaded cores
    .venv/bin/python bench/sharded.py --setups "25m=l0@2,l1r2@2" --reshard-models 25m

Prints tables and writes ``bench/results/sharded.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import free_port, machine_info, median, read_jsonl, write_result
from dyntrain.elastic.runs.log import read_metrics

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORKER = BENCH / "sharded_worker.py"
RESHARD_EVENTS = "step=2:leave=rank:1,step=4:join=1,step=6:kill=rank:1"


@dataclass(frozen=True)
class Setup:
    """One way to train the step: a dyntrain shard level and redundancy, or a torch baseline.

    Args:
        key: Its name on the command line (``--setups``).
        name: How the tables name it.
        system: ``dyntrain``, ``ddp`` or ``fsdp2``.
        level: dyntrain's ``--shard``.
        redundancy: dyntrain's ``--shard-redundancy``.
        worlds: The world sizes it runs at.
    """

    key: str
    name: str
    system: str
    level: int = 0
    redundancy: int = 2
    worlds: tuple[int, ...] = (1, 2, 4)


SETUPS = (
    Setup("l0", "dyntrain level 0", "dyntrain", 0),
    Setup("l1r2", "dyntrain level 1, r = 2", "dyntrain", 1, 2),
    Setup("l1r1", "dyntrain level 1, r = 1", "dyntrain", 1, 1, worlds=(4,)),
    Setup("l2r2", "dyntrain level 2, r = 2", "dyntrain", 2, 2),
    Setup("l3r2", "dyntrain level 3, r = 2", "dyntrain", 3, 2),
    Setup("l3r1", "dyntrain level 3, r = 1", "dyntrain", 3, 1, worlds=(4,)),
    Setup("ddp", "torch DDP", "ddp", worlds=(2, 4)),
    Setup("fsdp2", "torch FSDP2", "fsdp2", worlds=(2, 4)),
)
#: What runs by default: everything at 25M; at 100M world 2, and world 4 for level 3 only
#: (four workers of 100M with level 0's buffers would take most of this machine's 23 GB).
PLAN = ("25m=l0,l1r2,l1r1,l2r2,l3r2,l3r1,ddp,fsdp2;"
        "100m=l0@1/2,l1r1@2,l3r2@2/4,l3r1@4,ddp@2,fsdp2@2")


def gpt_args(args: argparse.Namespace, model: str, steps: int, level: int = 0,
             redundancy: int = 2) -> list[str]:
    """The GPT workload's flags of every run."""
    return ["--model", model, "--seq-len", str(args.seq_len), "--global-batch",
            str(args.global_batch), "--chunk-size", str(args.chunk_size), "--max-steps",
            str(steps), "--warmup-steps", "2", "--val-every", str(steps), "--val-samples", "2",
            "--checkpoint-every", str(steps), "--shard", str(level), "--shard-redundancy",
            str(redundancy)]


def per_model(spec: str) -> list[tuple[str, str]]:
    """``MODEL=VALUE;MODEL=VALUE`` as pairs."""
    pairs = [item.split("=", 1) for item in spec.split(";") if item.strip()]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit(f"sharded.py: expected MODEL=VALUE;..., got {spec!r}")
    return [(m.strip(), v.strip()) for m, v in pairs]


def runs_of(spec: str) -> list[tuple[Setup, int]]:
    """``KEY[@W/W],...`` as (setup, world) pairs."""
    keys = {s.key: s for s in SETUPS}
    runs = []
    for item in filter(None, spec.split(",")):
        key, _, worlds = item.strip().partition("@")
        if key not in keys:
            raise SystemExit(f"sharded.py: unknown setup {key!r}: one of {', '.join(keys)}")
        runs += [(keys[key], w) for w in (
            [int(w) for w in worlds.split("/")] if worlds else keys[key].worlds)]
    return runs


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def steady_step_s(ends: list[float]) -> float | None:
    """The median step time from the end times of steps 1..S: steps 2..S-1 (the first step
    allocates the optimizer state, the last includes the count)."""
    gaps = [ends[i + 1] - ends[i] for i in range(len(ends) - 2)]
    return median(gaps) if gaps else None


def run_dyntrain(args, setup: Setup, model: str, world: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", f"{world}:{world}",
           "--nproc", str(world), "--out", str(out),
           # the members' count walks every Python object: slower than the 3 s heartbeat
           # timeout on a loaded machine
           "--failure-timeout", "60", str(WORKER), "dyntrain",
           *gpt_args(args, model, args.model_steps[model], setup.level,
                     setup.redundancy)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode:
        return {"error": f"exit {proc.returncode}\n" + (proc.stdout + proc.stderr)[-3000:]}
    ends = [r.time for r in sorted(read_metrics(out), key=lambda r: r.step)]
    return {"members": [json.loads(p.read_text()) for p in sorted(out.glob("member-*.json"))],
            "step_ends": ends}


def run_baseline(args, setup: Setup, model: str, world: int, out: Path) -> dict:
    out.mkdir(parents=True)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), "baseline", setup.system, str(rank),
                               str(world), str(port), str(out),
                               *gpt_args(args, model, args.model_steps[model])], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=args.timeout)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            logs.append(proc.communicate()[0] + "\n(timed out)")
    if any(p.returncode for p in procs):
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        failed = next(log for p, log in zip(procs, logs, strict=True) if p.returncode)
        return {"error": failed[-3000:]}
    members = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    ends = [m.pop("step_end_times") for m in members][0]
    return {"members": members, "step_ends": ends[1:]}


def measure(args, setup: Setup, model: str, world: int, work: Path) -> dict:
    """One run of ``setup`` at ``world``: the members' census and the step time."""
    out = work / f"{model}-{setup.system}{setup.level}r{setup.redundancy}-w{world}"
    before, began = load1(), time.perf_counter()
    run = (run_dyntrain if setup.system == "dyntrain" else run_baseline)(
        args, setup, model, world, out)
    row = {"model": model, "setup": asdict(setup), "world": world, "load_before": before,
           "load_after": load1(), "wall_s": round(time.perf_counter() - began, 1), **run}
    if "error" not in run:
        row["step_s"] = steady_step_s(run["step_ends"])
        row["samples_per_s"] = args.global_batch / row["step_s"] if row["step_s"] else None
        row["parameters"] = run["members"][0]["parameters"]
    return row


def reshard_run(args, model: str, steps: int, work: Path) -> dict:
    """The join / leave / crash run at ``--reshard-level`` (``r = 2``), and what each change
    cost."""
    out = work / f"reshard-{model}"
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1:3", "--nproc", "3",
           "--out", str(out), "--events", RESHARD_EVENTS, str(WORKER), "dyntrain",
           *gpt_args(args, model, steps, args.reshard_level, 2)]
    before, began = load1(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    row = {"model": model, "events": RESHARD_EVENTS, "load_before": before,
           "load_after": load1(), "wall_s": round(time.perf_counter() - began, 1),
           "launcher_output": proc.stdout[-4000:]}
    if proc.returncode:
        return {**row, "error": f"exit {proc.returncode}\n" + (proc.stdout + proc.stderr)[-3000:]}
    reshards: dict[int, list[dict]] = {}
    for path in out.glob("reshard-*.jsonl"):
        for rec in read_jsonl(path):
            reshards.setdefault(rec["generation"], []).append(rec)
    metrics = sorted(read_metrics(out), key=lambda r: r.step)
    gaps: dict[int, list[float]] = {}
    for a, b in zip(metrics, metrics[1:], strict=False):
        if a.generation == b.generation:
            gaps.setdefault(b.world_size, []).append(b.time - a.time)
    by_world = {world: median(values) for world, values in gaps.items()}
    changes = []
    for event in read_jsonl(out / "events.jsonl"):
        recs = reshards.get(event.get("generation"), [])
        if event["event"] not in ("join", "leave", "crash") or not recs:
            continue
        gen_steps = [r.time for r in metrics if r.generation == event["generation"]]
        changes.append({
            "change": event["event"], "world_before": event["world_before"],
            "world_after": event["world_after"], "latency_s": event.get("latency_s"),
            "state_sync_s": event.get("state_sync_s"),
            # from the last member's entry (the plan's all-reduce waits for it) to the last exit
            "reshard_s": max(r["ended_at"] for r in recs) - max(r["began_at"] for r in recs),
            "reshard_s_slowest_member": max(r["reshard_s"] for r in recs),
            "state_needed_bytes": sum(r["state_needed_bytes"] for r in recs),
            "state_received_bytes": sum(r["state_received_bytes"] for r in recs),
            "params_received_bytes": sum(r["params_received_bytes"] for r in recs),
            # per part of the re-sharding, the slowest member's seconds
            "parts_s": {part: max(r["parts_s"].get(part, 0.0) for r in recs)
                        for part in sorted({k for r in recs for k in r["parts_s"]})},
            "moves": recs[0]["moves"], "param_bytes": recs[0]["param_bytes"],
            "new_world_step_s": median([b - a for a, b in zip(gen_steps, gen_steps[1:],
                                                                strict=False)]),
            "step_s_at_world_after": by_world.get(event["world_after"]),
            "event": event, "members": recs})
    return {**row, "changes": changes, "step_s_by_world": by_world,
            "member_files": sorted(p.name for p in out.glob("reshard-*.jsonl"))}


MB = 1e6


def print_tables(result: dict) -> None:
    level0 = {(r["model"], r["world"]): r for r in result["runs"]
              if r["setup"]["system"] == "dyntrain" and r["setup"]["level"] == 0
              and "error" not in r}
    print("\n| model | setup | world | params MB | grads MB | AdamW state MB (min-max) "
          "| vs level 0 | other MB | peak RSS MB (max) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result["runs"]:
        if "error" in r:
            print(f"| {r['model']} | {r['setup']['name']} | {r['world']} | failed | | | | | |")
            continue
        ms = r["members"]
        state = [m["optimizer_state_bytes"] for m in ms]
        base = level0.get((r["model"], r["world"]))
        ratio = (f"{max(state) / base['members'][0]['optimizer_state_bytes']:.2f}"
                 if base else "")
        print(f"| {r['model']} | {r['setup']['name']} | {r['world']} "
              f"| {ms[0]['params_bytes'] / MB:.0f} | {max(m['grads_bytes'] for m in ms) / MB:.0f} "
              f"| {min(state) / MB:.0f}-{max(state) / MB:.0f} | {ratio} "
              f"| {max(m['other_bytes'] for m in ms) / MB:.0f} "
              f"| {max(m['peak_rss_bytes'] for m in ms) / MB:.0f} |")
    print("\n| model | world | setup | step s | samples/s | load |")
    print("| --- | ---: | --- | ---: | ---: | --- |")
    for r in sorted(result["runs"], key=lambda r: (r["model"], r["world"])):
        if "error" not in r and r["step_s"]:
            print(f"| {r['model']} | {r['world']} | {r['setup']['name']} | {r['step_s']:.2f} "
                  f"| {r['samples_per_s']:.2f} | {r['load_before']}-{r['load_after']} |")
    print("\n| model | change | world | latency s | re-shard s | parts s | state needed MB "
          "| state received MB | parameters received MB |")
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for run in result["reshard"]:
        for c in run.get("changes", []):
            parts = ", ".join(f"{k} {v:.2f}" for k, v in c["parts_s"].items())
            print(f"| {run['model']} | {c['change']} | {c['world_before']} -> "
                  f"{c['world_after']} | {c['latency_s']} | {c['reshard_s']:.2f} | {parts} "
                  f"| {c['state_needed_bytes'] / MB:.0f} | {c['state_received_bytes'] / MB:.0f} "
                  f"| {c['params_received_bytes'] / MB:.0f} |")
    for r in result["runs"] + result["reshard"]:
        if "error" in r:
            print(f"\n{r['model']} {r.get('setup', {}).get('name', 're-shard')} "
                  f"{r.get('world', '')} failed:\n{r['error'][-1500:]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reshard-models", default="25m,100m", help="GPT presets to re-shard")
    ap.add_argument("--setups", default=PLAN,
                    help="what runs per model: MODEL=KEY[@W/W],...;... (KEY one of SETUPS; "
                         "without @ at the setup's own world sizes)")
    ap.add_argument("--steps", default="25m=5;100m=4",
                    help="steps per memory/speed run, per model: MODEL=N;...")
    ap.add_argument("--reshard-steps", default="25m=16;100m=12",
                    help="steps of the re-shard run per model, MODEL=N;... (enough for the "
                         "joiner to start and the three changes to happen)")
    ap.add_argument("--reshard-level", type=int, choices=(1, 2, 3), default=1,
                    help="the shard level of the re-shard runs (r = 2)")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--chunk-size", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--out", default=str(BENCH / "results" / "sharded.json"))
    args = ap.parse_args(argv)
    plan = {model: runs_of(spec) for model, spec in per_model(args.setups)}
    args.model_steps = {model: int(n) for model, n in per_model(args.steps)}
    reshard_steps = {model: int(n) for model, n in per_model(args.reshard_steps)}
    started, load_start = time.perf_counter(), load1()
    result: dict = {"benchmark": "sharded data parallelism (CPU, gloo)",
                    "machine": machine_info(), "loadavg_before": list(os.getloadavg()),
                    "command": " ".join([".venv/bin/python bench/sharded.py", shlex.join(
                        sys.argv[1:] if argv is None else argv)]).rstrip(),
                    "config": {k: v for k, v in vars(args).items() if k != "out"},
                    "runs": [], "reshard": []}
    with tempfile.TemporaryDirectory(prefix="dyntrain-sharded-") as tmp:
        for model, runs in plan.items():
            for setup, world in runs:
                    args.model_steps.setdefault(model, 5)
                    row = measure(args, setup, model, world, Path(tmp))
                    result["runs"].append(row)
                    print(f"{model} {setup.name} world {world}: "
                          + (f"step {row['step_s']:.2f} s" if "error" not in row and
                             row["step_s"] else "FAILED")
                          + f" (load {row['load_before']}-{row['load_after']}, "
                          f"{row['wall_s']} s)", flush=True)
        for model in filter(None, args.reshard_models.split(",")):
            row = reshard_run(args, model, reshard_steps.get(model, 30), Path(tmp))
            result["reshard"].append(row)
            print(f"{model} re-shard run: {len(row.get('changes', []))} changes "
                  f"(load {row['load_before']}-{row['load_after']}, {row['wall_s']} s)",
                  flush=True)
    result.update(loadavg_after=list(os.getloadavg()), load_start=load_start,
                  total_seconds=time.perf_counter() - started)
    print_tables(result)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
