"""The digits workload as a plain torchrun + DistributedDataParallel script (the baseline).

Same model, data, optimizer and global batch as ``dyntrain.workloads.digits``; the global batch of
64 samples is split over however many workers torchrun started. torchrun restarts every worker on
any membership change, so rank 0 checkpoints after every step (atomically) and a restarted world
resumes from it. Rank 0 appends one JSON line per step to ``--step-log``:
``{"kind": "step", "step", "world_size", "time", "proc_t0", ...}`` and one ``{"kind": "start"}``
line when a (re)started world is ready to train. ``proc_t0`` is when this worker process started,
so a benchmark can tell which steps ran after a restart.

Run: ``python -m torch.distributed.run --nnodes 1:4 --nproc-per-node 1 --rdzv-backend c10d
--rdzv-endpoint 127.0.0.1:PORT --rdzv-id job bench/torchrun_worker.py --ckpt C --step-log L``.
"""

from __future__ import annotations

import time

PROC_T0 = time.time()  # before the heavy imports: process start-up counts as restart cost

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from dyntrain.workloads.digits import DigitsNet, cross_entropy, load_digits_split  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True, help="checkpoint file (written by rank 0 each step)")
    ap.add_argument("--step-log", required=True, help="JSONL file: a line per step")
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1000)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step")
    return ap.parse_args(argv)


def save_atomic(obj: dict, path: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(args.seed)
    train, _ = load_digits_split()
    model = DigitsNet()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=True,
                          weight_decay=args.weight_decay)
    steps_per_epoch = len(train) // args.global_batch
    total = args.epochs * steps_per_epoch
    if args.max_steps is not None:
        total = min(total, args.max_steps)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    step = 0
    if os.path.exists(args.ckpt):
        state = torch.load(args.ckpt, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step = state["step"]
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    x_all, y_all = train.tensors

    log = open(args.step_log, "a") if rank == 0 else None

    def emit(record: dict) -> None:
        if log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()

    dist.barrier()
    emit({"kind": "start", "step": step, "world_size": world, "time": time.time(),
          "proc_t0": PROC_T0, "restart": restart, "pid": os.getpid()})
    ddp.train()
    gen = torch.Generator()
    while step < total:
        epoch, within = divmod(step, steps_per_epoch)
        perm = torch.randperm(len(y_all), generator=gen.manual_seed(args.seed + epoch))
        batch = perm[within * args.global_batch:(within + 1) * args.global_batch]
        mine = batch.tensor_split(world)[rank]
        if args.step_delay > 0:
            time.sleep(args.step_delay)
        loss = cross_entropy(ddp, (x_all[mine], y_all[mine]))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
        sched.step()
        step += 1
        if rank == 0:
            save_atomic({"step": step, "model": model.state_dict(), "opt": opt.state_dict(),
                         "sched": sched.state_dict()}, args.ckpt)
            emit({"kind": "step", "step": step, "world_size": world, "time": time.time(),
                  "proc_t0": PROC_T0, "restart": restart, "loss": round(float(loss), 5)})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
