"""Rescale latency against model size: join, leave and kill with an MLP + Adam of about 1M, 25M
and 100M parameters, on loopback gloo, and the state hand-over alone (pickled vs flat).

For each size:

* hand-over: two plain processes (``rescale_size_worker.py --handover``), rank 0 holding the
  trained state, rank 1 receiving it: the whole state dict as ``torch.save`` bytes (how joiners
  got it before) against ``transfer.broadcast_state`` (skeleton + flat tensors), each including
  the receiver's ``restore_state``;
* rescale: ``dyntrain run --workers 1:3 --nproc 2`` with ``step=3:join=1,step=6:leave=rank:1,
  step=9:kill=rank:1`` (each fires once the previous one took effect); from events.jsonl the
  latency of each change (request, or the joiner's hello, to the first step completed in the new
  world), the state sync inside it (``state_sync_s``: the leader's time in the hand-over) and the
  steady step time from metrics.jsonl.

    .venv/bin/python bench/rescale_size.py                       # ~5 minutes
    .venv/bin/python bench/rescale_size.py --sizes 1e6,25e6      # smaller

Writes a table to stdout and ``bench/results/rescale_size.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import free_port, machine_info, read_jsonl, write_result
from dyntrain.elastic.runs.log import read_metrics

BENCH = Path(__file__).resolve().parent
WORKER = BENCH / "rescale_size_worker.py"
EVENTS = "step=3:join=1,step=6:leave=rank:1,step=9:kill=rank:1"


def handover(params: int, timeout: float) -> dict:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), "--params", str(params),
                               "--handover", str(rank), "2", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"hand-over run failed:\n{outs[0][-2000:]}\n{outs[1][-2000:]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def rescale(params: int, steps: int, work: Path, timeout: float) -> dict:
    out = work / f"run-{params}"
    cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1:3", "--nproc", "2",
           "--out", str(out), "--quiet", "--events", EVENTS, str(WORKER), "--params",
           str(params), "--steps", str(steps)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=BENCH.parent)
    if proc.returncode:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    events = read_jsonl(out / "events.jsonl")
    times = [r.time for r in sorted(read_metrics(out), key=lambda r: r.step)]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    result = {"wall_s": time.perf_counter() - t0, "step_s": statistics.median(gaps),
              "events": events}
    for e in events:
        if e["event"] in ("join", "leave", "crash"):
            result[e["event"]] = {"latency_s": e["latency_s"],
                                  "state_sync_s": e.get("state_sync_s"),
                                  "steps_redone": e.get("steps_redone")}
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,25e6,100e6", help="parameter counts")
    ap.add_argument("--steps", type=int, default=24, help="steps per rescale run")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default=str(BENCH / "results" / "rescale_size.json"))
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="dyntrain-rescale-size-") as tmp:
        for params in sizes:
            hand = handover(params, args.timeout)
            run = rescale(params, args.steps, Path(tmp), args.timeout)
            row = {"params_target": params, **hand, **run}
            rows.append(row)
            print(f"{hand['params'] / 1e6:7.1f}M params, state {hand['state_mb']:7.0f} MB: "
                  f"hand-over pickled {hand['pickled']:.3f} s, flat {hand['flat']:.3f} s; "
                  + ", ".join(f"{k} {run[k]['latency_s']:.3f} s (sync {run[k]['state_sync_s']})"
                              for k in ("join", "leave", "crash") if k in run)
                  + f"; step {run['step_s']:.3f} s", flush=True)
    print()
    print("| params | state (model + Adam) | hand-over, pickled | hand-over, flat | join | "
          "(state sync) | leave | kill | step |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        def cell(kind: str, key: str = "latency_s", r=r) -> str:
            value = r.get(kind, {}).get(key)
            return "–" if value is None else f"{value:.2f} s"
        print(f"| {r['params'] / 1e6:.1f}M | {r['state_mb']:.0f} MB | {r['pickled']:.2f} s | "
              f"{r['flat']:.2f} s | {cell('join')} | {cell('join', 'state_sync_s')} | "
              f"{cell('leave')} | {cell('crash')} | {r['step_s']:.2f} s |")
    write_result(args.out, {"benchmark": "rescale latency vs model size (CPU, gloo)",
                            "machine": machine_info(), "events": EVENTS, "rows": rows})


if __name__ == "__main__":
    main()
