"""Parameter, gradient and optimizer-state bytes per member and step time, unsharded
(``--shard 0``) against ZeRO-1 (``--shard 1``), ZeRO-2 (``--shard 2``) and ZeRO-3
(``--shard 3``), redundancy ``r``, with the GPT workload and AdamW (no clipping, as when
levels 2-3 refused it: the recorded results were measured so) on loopback gloo.

For each level, one ``dyntrain run --workers N:N --nproc N`` of this script as the worker
(``--worker``: the GPT workload of ``dyntrain.workloads.gpt``, which then writes what it holds
into the run folder): per member the bytes of the AdamW state it holds between checkpoints (at
level 0 the whole state; at levels 1-2 the tensors it owns; while the leader writes a checkpoint
it holds the whole state for the write), the bytes of its gradient buffers
(``ChunkStepper.gradient_bytes``: the flat buffer backward writes into, and the float64 chunk
sum at levels 0-1 or the primaries' float64 round sums at level 2, when a member computes
several chunks), the bytes of the parameters it holds between steps (the most after any step
but the first, before a checkpoint's or a validation's whole-model gather; at level 3 its owned
tensors', at levels 0-2 all) and the most it held during a step but the first (level 3: the
owned ones plus what the units' gathers add; a generation's first step still holds the
copies of before its re-sharding), its peak RSS, and the median step time of the leader's
``metrics.jsonl`` (the first steps left out). The final models of all levels are compared bit
for bit.

    .venv/bin/python bench/shard_memory.py                       # ~4 minutes on 2 loaded cores
    .venv/bin/python bench/shard_memory.py --workers 2 --model tiny --steps 10

Prints a table and writes ``bench/results/shard_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import machine_info, read_jsonl, write_result

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def worker(argv: list[str]) -> None:
    """Train the GPT workload as one member, then record what it holds."""
    from dyntrain.workloads import gpt

    args = gpt.build_parser().parse_args(argv)
    trainer = gpt.build(args)
    params = trainer.stepper.params
    whole = sum(q.numel() * q.element_size() for q in params)
    units = trainer.sharding.units  # level 3's parameters, None below
    between, peaks, peak = [], [], [whole]  # per step; the current step's most
    finish = trainer.stepper.finish

    def finish_and_measure(*a, **k):  # after the step, before any whole-model gather
        result = finish(*a, **k)
        between.append(units.present_bytes() if units is not None else whole)
        peaks.append(peak[0])
        peak[0] = 0 if units is not None else whole
        return result

    trainer.stepper.finish = finish_and_measure
    if units is not None:
        gather = units._gather

        def gather_and_measure(k: int) -> None:
            gather(k)
            if units._active:
                peak[0] = max(peak[0], units.present_bytes())

        units._gather = gather_and_measure
        peak[0] = 0
    trainer.fit()
    held = trainer.sharding.owned_state_bytes()
    out = Path(os.environ["DYNTRAIN_OUT"])
    (out / f"member-{trainer.worker_id}.json").write_text(json.dumps({
        "worker": trainer.worker_id, "optimizer_state_bytes": held,
        "gradient_bytes": trainer.stepper.gradient_bytes(),
        "parameter_bytes_between_steps": max(between[1:] or between),
        "parameter_bytes_peak_in_step": max(peaks[1:] or peaks),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "parameters": sum(q.numel() for q in trainer.stepper.params)}))
    if trainer.is_leader:
        trainer.report(steps=trainer.step)


def run_level(level: int, args: argparse.Namespace, folder: Path) -> dict:
    """One run at ``level``; its members' records and the leader's median step time."""
    out = folder / f"shard{level}"
    gpt_args = ["--model", args.model, "--seq-len", "64", "--global-batch",
                str(args.global_batch), "--chunk-size", "4", "--grad-clip", "0",
                "--max-steps", str(args.steps), "--warmup-steps", "2",
                "--val-every", str(args.steps), "--val-samples", "4",
                "--checkpoint-every", str(args.steps), "--shard", str(level),
                "--shard-redundancy", str(args.redundancy)]
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dyntrain.cli.main", "run", "--workers",
                           f"{args.workers}:{args.workers}", "--nproc", str(args.workers),
                           "--out", str(out), str(Path(__file__).resolve()), "--worker",
                           *gpt_args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"level {level}: exit {proc.returncode}\n{proc.stdout[-2000:]}"
                         f"\n{proc.stderr[-2000:]}")
    members = [json.loads(p.read_text()) for p in sorted(out.glob("member-*.json"))]
    rows = read_jsonl(out / "metrics.jsonl")
    steady = [args.chunk_batch / r["samples_per_s"] for r in rows[2:]] or [
        args.chunk_batch / r["samples_per_s"] for r in rows]
    return {"level": level, "members": members, "step_s": statistics.median(steady),
            "wall_s": time.perf_counter() - began, "final": str(out / "final.pt")}


def main() -> None:
    if "--worker" in sys.argv:
        worker([a for a in sys.argv[1:] if a != "--worker"])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--redundancy", type=int, default=2)
    ap.add_argument("--model", default="small", help="a GPT preset [small: ~3.3M]")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--global-batch", type=int, default=32,
                    help="samples per step, in chunks of 4 [32: 2 chunks per member of 4]")
    ap.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--out", default=str(BENCH / "results" / "shard_memory.json"))
    args = ap.parse_args()
    args.chunk_batch = args.global_batch  # step seconds = batch / samples_per_s
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_level(level, args, Path(tmp)) for level in args.levels]
        a, *others = (torch.load(r["final"], weights_only=True) for r in runs)
        same = all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
                   for b in others)
    print(f"GPT {args.model}, AdamW, {args.workers} workers, r = {args.redundancy}, "
          f"{args.steps} steps; final models bitwise equal: {same}\n")
    print("| level | parameters between steps (MB: min-max) | parameters at most in a step "
          "(MB) | gradient buffers per member (MB: min-max) | optimizer state per member "
          "(MB: min-max) | peak RSS per member (MB) | step (s, median) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        between = [m["parameter_bytes_between_steps"] / 1e6 for m in r["members"]]
        peak = [m["parameter_bytes_peak_in_step"] / 1e6 for m in r["members"]]
        grads = [m["gradient_bytes"] / 1e6 for m in r["members"]]
        held = [m["optimizer_state_bytes"] / 1e6 for m in r["members"]]
        rss = [m["peak_rss_bytes"] / 1e6 for m in r["members"]]
        print(f"| {r['level']} | {min(between):.2f}-{max(between):.2f} | {min(peak):.2f}-"
              f"{max(peak):.2f} | {min(grads):.2f}-{max(grads):.2f} | {min(held):.2f}-"
              f"{max(held):.2f} | {min(rss):.0f}-{max(rss):.0f} | {r['step_s']:.3f} |")
        del r["final"]
    write_result(args.out, {"machine": machine_info(), "load_average": os.getloadavg(),
                            "workers": args.workers, "global_batch": args.global_batch,
                            "redundancy": args.redundancy, "model": args.model,
                            "steps": args.steps, "final_models_bitwise_equal": same,
                            "runs": runs, "total_seconds": time.perf_counter() - started})


if __name__ == "__main__":
    main()
