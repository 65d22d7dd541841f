"""The digits job as people write it for torchrun: plain DDP, no dyntrain import.

The model, data, optimizer and learning rate of ``dyntrain.workloads.digits`` (copied here, so
that the script imports nothing from dyntrain; ``bench/torchrun_compare.py`` checks that the
copies build the same model and data), written the usual way: ``init_process_group("gloo")``
from torchrun's variables, a ``DistributedSampler`` over the training set with a fixed batch per
worker (``--batch-per-worker`` 32: a global batch of 64 at 2 workers, 96 at 3), cosine learning
rate over the run's progress in epochs, and after each epoch rank 0 saves a checkpoint with
``torch.save`` (written aside, then renamed). A (re)started gang resumes from the start of the
epoch after the last checkpoint: work since then is done again. ``--chunk-delay`` stands for a
heavier model.

For the benchmark every rank appends a ``{"kind": "start", ...}`` line to ``--step-log`` when its
gang is ready to train (with when its script began and whether torch was imported already: a
warm process), and rank 0 one ``{"kind": "step", ...}`` line per step (epoch, batch,
world size, samples, time) and one ``{"kind": "checkpoint", "epoch"}`` line per checkpoint.

Run: ``torchrun --nnodes 1:4 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint
127.0.0.1:PORT bench/digits_ddp.py --epochs 8 --checkpoint-dir DIR --step-log FILE``.
"""

from __future__ import annotations

import sys
import time

PROC_T0 = time.time()  # before the heavy imports: process start-up is part of a restart
TORCH_PRELOADED = "torch" in sys.modules  # a warm process: no interpreter started for it

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def load_train(val_fraction: float = 0.2, split_seed: int = 0) -> TensorDataset:
    """scikit-learn's 8x8 digits, the same stratified training split and normalisation as
    ``dyntrain.workloads.digits.load_digits_split``."""
    spec = importlib.util.find_spec("sklearn")
    table = np.loadtxt(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz",
                       delimiter=",", dtype=np.float32)
    x = torch.tensor(table[:, :-1]).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(table[:, -1], dtype=torch.long)
    gen = torch.Generator().manual_seed(split_seed)
    train = []
    for cls in y.unique():
        idx = (y == cls).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        train.append(idx[round(len(idx) * val_fraction):])
    train_idx = torch.cat(train).sort().values
    x = (x - x[train_idx].mean()) / x[train_idx].std()
    return TensorDataset(x[train_idx], y[train_idx])


class DigitsNet(nn.Module):
    """Two conv layers with BatchNorm, then an MLP head with dropout: 8x8 -> 10 classes."""

    def __init__(self, width: int = 16, dropout: float = 0.2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.fc1 = nn.Linear(2 * width * 16, 64)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.drop(F.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--checkpoint-dir", type=Path, required=True)
    ap.add_argument("--step-log", type=Path, required=True)
    ap.add_argument("--batch-per-worker", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-delay", type=float, default=0.0,
                    help="extra seconds per 8 samples of a worker's batch (a heavier model), as "
                    "dyntrain.workloads.digits --step-delay adds per chunk of 8")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    train = load_train()
    torch.manual_seed(args.seed)
    model = DigitsNet()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=True,
                          weight_decay=args.weight_decay)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint_dir / "checkpoint.pt"
    start = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"]
    ddp = DistributedDataParallel(model)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_per_worker, sampler=sampler)
    steps_per_epoch = len(loader)

    def log(record: dict) -> None:
        with open(args.step_log, "a") as f:  # one short write per line (O_APPEND)
            f.write(json.dumps(record) + "\n")

    dist.barrier()
    log({"kind": "start", "rank": rank, "world_size": world, "epoch": start,
         "restart": restart, "pid": os.getpid(), "proc_t0": PROC_T0, "time": time.time(),
         "torch_preloaded": TORCH_PRELOADED})
    ddp.train()
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            progress = (epoch + i / steps_per_epoch) / args.epochs
            for group in opt.param_groups:
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * progress))
            time.sleep(args.chunk_delay * math.ceil(len(yb) / 8))
            loss = F.cross_entropy(ddp(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if rank == 0:
                log({"kind": "step", "epoch": epoch, "batch": i, "steps_per_epoch":
                     steps_per_epoch, "world_size": world, "samples": len(yb) * world,
                     "progress": round(epoch + (i + 1) / steps_per_epoch, 4),
                     "restart": restart, "proc_t0": PROC_T0, "time": time.time(),
                     "loss": round(float(loss), 5)})
        if rank == 0:
            partial = checkpoint.with_suffix(".partial")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "epoch": epoch + 1}, partial)
            os.replace(partial, checkpoint)
            log({"kind": "checkpoint", "epoch": epoch + 1, "time": time.time()})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
