"""The baseline for ``bench/overhead.py``: a plain DistributedDataParallel loop on CPU with gloo.

Run without ``RANK`` in the environment it is the launcher: it starts ``--nproc`` copies of itself
as plain processes that meet through env:// rendezvous on 127.0.0.1 (no torchrun agent), waits for
them and fails if any of them fails. Each rank trains the same model on the same data as
``bench/overhead_worker.py`` (the dyntrain side): every step takes the next ``--global-batch``
samples of one shuffled epoch, rank r computes its contiguous 1/world share of them, DDP averages
the gradients, SGD (nesterov) steps. Every rank records the wall-clock time and its CPU time at
the end of every step; rank 0 writes them to ``--out`` as JSON, rank r > 0 to ``--out``.rank<r>.

The workload helpers (``make_dataset``, ``make_model``, ``make_optimizer``) are imported by the
dyntrain worker too, so both systems train exactly the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from dyntrain.workloads.digits import DigitsNet

# ---- the workload, shared with overhead_worker.py ------------------------------------------


def make_dataset(samples: int, seed: int = 0) -> TensorDataset:
    """Synthetic 8x8 single-channel images with 10 classes (the digits CNN's input shape)."""
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(samples, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (samples,), generator=gen)
    return TensorDataset(x, y)


def make_model(width: int, seed: int = 0, hidden: int = 0) -> torch.nn.Module:
    """DigitsNet of ``width``, or with ``hidden`` > 0 an MLP 64-hidden-hidden-hidden-10 (a model
    whose all-reduce weighs as much as its compute: where overlapping them pays)."""
    torch.manual_seed(seed)
    if hidden:
        return torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return DigitsNet(width=width)


def make_optimizer(model: torch.nn.Module, lr: float = 0.05) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                           weight_decay=1e-4)


def cross_entropy(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--width", type=int, default=32, help="DigitsNet width")
    ap.add_argument("--hidden", type=int, default=0, help="> 0: an MLP of this width instead")
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps (one epoch)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per worker")
    ap.add_argument("--warmup", type=int, default=12,
                    help="steps left out of the per-part timing breakdown")


# ---- the DDP loop ---------------------------------------------------------------------------


def train(args: argparse.Namespace) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _train(args, rank, world)
    finally:
        dist.destroy_process_group()


def _train(args: argparse.Namespace, rank: int, world: int) -> None:
    g = args.global_batch
    if g % world:
        raise SystemExit(f"global batch {g} does not split over {world} ranks")
    local = g // world
    data = make_dataset(args.steps * g, args.seed)
    xs, ys = data.tensors
    model = make_model(args.width, args.seed, args.hidden)
    ddp = DistributedDataParallel(model)
    opt = make_optimizer(ddp, args.lr)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(args.seed))
    parts = {"fetch": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    clock = time.perf_counter
    times: list[float] = []  # wall clock at the end of each step
    cpu: list[float] = []  # this process's CPU seconds (all threads) at the end of each step
    ddp.train()
    for step in range(args.steps):
        t0 = clock()
        idx = perm[step * g + rank * local : step * g + (rank + 1) * local]
        x, y = xs[idx], ys[idx]
        t1 = clock()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        t2 = clock()
        loss.backward()  # DDP's gradient all-reduce runs (and is waited for) inside backward
        t3 = clock()
        opt.step()
        t4 = clock()
        times.append(time.time())
        cpu.append(time.process_time())
        if step >= args.warmup:
            parts["fetch"] += t1 - t0
            parts["forward"] += t2 - t1
            parts["backward"] += t3 - t2
            parts["optimizer"] += t4 - t3
    measured = max(args.steps - args.warmup, 1)
    if args.out:
        record = {"system": "ddp", "rank": rank, "world_size": world, "global_batch": g,
                  "width": args.width, "steps": args.steps, "times": times, "cpu": cpu,
                  "parts_ms_per_step": {k: 1000 * v / measured for k, v in parts.items()},
                  "loss_last": loss.item()}
        Path(rank_path(args.out, rank)).write_text(json.dumps(record) + "\n")


def rank_path(out: str, rank: int) -> str:
    """Rank 0 writes ``out`` itself, rank r > 0 ``out.rank<r>``."""
    return out if rank == 0 else f"{out}.rank{rank}"


# ---- the launcher ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], nproc: int, timeout: float, stdout=None,
           env: dict[str, str] | None = None) -> int:
    """Start ``nproc`` ranks (this file with ``argv``) as plain processes with env:// rendezvous on
    127.0.0.1; 0 if all of them succeed, 1 as soon as one fails or ``timeout`` passes."""
    port = free_port()
    procs = []
    base = os.environ if env is None else env
    for rank in range(nproc):
        rank_env = {**base, "RANK": str(rank), "WORLD_SIZE": str(nproc),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, __file__, *argv], env=rank_env,
                                      stdout=stdout, stderr=subprocess.STDOUT if stdout else None))
    codes: list[int | None] = [None] * len(procs)
    deadline = time.monotonic() + timeout
    while any(c is None for c in codes):
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            return 1
        time.sleep(0.02)
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(ap)
    ap.add_argument("--nproc", type=int, default=1, help="ranks to start (launcher mode)")
    ap.add_argument("--out", default=None, help="rank 0 writes its step times here (JSON)")
    ap.add_argument("--timeout", type=float, default=600.0, help="launcher: give up after this")
    args = ap.parse_args(argv)
    if "RANK" in os.environ:
        train(args)
    else:
        sys.exit(launch(argv, args.nproc, args.timeout))


if __name__ == "__main__":
    main()
