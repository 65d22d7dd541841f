"""The workload of ``bench/rescale_size.py``: an MLP of about ``--params`` parameters trained with
Adam (state: two tensors per parameter) on synthetic 64-dim data, by ``ElasticTrainer``.

``--handover RANK WORLD PORT`` instead times one state hand-over between two plain processes
(no coordinator): rank 0 holds the trained state, rank 1 receives it, once the old way (the whole
state dict through ``torch.save`` bytes) and once by ``transfer.broadcast_state``; rank 0 prints
one JSON line with both times.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import dyntrain
from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.transfer import broadcast_state, state_bytes
from dyntrain.elastic.runs.checkpoint_file import dumps, loads
from dyntrain.elastic.state import TrainingParts, capture_state, restore_state


def make_model(params: int, layers: int = 4) -> nn.Module:
    """``layers - 1`` square hidden layers of width h, (layers - 1) * h^2 ~ ``params``."""
    width = max(16, int(math.sqrt(params / (layers - 1))))
    mods: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width), nn.ReLU()]
    mods.append(nn.Linear(width, 10))
    torch.manual_seed(0)
    return nn.Sequential(*mods)


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def dataset(samples: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(samples, 64, generator=gen),
                         torch.randint(0, 10, (samples,), generator=gen))


def trained_parts(params: int) -> TrainingParts:
    """Model + Adam after one step (so that the optimizer state exists)."""
    model = make_model(params)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = dataset(8).tensors
    loss_fn(model, (x, y)).backward()
    opt.step()
    return TrainingParts(model, opt)


def handover(args: argparse.Namespace) -> None:
    rank, world, port = args.handover
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=120))
    pg = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=600))
    group = Group(pg, rank, world, torch.device("cpu"))
    parts = trained_parts(args.params)
    state = capture_state(parts, 1, 1) if rank == 0 else None
    never = lambda: False  # noqa: E731
    times = {}
    for name in ("pickled", "flat"):
        pg.barrier().wait()
        t0 = time.perf_counter()
        if name == "pickled":
            data = group.broadcast_bytes(dumps(state) if rank == 0 else None, 0, never)
            got = state if rank == 0 else loads(data)
        else:
            got = broadcast_state(group, state, 0, [0], never)
        if rank != 0:
            restore_state(parts, got)
        pg.barrier().wait()
        times[name] = time.perf_counter() - t0
    if rank == 0:
        params = sum(q.numel() for q in parts.model.parameters())
        print(json.dumps({"params": params, "state_mb": state_bytes(state) / 2**20, **times}),
              flush=True)
    pg.abort()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--chunk-size", type=int, default=4)
    ap.add_argument("--handover", type=int, nargs=3, metavar=("RANK", "WORLD", "PORT"))
    args = ap.parse_args(argv)
    if args.handover:
        handover(args)
        return
    torch.set_num_threads(1)
    config = dyntrain.TrainConfig(global_batch=args.global_batch, chunk_size=args.chunk_size,
                                  max_steps=args.steps, epochs=1)
    model = make_model(args.params)
    trainer = dyntrain.ElasticTrainer(config, model, torch.optim.Adam(model.parameters(), 1e-3),
                                      dataset(args.steps * args.global_batch), loss_fn)
    trainer.fit()


if __name__ == "__main__":
    sys.exit(main())
