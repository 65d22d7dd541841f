"""Training through the chunk loader vs training on pre-loaded tensors, same model and batch.

The ``digits-resnet`` recipe (small ResNet, 16 px digits JPEGs, global batch 128 in chunks of 32)
trains in this process (one thread, world size 1, ``ChunkStepper`` compute + apply per step):

- loader: chunks decoded and augmented by 2 ``ChunkLoader`` processes from the packed shards;
- pre-loaded: the same images decoded and augmented once beforehand, held as one
  ``TensorDataset`` (no per-step data work at all: the upper bound).

Rounds alternate the sides; each round times ``--steps`` steps after a warm-up. Headline: the
median over rounds of loader samples/s / pre-loaded samples/s (goal >= 0.95), with the CPU time
per step of the training process and of the loader processes (from /proc): on a machine with
spare cores the loader's CPU time runs beside training; on a busy 2-core one it competes.

    .venv/bin/python bench/train_through_loader.py          # ~2 minutes
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from _common import (  # bench/ is sys.path[0] when run as a script
    machine_info,
    process_cpu_seconds,
    write_result,
)
from dyntrain.data import ImageDataset, LoaderConfig, pack
from dyntrain.elastic.state import TrainingParts
from dyntrain.elastic.step.sampler import BatchOrder
from dyntrain.elastic.step.stepper import ChunkStepper
from dyntrain.recipes import get_recipe
from dyntrain.workloads.digits_images import write_digits_images


def steps_per_second(dataset, recipe, loader_workers: int | None, steps: int,
                     warmup: int, prefetch: int = 4) -> tuple[float, float, float]:
    """(steps/s, training-process CPU s/step, loader-processes CPU s/step)."""
    config = recipe.train_config()
    torch.manual_seed(0)
    model = recipe.build_model(10)
    opt, sched, scaler, loss = recipe.build(model, len(dataset), config)
    stepper = ChunkStepper(config, TrainingParts(model, opt, sched, scaler), dataset, loss,
                           torch.device("cpu"))
    total = config.total_steps(len(dataset))
    if loader_workers is not None:
        order = BatchOrder(config.seed, len(dataset), config.global_batch)
        stepper.loader = LoaderConfig(workers=loader_workers, prefetch=prefetch).build(
            dataset, order, config.chunk_size, total, config.seed, torch.device("cpu"))
    chunks = stepper.my_chunks(0, 1)
    pids = [w.pid for w in stepper.loader._it._workers] if loader_workers else []
    start = cpu = loader_cpu = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            start, cpu, loader_cpu = (time.perf_counter(), time.process_time(),
                                      process_cpu_seconds(pids))
        stepper.apply(stepper.compute(step % total, chunks))
    rate = steps / (time.perf_counter() - start)
    cpu = (time.process_time() - cpu) / steps
    loader_cpu = (process_cpu_seconds(pids) - loader_cpu) / steps
    if stepper.loader is not None:
        stepper.loader.close()
    return rate, cpu, loader_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loader-workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=4, help="chunks in flight [4]")
    ap.add_argument("--out", default="bench/results/train_through_loader.json")
    args = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="train-loader-"))
    write_digits_images(tmp / "jpeg", size=16)
    pack(str(tmp / "jpeg" / "train"), str(tmp / "packed"))
    recipe = get_recipe("digits-resnet")
    images = ImageDataset(str(tmp / "packed"), recipe.transform)
    torch.manual_seed(0)
    pairs = [images[i] for i in range(len(images))]  # decoded and augmented once
    preloaded = TensorDataset(torch.stack([x for x, _ in pairs]),
                              torch.tensor([y for _, y in pairs]))
    rates: dict[str, list[float]] = {"pre-loaded tensors": [], "loader": []}
    cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in rates}
    for r in range(args.rounds):
        for name in (list(rates) if r % 2 == 0 else list(reversed(rates))):
            rate, train_cpu, loader_cpu = steps_per_second(
                preloaded if name != "loader" else images, recipe,
                args.loader_workers if name == "loader" else None, args.steps, args.warmup,
                args.prefetch)
            rates[name].append(rate * recipe.global_batch)
            cpu[name].append((train_cpu, loader_cpu))
            print(f"round {r}: {name}: {rates[name][-1]:.0f} samples/s", flush=True)
    ratios = [a / b for a, b in zip(rates["loader"], rates["pre-loaded tensors"], strict=True)]
    load = os.getloadavg()
    print(f"\ndigits-resnet, 16 px JPEGs from packed shards, global batch "
          f"{recipe.global_batch} / chunk {recipe.chunk_size}, {args.loader_workers} loader "
          f"processes, prefetch {args.prefetch}, {args.rounds} rounds of {args.steps} steps; "
          f"load average {load[0]:.2f}")
    print("| side | samples/s (median) | training CPU ms/step | loader CPU ms/step |")
    print("| --- | ---: | ---: | ---: |")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.0f} | "
              f"{statistics.median(c[0] for c in cpu[name]) * 1e3:.1f} | "
              f"{statistics.median(c[1] for c in cpu[name]) * 1e3:.1f} |")
    print(f"loader / pre-loaded: {statistics.median(ratios):.3f} (median of per-round ratios; "
          f"rounds {', '.join(f'{x:.3f}' for x in ratios)})")
    write_result(args.out, {"machine": machine_info(), "args": vars(args),
                            "samples_per_s": rates, "ratios": ratios, "cpu_s_per_step": cpu,
                            "ratio_median": statistics.median(ratios), "load_average": load,
                            "total_seconds": time.time() - t0})


if __name__ == "__main__":
    main()
