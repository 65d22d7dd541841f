"""A training script as users write them, for ``bench/join_latency.py``: it imports
scikit-learn, loads and scales its digits data and splits it before building the trainer, so a
worker has real start-up work of its own (past the imports the fork server already did) before
``fit()``. The model and the loss are the built-in digits workload's.

    dyntrain run --workers 1:2 bench/sklearn_digits.py --epochs 50 --step-delay 0.02
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch.utils.data import TensorDataset

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.workloads.digits import build_model, cross_entropy


def load() -> TensorDataset:
    data = load_digits()
    x_train, _, y_train, _ = train_test_split(data.data, data.target, test_size=0.2,
                                              stratify=data.target, random_state=0)
    x_train = StandardScaler().fit_transform(x_train)
    x = torch.tensor(x_train, dtype=torch.float32).reshape(-1, 1, 8, 8)
    return TensorDataset(x, torch.tensor(y_train, dtype=torch.long))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--step-delay", type=float, default=0.0)
    args = ap.parse_args()
    train = load()
    torch.manual_seed(0)
    model = build_model("cnn")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)

    def loss_fn(model, batch):
        if args.step_delay > 0:
            time.sleep(args.step_delay)
        return cross_entropy(model, batch)

    config = TrainConfig(global_batch=64, chunk_size=8, epochs=args.epochs)
    ElasticTrainer(config, model, opt, train, loss_fn).fit()


if __name__ == "__main__":
    main()
