"""The built-in workload: a small CNN with BatchNorm and dropout on scikit-learn's digits.

Run it elastically with ``dyntrain run --workers 1:4 -m dyntrain.workloads.digits`` or alone with
``python -m dyntrain.workloads.digits``; every worker runs the same command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.step.validation import Validation
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.errors import DyntrainError
from dyntrain.extras import needs_extra


def load_digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 digits as (images N x 1 x 8 x 8 in [0, 1], labels N).

    Reads the data file scikit-learn ships without importing scikit-learn itself, which saves
    about a second of start-up in every worker process; falls back to ``load_digits``.
    """
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is not None and path.is_file():
        table = np.loadtxt(path, delimiter=",", dtype=np.float32)
        images, labels = table[:, :-1], table[:, -1]
    else:
        with needs_extra("the digits workload"):
            from sklearn.datasets import load_digits

        data = load_digits()
        images, labels = data.data, data.target
    x = torch.tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    return x, torch.tensor(labels, dtype=torch.long)


def stratified_split(labels: torch.Tensor, val_fraction: float, seed: int):
    """Indices (train, val) with each class split in the same proportion."""
    gen = torch.Generator().manual_seed(seed)
    train, val = [], []
    for cls in labels.unique():
        idx = (labels == cls).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        n_val = round(len(idx) * val_fraction)
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return torch.cat(train).sort().values, torch.cat(val).sort().values


def load_digits_split(val_fraction: float = 0.2, split_seed: int = 0):
    """8x8 handwritten digits as (train, validation) TensorDatasets, normalised by train stats."""
    x, y = load_digits_arrays()
    train_idx, val_idx = stratified_split(y, val_fraction, split_seed)
    mean, std = x[train_idx].mean(), x[train_idx].std()
    x = (x - mean) / std
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx])


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


class DigitsMLP(nn.Module):
    """A BatchNorm-free MLP, 64 -> hidden -> hidden -> 10: fast, and its training does not
    depend on how a batch is cut into chunks (the scaling lab's default model)."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


MODELS = {"cnn": DigitsNet, "mlp": DigitsMLP}


def build_model(name: str) -> nn.Module:
    """A digits model by name (``cnn`` or ``mlp``)."""
    try:
        return MODELS[name]()
    except KeyError:
        raise DyntrainError(f"unknown digits model {name!r}; choose from "
                            f"{', '.join(MODELS)}") from None


def cross_entropy(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def accuracy(model: nn.Module, dataset: TensorDataset) -> float:
    model.eval()
    x, y = dataset.tensors
    return float((model(x).argmax(1) == y).float().mean())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dyntrain.workloads.digits", description=__doc__)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    ap.add_argument("--step-delay", type=float, default=0.0,
                    help="extra seconds per chunk, to slow a demo down so events can be seen")
    ap.add_argument("--model", choices=sorted(MODELS), default="cnn",
                    help="cnn: DigitsNet (BatchNorm, dropout); mlp: DigitsMLP [cnn]")
    ap.add_argument("--optimizer", choices=("nesterov", "sgd"), default="nesterov",
                    help="nesterov: SGD with --momentum, Nesterov; sgd: plain SGD without "
                    "momentum [nesterov]")
    ap.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine",
                    help="cosine annealing to zero over the run, or a constant --lr [cosine]")
    ap.add_argument("--noise-scale", action="store_true",
                    help="estimate the gradient noise scale B_simple online (b_simple etc. in "
                    "metrics.jsonl); needs chunk size < global batch")
    ap.add_argument("--noise-ema", type=float, default=0.95,
                    help="moving-average factor of the noise scale estimates [0.95]")
    ap.add_argument("--noise-every", type=int, default=4,
                    help="measure the noise scale every K steps [4]")
    ap.add_argument("--log-every", type=int, default=0,
                    help="print a progress line (step, workers, loss, samples/s, validation "
                    "accuracy) every K steps, from the leader; it does not change training "
                    "[0: off]")
    return ap


def progress_printer(trainer_ref: list, val: TensorDataset, global_batch: int):
    """A validation hook that prints one progress line per call (the trainer is
    ``trainer_ref[0]``, set once it exists) and returns the validation accuracy."""
    last = {"time": time.perf_counter(), "step": 0}

    def evaluate(model: nn.Module) -> dict[str, float]:
        trainer = trainer_ref[0]
        acc = accuracy(model, val)
        now = time.perf_counter()
        rate = (trainer.step - last["step"]) * global_batch / max(now - last["time"], 1e-9)
        last.update(time=now, step=trainer.step)
        loss = trainer.last_result.loss if trainer.last_result is not None else float("nan")
        print(f"step {trainer.step}/{trainer.total_steps} workers {trainer.world_size} "
              f"loss {loss:.4f} samples/s {rate:.1f} validation-accuracy {acc:.4f}", flush=True)
        return {"accuracy": acc}

    return evaluate


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        config = TrainConfig(global_batch=args.global_batch, chunk_size=args.chunk_size,
                             epochs=args.epochs, max_steps=args.max_steps, seed=args.seed,
                             checkpoint_every_steps=args.checkpoint_every,
                             noise_scale=args.noise_scale, noise_ema=args.noise_ema,
                             noise_every=args.noise_every)
        train, val = load_digits_split()
    except DyntrainError as exc:
        print(f"digits: error: {exc}", file=sys.stderr)
        sys.exit(2)
    torch.manual_seed(args.seed)
    model = build_model(args.model)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                              nesterov=True, weight_decay=args.weight_decay)
    total = config.total_steps(len(train))
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
             if args.lr_schedule == "cosine" else None)
    loss_fn = cross_entropy
    if args.step_delay > 0:
        def loss_fn(model, batch):  # noqa: F811 - same loss, slowed down for demos
            time.sleep(args.step_delay)
            return cross_entropy(model, batch)

    if args.log_every < 0:
        print(f"digits: error: --log-every must be >= 0, got {args.log_every}", file=sys.stderr)
        sys.exit(2)
    trainer_ref: list = []
    validation = None if not args.log_every else Validation(
        progress_printer(trainer_ref, val, args.global_batch), every_steps=args.log_every,
        at_end=False)
    trainer = ElasticTrainer(config, model, opt, train, loss_fn, lr_scheduler=sched,
                             validation=validation)
    trainer_ref.append(trainer)
    trainer.fit()
    if trainer.is_leader:
        acc = accuracy(model, val)
        print(f"validation accuracy {acc:.4f} after {trainer.step} steps")
        trainer.report(val_accuracy=round(acc, 4), steps=trainer.step)


if __name__ == "__main__":
    main()
