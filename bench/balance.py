"""Mixed-speed workers: samples/s with and without chunk balancing, against the ideal.

Two workers train the ledger workload (``tests/scripts/ledger_train.py``, global batch 32 cut into
16 chunks of two samples) where every chunk sleeps ``--chunk-delay`` seconds, and worker w1's chunks
``--slow-factor`` times as long (a slower instance type). Sleeping, not computing, keeps the
speeds what they are told to be on a shared machine. Balancing on (the default) against
``TrainConfig(balance=False)`` (even blocks: 8 chunks each), alternating, ``--rounds`` each. The
ideal is both workers busy all the time: a step of C chunks takes C / (1/d + 1/(f d)).

    .venv/bin/python bench/balance.py             # ~3 minutes

Writes a table to stdout and ``bench/results/balance.json``.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine_info, write_result
from dyntrain.elastic.runs.log import read_metrics

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LEDGER = ROOT / "tests" / "scripts" / "ledger_train.py"
GLOBAL_BATCH, CHUNKS = 32, 16


def one_run(out: Path, balance: bool, args) -> dict:
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "2", "--out", str(out),
           "--quiet", str(LEDGER), "--epochs", str(args.epochs), "--global-batch",
           str(GLOBAL_BATCH), "--chunk-size", str(GLOBAL_BATCH // CHUNKS),
           "--step-delay", str(args.chunk_delay), "--slow-in", "w1", "--slow-factor",
           str(args.slow_factor), *([] if balance else ["--no-balance"])]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    rows = read_metrics(out)
    rows = sorted(rows, key=lambda r: r.step)[len(rows) // 5:]  # after warm-up
    step_s = (rows[-1].time - rows[0].time) / (len(rows) - 1)
    splits = collections.Counter(r.chunks for r in rows)
    return {"step_s": step_s, "samples_per_s": GLOBAL_BATCH / step_s,
            "split": "/".join(map(str, splits.most_common(1)[0][0]))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-delay", type=float, default=0.01, help="seconds per chunk (fast)")
    ap.add_argument("--slow-factor", type=float, default=2.0)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(BENCH / "results" / "balance.json"))
    args = ap.parse_args(argv)
    d, f = args.chunk_delay, args.slow_factor
    ideal = GLOBAL_BATCH / (CHUNKS / (1 / d + 1 / (f * d)))
    runs: dict[str, list[dict]] = {"balanced": [], "even": []}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dyntrain-balance-") as tmp:
        for r in range(args.rounds):
            order = ("balanced", "even") if r % 2 == 0 else ("even", "balanced")
            for name in order:
                res = one_run(Path(tmp) / f"{name}-{r}", name == "balanced", args)
                runs[name].append(res)
                print(f"round {r + 1} {name}: {res['samples_per_s']:.1f} samples/s, "
                      f"chunks {res['split']}", flush=True)
    print(f"\n| chunks per worker | samples/s (median of {args.rounds}) | of ideal |")
    print("| --- | ---: | ---: |")
    table = {}
    for name in ("even", "balanced"):
        sps = statistics.median(x["samples_per_s"] for x in runs[name])
        table[name] = sps
        label = "even (balance=False)" if name == "even" else "balanced (default)"
        print(f"| {label}: {runs[name][-1]['split']} | {sps:.1f} | {sps / ideal:.0%} |")
    print(f"| ideal (both busy all the time) | {ideal:.1f} | 100% |")
    print(f"\nbalanced / even: {table['balanced'] / table['even']:.2f}x")
    write_result(args.out, {"benchmark": "mixed-speed balance (ledger, sleep per chunk)",
                            "machine": machine_info(), "chunk_delay": d, "slow_factor": f,
                            "ideal_samples_per_s": ideal, "runs": runs,
                            "total_seconds": time.monotonic() - began})


if __name__ == "__main__":
    main()
