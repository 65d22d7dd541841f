"""`make demo`: an elastic run on the digits workload beside a static one, and how they compare.

The elastic run's world goes 1 -> 3 (two workers join) -> 2 (one is SIGKILLed) -> 4 (two more
join) -> 3 (rank 0 gets a preemption notice and leaves), while the global batch stays 64.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from dyntrain.elastic.runs.log import read_events

WORKLOAD = ["-m", "dyntrain.workloads.digits", "--epochs", "20", "--global-batch", "64",
            "--chunk-size", "8"]
EVENTS = "step=10:join=2,step=20:kill=1,step=30:join=2,step=40:leave=rank:0"


def dyntrain(*args: str) -> None:
    cmd = [sys.executable, "-m", "dyntrain.cli.main", *args]
    print("$ dyntrain " + " ".join(args), flush=True)
    code = subprocess.call(cmd)
    if code != 0:
        sys.exit(f"demo: `dyntrain {args[0]}` failed with exit code {code}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="runs/demo")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    static, elastic = out / "static", out / "elastic"

    print("== 1/3 static run: one worker, no changes", flush=True)
    dyntrain("run", "--workers", "1", "--quiet", "--out", str(static), *WORKLOAD)
    print("\n== 2/3 elastic run: workers join, crash and leave while it trains", flush=True)
    dyntrain("run", "--workers", "1:4", "--nproc", "1", "--out", str(elastic), "--events", EVENTS,
             *WORKLOAD, "--step-delay", "0.006")

    print("\n== 3/3 summary", flush=True)
    print(f"{'change':<8} {'workers':<10} {'world':>7} {'at step':>8} {'latency':>9} "
          f"{'redone':>7}")
    for e in read_events(elastic):
        world = f"{e.world_before}->{e.world_after}"
        print(f"{e.kind:<8} {','.join(e.workers):<10} {world:>7} {e.start_step:>8} "
              f"{e.latency_s:>8.3f}s {e.steps_redone:>7}")
    a = torch.load(static / "final.pt", weights_only=True)
    b = torch.load(elastic / "final.pt", weights_only=True)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a if a[k].is_floating_point())
    acc_s = json.loads((static / "result.json").read_text())["val_accuracy"]
    acc_e = json.loads((elastic / "result.json").read_text())["val_accuracy"]
    print(f"\nvalidation accuracy: static {acc_s:.4f}, elastic {acc_e:.4f}")
    print(f"max |elastic - static| over all parameters and buffers: {diff:.3g}")
    print("the elastic run is " + ("identical to" if diff == 0 else
                                  "within float rounding of" if diff < 1e-5 else
                                  "NOT equal to") + " the static run")
    sys.exit(0 if diff < 1e-5 else 1)


if __name__ == "__main__":
    main()
