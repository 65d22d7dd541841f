"""A plain DDP training script, as people run it under torchrun: no dyntrain import.

It reads torchrun's variables (``init_process_group("gloo")`` over ``env://``), shards a small
regression data set with ``DistributedSampler``, and after each epoch rank 0 saves a checkpoint
(``torch.save``, written aside then renamed) in ``--checkpoint-dir``: the model, the optimizer,
the next epoch and the history of the epochs done (world size and restart count of each). A
restarted gang resumes from it. Each rank also writes the torchrun variables it was given, its
host's name, its command line and parent and whether torch was imported before the script ran
(a warm process) to ``env-r<restart>-rank<rank>.json`` there (renamed into place).
``--epoch-seconds`` stretches each epoch and, while the file ``--pause-while`` exists, no epoch
starts (so that a test can change the capacity while it trains, before it is done).
"""

from __future__ import annotations

import sys

TORCH_PRELOADED = "torch" in sys.modules  # before this script imports it

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    parser.add_argument("--pause-while", type=Path, default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    told = args.checkpoint_dir / f"env-r{restart}-rank{rank}.json"
    told.with_suffix(".partial").write_text(json.dumps(
        {"host": socket.gethostname(), **{k: os.environ.get(k) for k in TORCHRUN_VARS},
         "torch_preloaded": TORCH_PRELOADED, "ppid": os.getppid(), "threads":
         torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled(),
         "cmdline": Path("/proc/self/cmdline").read_bytes().decode()
         .split("\0")[1:-1]}))
    os.replace(told.with_suffix(".partial"), told)  # never seen half-written

    data = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=data)
    y = x @ torch.randn(8, 1, generator=data)
    dataset = TensorDataset(x, y)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    checkpoint = args.checkpoint_dir / "checkpoint.pt"
    start, history = 0, []
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, history = state["epoch"], state["history"]

    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    for epoch in range(start, args.epochs):
        while args.pause_while is not None and args.pause_while.exists():
            time.sleep(0.05)
        began = time.monotonic()
        sampler.set_epoch(epoch)
        loss = torch.zeros(())
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
        time.sleep(max(0.0, args.epoch_seconds - (time.monotonic() - began)))
        dist.barrier()
        if rank == 0:
            history.append({"epoch": epoch + 1, "world_size": world, "restart": restart,
                            "resumed_from": start, "loss": loss.detach().item()})
            partial = checkpoint.with_suffix(".partial")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch + 1, "history": history}, partial)
            os.replace(partial, checkpoint)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
