"""One trial of a sweep: train at one batch size with one hyperparameter setting.

The loop is deliberately plain (one process, one optimizer step per global batch, constant
learning rate) so that thousands of trials are cheap. Data order follows the runtime's rule:
a fresh seeded permutation every epoch, the remainder that does not fill a batch dropped.
The validation metric is evaluated every ``eval_every`` steps (after the update of that step);
a trial stops at the first evaluation that strictly passes the target (``stop_at_target``),
when the training loss is no longer finite or exceeds ``divergence_factor`` times the first
step's loss (diverged), or when the step budget runs out.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from dyntrain.lab.results import LabError, Measurement, passes
from dyntrain.lab.workload import LabWorkload


@dataclass(frozen=True)
class TrialSpec:
    """Everything that decides a trial's outcome."""

    optimizer: str
    batch_size: int
    hyperparameters: dict[str, float]
    seed: int
    budget_steps: int
    eval_every: int
    target: float
    higher_is_better: bool
    stop_at_target: bool = True
    divergence_factor: float = 20.0


@dataclass
class TrialOutcome:
    measurements: list[Measurement] = field(default_factory=list)
    diverged: bool = False
    reason: str = ""
    steps_run: int = 0
    steps_to_result: int | None = None
    seconds: float = 0.0


def make_optimizer(name: str, params: Any, hp: dict[str, float]):
    import torch

    lr = hp["learning_rate"]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name in ("momentum", "nesterov"):
        return torch.optim.SGD(params, lr=lr, momentum=hp["momentum"],
                               nesterov=name == "nesterov")
    raise LabError(f"unknown optimizer {name!r}")


def _fetch(dataset: Any, idx):
    from torch.utils.data import TensorDataset, default_collate

    if isinstance(dataset, TensorDataset):
        return tuple(t[idx] for t in dataset.tensors)
    return default_collate([dataset[i] for i in idx.tolist()])


def run_trial(workload: LabWorkload, spec: TrialSpec) -> TrialOutcome:
    """Train until the target is passed, the run diverges or the budget is spent."""
    import torch

    if spec.batch_size > len(workload.train_set):
        raise LabError(f"batch size {spec.batch_size} is larger than the training set "
                       f"({len(workload.train_set)} samples)")
    started = time.perf_counter()
    torch.manual_seed(spec.seed)
    model = workload.build_model()
    opt = make_optimizer(spec.optimizer, model.parameters(), spec.hyperparameters)
    gen = torch.Generator().manual_seed(spec.seed)
    n = len(workload.train_set)
    per_epoch = n // spec.batch_size
    out = TrialOutcome()
    perm = None
    first_loss = None
    for step in range(spec.budget_steps):
        epoch_step = step % per_epoch
        if epoch_step == 0:
            perm = torch.randperm(n, generator=gen)
        idx = perm[epoch_step * spec.batch_size:(epoch_step + 1) * spec.batch_size]
        model.train()
        loss = workload.loss_fn(model, _fetch(workload.train_set, idx))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.steps_run = step + 1
        value = float(loss.detach())
        if first_loss is None:
            first_loss = value
        if not math.isfinite(value):
            out.diverged, out.reason = True, f"training loss became {value} at step {step + 1}"
            break
        if first_loss > 0 and value > spec.divergence_factor * first_loss:
            out.diverged = True
            out.reason = (f"training loss {value:.3g} at step {step + 1} exceeds "
                          f"{spec.divergence_factor:g}x the first step's {first_loss:.3g}")
            break
        if (step + 1) % spec.eval_every == 0:
            model.eval()
            with torch.no_grad():
                metric = float(workload.evaluate(model))
            out.measurements.append(Measurement(step + 1, metric, {"train_loss": value}))
            if out.steps_to_result is None and passes(metric, spec.target,
                                                      spec.higher_is_better):
                out.steps_to_result = step + 1
                if spec.stop_at_target:
                    out.reason = "reached target"
                    break
    if not out.reason:
        out.reason = "budget exhausted" if out.steps_to_result is None else "reached target"
    out.seconds = time.perf_counter() - started
    return out
