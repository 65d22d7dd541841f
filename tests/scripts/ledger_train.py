"""A test workload whose final model counts how often each sample fed an applied update.

``counts[i]`` gets exactly +1 from every applied optimizer step whose global batch holds sample
``i`` (its gradient is -1/G per occurrence, the learning rate is G, G a power of two: exact in
float32). It travels through the real all-reduce, state transfer and checkpoints, so the final
``counts`` prove exactly-once data end to end. A small BatchNorm/dropout net trains beside it.
"""

import argparse
import os
import socket
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from dyntrain import ElasticTrainer, TrainConfig


class LedgerNet(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.counts = nn.Parameter(torch.zeros(n))
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.2),
                                 nn.Linear(8, 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--chunk-size", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep per chunk")
    ap.add_argument("--slow-in", default=None,
                    help="worker id (or host:NAME, a hostname) whose chunks take longer")
    ap.add_argument("--slow-factor", type=float, default=3.0, help="its chunks' delay factor")
    ap.add_argument("--slow-while", default=None, metavar="FILE",
                    help="each chunk takes 0.05 s more while FILE exists, and 1 s more in "
                         "the last tenth of the steps, so that a held job outlasts a test's "
                         "waits however slowly its workers start (tests hold the job in a phase "
                         "until they saw what they wait for, then let it finish)")
    ap.add_argument("--hold-while", default=None, metavar="FILE",
                    help="each chunk but the first call (the canary, computed before the "
                         "worker says hello) waits while FILE exists: no step is trained until "
                         "a test saw what must come first (every worker said hello)")
    ap.add_argument("--slow-only-held", action="store_true",
                    help="the --slow-in factor applies only while the --slow-while FILE exists")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--report-threads", action="store_true",
                    help="report the worker's intra-op thread count too")
    ap.add_argument("--ballast-mb", type=float, default=0.0,
                    help="optimizer state that only travels: hand-overs and checkpoints take "
                         "long enough to be hit (not in final.pt)")
    ap.add_argument("--no-balance", action="store_true",
                    help="every member gets an even share of chunks (TrainConfig.balance)")
    ap.add_argument("--device", default=None, help="cuda to train on GPUs (NCCL)")
    ap.add_argument("--backend", default="auto", help="auto, gloo or nccl (TrainConfig.backend)")
    ap.add_argument("--shard", type=int, default=0, help="TrainConfig.shard_level")
    ap.add_argument("--shard-redundancy", type=int, default=2)
    ap.add_argument("--raise-in", default=None,
                    help="worker id (or 'all') that raises after some chunks")
    ap.add_argument("--raise-after", type=int, default=50, help="chunks before it raises")
    args = ap.parse_args()
    torch.set_num_threads(1)
    config = TrainConfig(global_batch=args.global_batch, chunk_size=args.chunk_size,
                         epochs=args.epochs, seed=3, checkpoint_every_steps=args.checkpoint_every,
                         balance=not args.no_balance, backend=args.backend,
                         shard_level=args.shard, shard_redundancy=args.shard_redundancy)
    torch.manual_seed(0)
    n = args.samples
    features = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(torch.arange(n), features)
    trainer_device = torch.device(args.device) if args.device else None
    if trainer_device is not None and trainer_device.type == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        trainer_device = torch.device("cuda", index)
    model = LedgerNet(n).to(trainer_device or "cpu")
    opt = torch.optim.SGD([
        {"params": [model.counts], "lr": float(args.global_batch), "momentum": 0.0},
        {"params": model.net.parameters(), "lr": 0.05, "momentum": 0.9},
    ])

    if args.ballast_mb:
        opt.state[model.counts]["ballast"] = torch.zeros(int(args.ballast_mb * 2**18))
    calls, host = [0], socket.gethostname()
    trainer_ref: list[ElasticTrainer] = []

    def loss_fn(model, batch):
        idx, x = batch
        calls[0] += 1
        if args.raise_in and args.raise_in in ("all", os.environ.get("DYNTRAIN_WORKER_ID")) \
                and calls[0] > args.raise_after:
            raise RuntimeError("simulated device failure")
        while args.hold_while and calls[0] > 1 and os.path.exists(args.hold_while):
            time.sleep(0.02)
        held = bool(args.slow_while) and os.path.exists(args.slow_while)
        if args.step_delay:
            slow = args.slow_in is not None and \
                args.slow_in in (os.environ.get("DYNTRAIN_WORKER_ID"), f"host:{host}") and \
                (held or not args.slow_only_held)
            time.sleep(args.step_delay * (args.slow_factor if slow else 1.0))
        if held:
            trainer = trainer_ref[0]
            time.sleep(1.0 if trainer.step >= 0.9 * trainer.total_steps else 0.05)
        target = x.sum(1, keepdim=True)
        fit = nn.functional.mse_loss(model.net(x), target)
        return fit - model.counts[idx].mean()

    trainer = ElasticTrainer(config, model, opt, data, loss_fn, device=trainer_device)
    trainer_ref.append(trainer)
    trainer.fit()
    if trainer.is_leader:
        extra = {"threads": torch.get_num_threads()} if args.report_threads else {}
        trainer.report(steps=trainer.step, **extra)


if __name__ == "__main__":
    main()
