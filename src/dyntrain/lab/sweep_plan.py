"""A sweep's settings and its plan: every (optimizer, batch size, trial) of a batch-size grid,
each trial with its own hyperparameters and seed (pure: nothing is run or written).

Trial ``i`` of a study gets point ``i`` of its optimizer's scrambled Sobol sequence
(:mod:`dyntrain.lab.search`) and seed ``seed + i`` at every batch size, so a sweep can be
extended with more batch sizes, optimizers or trials without changing the trials it has.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dyntrain.lab.results import LabError
from dyntrain.lab.search import OPTIMIZERS, search_space, trial_points
from dyntrain.lab.trial import TrialSpec
from dyntrain.lab.workload import LabWorkload


@dataclass(frozen=True)
class SweepConfig:
    """A sweep's settings (what they mean: :mod:`dyntrain.lab.sweep`)."""

    batch_sizes: tuple[int, ...]
    workload: str = "digits-mlp"
    workload_args: tuple[tuple[str, str], ...] = ()
    optimizers: tuple[str, ...] = ("sgd", "nesterov")
    trials: int = 16
    budget_steps: int = 1500
    eval_every: int = 1
    target: float | None = None  # None: the workload's default target
    lr_range: tuple[float, float] = (1e-3, 3.0)
    momentum_range: tuple[float, float] = (0.5, 0.999)
    seed: int = 0
    stop_at_target: bool = True
    divergence_factor: float = 20.0

    def __post_init__(self) -> None:
        if not self.batch_sizes:
            raise LabError("the batch-size grid is empty: give at least one batch size")
        if any(not isinstance(b, int) or b <= 0 for b in self.batch_sizes):
            raise LabError(f"batch sizes must be positive integers, got {list(self.batch_sizes)}")
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(self.batch_sizes))))
        if not self.optimizers:
            raise LabError("no optimizers: give at least one of " + ", ".join(OPTIMIZERS))
        for opt in self.optimizers:
            if opt not in OPTIMIZERS:
                raise LabError(f"unknown optimizer {opt!r}; choose from {', '.join(OPTIMIZERS)}")
        object.__setattr__(self, "optimizers", tuple(dict.fromkeys(self.optimizers)))
        if self.trials <= 0:
            raise LabError(f"trials must be positive, got {self.trials}")
        if self.budget_steps <= 0:
            raise LabError(f"budget_steps must be positive, got {self.budget_steps}")
        if not 0 < self.eval_every <= self.budget_steps:
            raise LabError(f"eval_every must be between 1 and the budget ({self.budget_steps}), "
                           f"got {self.eval_every}")
        if self.target is not None and not math.isfinite(self.target):
            raise LabError(f"target must be a finite number, got {self.target}")
        if not self.divergence_factor > 1:
            raise LabError(f"divergence_factor must be above 1, got {self.divergence_factor}")
        for opt in self.optimizers:  # validates the ranges
            search_space(opt, self.lr_range, self.momentum_range)

    def fixed(self) -> dict[str, Any]:
        """Settings every run into the same folder must share."""
        return {"workload": self.workload, "workload_args": dict(self.workload_args),
                "budget_steps": self.budget_steps, "eval_every": self.eval_every,
                "target": self.target, "lr_range": list(self.lr_range),
                "momentum_range": list(self.momentum_range), "seed": self.seed,
                "stop_at_target": self.stop_at_target,
                "divergence_factor": self.divergence_factor}


def geometric_grid(low: int, high: int, factor: int = 2) -> tuple[int, ...]:
    """``low, low*factor, ...`` up to ``high``."""
    if low <= 0 or high < low or factor < 2:
        raise LabError(f"need 0 < LOW <= HIGH for a batch-size grid, got {low}:{high}")
    out, b = [], low
    while b <= high:
        out.append(b)
        b *= factor
    return tuple(out)


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"4,8,16"`` or ``"4:1024"`` (doubling) -> batch sizes, with one-line errors."""
    text = text.strip()
    if not text:
        raise LabError("the batch-size grid is empty: give e.g. --batch-sizes 8:1024")
    try:
        if ":" in text:
            low, high = (int(p) for p in text.split(":"))
            return geometric_grid(low, high)
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise LabError(f"batch sizes must be LOW:HIGH or a comma-separated list of integers, "
                       f"got {text!r}") from None


PRESETS: dict[str, dict[str, Any]] = {
    # about 2-5 minutes on 2 cores: 2 optimizers x 9 batch sizes x 32 trials
    "quick": {"workload": "digits-mlp", "optimizers": ("sgd", "nesterov"),
              "batch_sizes": geometric_grid(4, 1024), "trials": 32, "budget_steps": 1000,
              "eval_every": 1},
    # for a bigger machine: 3 optimizers x 10 batch sizes x 100 trials, longer budget
    "full": {"workload": "digits-mlp", "optimizers": ("sgd", "momentum", "nesterov"),
             "batch_sizes": geometric_grid(2, 1024), "trials": 100, "budget_steps": 3000,
             "eval_every": 1},
}



def config_from(preset: str | None, **overrides: Any) -> SweepConfig:
    """A preset's settings with the given (non-None) overrides."""
    base: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise LabError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        base = dict(PRESETS[preset])
    base.update({k: v for k, v in overrides.items() if v is not None})
    if "batch_sizes" not in base:
        raise LabError("give --batch-sizes (e.g. 8:1024) or a --preset")
    return SweepConfig(**base)



# ---------------------------------------------------------------------------------------------
# planning


@dataclass(frozen=True)
class TrialTask:
    """One trial to run, and where its folder goes."""

    study_dir: str
    trial_id: str
    spec: TrialSpec

    def folder(self) -> Path:
        return Path(self.study_dir) / self.trial_id

    def done(self) -> bool:
        return (self.folder() / "metadata.json").is_file()

    def to_json(self) -> dict[str, Any]:
        return {"study_dir": self.study_dir, "trial_id": self.trial_id, "spec": asdict(self.spec)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialTask:
        return cls(data["study_dir"], data["trial_id"], TrialSpec(**data["spec"]))


@dataclass
class Sweep:
    """A prepared sweep: its folder, settings, workload facts and every trial."""

    root: Path
    config: SweepConfig
    dataset: str
    model: str
    metric: str
    higher_is_better: bool
    target: float
    tasks: list[TrialTask] = field(default_factory=list)

    def pending(self) -> list[TrialTask]:
        return [t for t in self.tasks if not t.done()]


def trial_id(index: int) -> str:
    return f"trial_{index:04d}"


def plan(root: Path, config: SweepConfig, workload: LabWorkload) -> Sweep:
    """Every trial of the sweep (pure: nothing is written)."""
    target = config.target if config.target is not None else workload.default_target
    if target is None:
        raise LabError(f"workload {config.workload!r} has no default target; pass --target")
    too_big = [b for b in config.batch_sizes if b > len(workload.train_set)]
    if too_big:
        raise LabError(f"batch sizes {too_big} exceed the training set "
                       f"({len(workload.train_set)} samples)")
    sweep = Sweep(Path(root), config, workload.dataset, workload.model, workload.metric,
                  workload.higher_is_better, float(target))
    for opt_index, opt in enumerate(config.optimizers):
        space = search_space(opt, config.lr_range, config.momentum_range)
        # one Sobol sequence per optimizer, shared by all batch sizes
        points = trial_points(space, config.trials, seed=config.seed * 1009 + opt_index)
        for b in config.batch_sizes:
            study_dir = sweep.root / workload.dataset / workload.model / opt / str(b)
            for i, hp in enumerate(points):
                spec = TrialSpec(optimizer=opt, batch_size=b, hyperparameters=hp,
                                 seed=config.seed + i, budget_steps=config.budget_steps,
                                 eval_every=config.eval_every, target=float(target),
                                 higher_is_better=workload.higher_is_better,
                                 stop_at_target=config.stop_at_target,
                                 divergence_factor=config.divergence_factor)
                sweep.tasks.append(TrialTask(str(study_dir), trial_id(i), spec))
    return sweep
