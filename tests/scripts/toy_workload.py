"""A tiny lab workload for tests: linearly separable 2-class data, error on a held-out half."""

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from dyntrain.lab.workload import LabWorkload


def toy_workload(n="256", seed="0") -> LabWorkload:
    n, seed = int(n), int(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * n, 4, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 0.5, 1.5]) > 0).long()
    train = TensorDataset(x[:n], y[:n])
    vx, vy = x[n:], y[n:]

    def evaluate(model: nn.Module) -> float:
        return float((model(vx).argmax(1) != vy).float().mean())

    return LabWorkload(dataset="toy", model="linear", build_model=lambda: nn.Linear(4, 2),
                       train_set=train, loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       evaluate=evaluate, default_target=0.1)


def gated_toy_workload(gate: str, free: str = "1") -> LabWorkload:
    """The toy workload whose trials after the first ``free`` wait, before training, until the
    file ``gate`` exists: while one waits (it leaves ``<gate>.waiting-<pid>``), the sweep is
    surely still running."""
    import os
    import time
    from pathlib import Path

    workload = toy_workload()
    build, gate_path = workload.build_model, Path(gate)

    def gated_build():
        ticket = 0
        while True:  # a number no other trial process holds
            try:
                os.close(os.open(f"{gate}.ticket-{ticket}", os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                ticket += 1
        if ticket >= int(free) and not gate_path.exists():
            Path(f"{gate}.waiting-{os.getpid()}").touch()
            while not gate_path.exists():
                time.sleep(0.05)
        return build()

    workload.build_model = gated_build
    return workload
