"""The GPT workload on one GPU: dyntrain's exact elastic step beside a plain PyTorch loop, in
fp32 and bf16.

For each model preset (``--models``) and precision (``--precisions``), two runs of ``--steps``
steps of the same global batch (``--global-batch`` windows of ``--seq-len`` bytes, in chunks /
micro-batches of ``--chunk-size``), each in a process of its own:

* **dyntrain**: ``dyntrain run --workers 1:1 -m dyntrain.workloads.gpt`` at ``--shard``, the
  product as a user starts it (its exact float64 chunk sums, its checkpoints off); the step
  time is the median time between step ends in ``metrics.jsonl`` (the first
  ``WARMUP`` steps and the last left out), the peak GPU memory what the workload reports;
* **torch**: the same model, AdamW groups, schedule, clipping and autocast in a plain loop
  (gradient accumulation over the chunks, one ``optimizer.step()``), timed per step with
  ``torch.cuda.synchronize()``.

Samples/s = global batch / step time; the ratio is dyntrain's over torch's. Without a GPU it
runs on the CPU (a smoke run: ``--models tiny --steps 6``).

    python bench/gpu_gpt.py                               # ~4 minutes on one H100/H200
    python bench/gpu_gpt.py --models tiny --steps 6 --out /tmp/gpu_gpt.json   # anywhere

Prints a table and writes ``bench/results/gpu_gpt.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "src"))

from _common import write_result  # noqa: E402

WARMUP = 3  # steps left out of the step time: allocator, cuBLAS heuristics, autotuning


def gpt_flags(args: argparse.Namespace, model: str, precision: str) -> list[str]:
    """The workload's flags shared by both runs (validation and checkpoints out of the way)."""
    return ["--model", model, "--precision", precision, "--max-steps", str(args.steps),
            "--seq-len", str(args.seq_len), "--global-batch", str(args.global_batch),
            "--chunk-size", str(args.chunk_size), "--val-every", "1000000",
            "--val-samples", str(args.chunk_size), "--checkpoint-every", "1000000",
            "--threads", str(args.threads), "--warmup-steps", "2"]


def steady(times: list[float]) -> float:
    """The median gap between step ends after ``WARMUP`` steps, the last gap left out."""
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)][WARMUP:-1]
    if not gaps:
        raise SystemExit(f"gpu_gpt: error: --steps must exceed {WARMUP + 2}")
    return statistics.median(gaps)


def run_dyntrain(args, model: str, precision: str) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="gpu_gpt.") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "dyntrain.cli.main", "run", "--workers", "1:1", "--quiet",
               "--no-tensorboard", "--out", str(out), "-m", "dyntrain.workloads.gpt",
               *gpt_flags(args, model, precision), "--shard", str(args.shard)]
        began = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=args.timeout)
        if proc.returncode != 0:
            return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"}
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        steps = sorted((r for r in rows if "loss" in r and "step" in r), key=lambda r: r["step"])
        result = json.loads((out / "result.json").read_text())
        values = result.get("values", result)
        return {"step_s": steady([r["time"] for r in steps]), "last_loss": steps[-1]["loss"],
                "gpu_peak_mib": values.get("gpu_peak_mib"), "device": values.get("device"),
                "wall_s": round(time.perf_counter() - began, 1)}


def run_torch(args, model: str, precision: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-worker", model, precision,
           "--steps", str(args.steps), "--seq-len", str(args.seq_len), "--global-batch",
           str(args.global_batch), "--chunk-size", str(args.chunk_size), "--threads",
           str(args.threads)]
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]),
            "wall_s": round(time.perf_counter() - began, 1)}


def torch_worker(args, model_name: str, precision: str) -> None:
    """The plain loop: prints one JSON line (step time, last loss, peak GPU memory)."""
    import torch

    from dyntrain.workloads.gpt import build_parser, model_config, next_byte_loss
    from dyntrain.workloads.gpt_model import GPT, WarmupCosineLR, adamw_groups
    from dyntrain.workloads.textcorpus import byte_windows, load_corpus

    gargs = build_parser().parse_args(gpt_flags(args, model_name, precision))
    cfg = model_config(gargs)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    (windows,) = byte_windows(load_corpus().train, cfg.seq_len).tensors
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(adamw_groups(model, gargs.weight_decay), lr=gargs.lr,
                            betas=(0.9, 0.95))
    sched = WarmupCosineLR(opt, 2, args.steps, gargs.min_lr_ratio)
    loss_fn = next_byte_loss(precision, device)
    chunks = args.global_batch // args.chunk_size
    ends, loss_value = [], float("nan")
    for _ in range(args.steps):
        picked = torch.randint(len(windows), (args.global_batch,))
        batch = windows[picked].to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for c in range(chunks):
            part = batch[c * args.chunk_size:(c + 1) * args.chunk_size]
            loss = loss_fn(model, (part,)) / chunks
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), gargs.grad_clip)
        opt.step()
        sched.step()
        loss_value = float(total)  # synchronises
        ends.append(time.perf_counter())
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    print(json.dumps({"step_s": steady(ends), "last_loss": loss_value,
                      "gpu_peak_mib": round(peak) if peak is not None else None,
                      "device": device.type}))


def machine() -> dict:
    import platform

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count,
                    tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return info


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="25m,100m")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=16)
    ap.add_argument("--shard", type=int, choices=(0, 1, 2), default=0,
                    help="dyntrain's shard level (one worker: nothing is sharded)")
    ap.add_argument("--threads", type=int, default=4, help="torch CPU threads per process")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--torch-worker", nargs=2, metavar=("MODEL", "PRECISION"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(BENCH / "results" / "gpu_gpt.json"))
    args = ap.parse_args(argv)
    if args.global_batch % args.chunk_size:
        ap.error("--global-batch must be a multiple of --chunk-size")
    if args.steps < WARMUP + 3:
        ap.error(f"--steps must be at least {WARMUP + 3}")
    if args.torch_worker:
        torch_worker(args, *args.torch_worker)
        return
    started = time.perf_counter()
    rows = []
    print(f"{'model':>6} {'prec':>5} {'dyntrain s/step':>16} {'torch s/step':>13} "
          f"{'samples/s dyn':>14} {'torch':>8} {'ratio':>6} {'GPU MiB dyn':>12} {'torch':>7}",
          flush=True)
    for model in args.models.split(","):
        for precision in args.precisions.split(","):
            dyn, ref = run_dyntrain(args, model, precision), run_torch(args, model, precision)
            row = {"model": model, "precision": precision, "dyntrain": dyn, "torch": ref}
            if "step_s" in dyn and "step_s" in ref:
                row["samples_per_s"] = {"dyntrain": args.global_batch / dyn["step_s"],
                                        "torch": args.global_batch / ref["step_s"]}
                row["ratio"] = ref["step_s"] / dyn["step_s"]
                print(f"{model:>6} {precision:>5} {dyn['step_s']:>16.4f} {ref['step_s']:>13.4f} "
                      f"{row['samples_per_s']['dyntrain']:>14.1f} "
                      f"{row['samples_per_s']['torch']:>8.1f} {row['ratio']:>6.2f} "
                      f"{dyn.get('gpu_peak_mib') or '-':>12} {ref.get('gpu_peak_mib') or '-':>7}",
                      flush=True)
            else:
                print(f"{model:>6} {precision:>5} failed: {dyn.get('error') or ref.get('error')}",
                      flush=True)
            rows.append(row)
    result = {"benchmark": "gpu_gpt", "machine": machine(), "command": " ".join(sys.argv),
              "config": {k: v for k, v in vars(args).items() if k != "torch_worker"},
              "tokens_per_sample": args.seq_len, "runs": rows,
              "total_seconds": round(time.perf_counter() - started, 1)}
    write_result(args.out, result)


if __name__ == "__main__":
    main()
