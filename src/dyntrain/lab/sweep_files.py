"""A sweep's folder: its settings files, and each trial's folder written whole or not at all.

::

    OUT/sweep.json                                   the sweep's settings
    OUT/DATASET/MODEL/OPTIMIZER/BATCH/study.json     metric, target, eval_every, search space
    OUT/DATASET/MODEL/OPTIMIZER/BATCH/trial_0007/{metadata.json, measurements.csv}

A trial folder appears atomically (written aside, then renamed) when its trial has finished, so
a killed sweep leaves only whole trials and running it again resumes.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dyntrain.lab.results import LabError, read_measurements
from dyntrain.lab.search import search_space
from dyntrain.lab.sweep_plan import Sweep, TrialTask
from dyntrain.lab.trial import TrialOutcome
from dyntrain.outdir import make_out_dir

SWEEP_FILE = "sweep.json"
PLANS_DIR = ".plans"  # the plan files of array jobs on a service (dyntrain.lab.sweep_service)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def prepare(sweep: Sweep) -> None:
    """Create the folders, check an existing sweep is compatible, write settings files."""
    root, config = sweep.root, sweep.config
    make_out_dir(root, "--out")
    path = root / SWEEP_FILE
    if path.exists():
        try:
            old = json.loads(path.read_text())["fixed"]
        except (ValueError, KeyError, TypeError):
            raise LabError(f"{path} is not a dyntrain sweep file; use another --out") from None
        new = config.fixed()
        diff = [f"{k} {old.get(k)!r} -> {new[k]!r}" for k in new if old.get(k) != new[k]]
        if diff:
            raise LabError(f"{root} holds a sweep with other settings ({'; '.join(diff)}); "
                           "use another --out (batch sizes, optimizers and trial counts may "
                           "change)")
    write_json(path, {"fixed": config.fixed(), "config": asdict(config),
                       "workload": {"dataset": sweep.dataset, "model": sweep.model,
                                    "metric": sweep.metric,
                                    "higher_is_better": sweep.higher_is_better,
                                    "target": sweep.target}})
    for opt in config.optimizers:
        space = search_space(opt, config.lr_range, config.momentum_range)
        for b in config.batch_sizes:
            d = root / sweep.dataset / sweep.model / opt / str(b)
            d.mkdir(parents=True, exist_ok=True)
            write_json(d / "study.json", {
                "dataset": sweep.dataset, "model": sweep.model, "optimizer": opt,
                "batch_size": b, "metric": sweep.metric, "target": sweep.target,
                "higher_is_better": sweep.higher_is_better, "eval_every": config.eval_every,
                "budget_steps": config.budget_steps,
                "search_space": {p.name: p.to_json() for p in space},
                "learning_rate_schedule": "constant", "search": "scrambled Sobol",
            })


def write_trial(task: TrialTask, outcome: TrialOutcome, metric: str) -> Path:
    """Write a finished trial's folder atomically (aside, then renamed into place)."""
    final = task.folder()
    tmp = final.with_name(f".{task.trial_id}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp")
    tmp.mkdir(parents=True)
    with open(tmp / "measurements.csv", "w") as f:
        f.write(f"step,{metric},train_loss\n")
        for m in outcome.measurements:
            f.write(f"{m.step},{float(m.metric_value)!r},{float(m.extras['train_loss'])!r}\n")
    meta = {"trial_id": task.trial_id, "hyperparameters": task.spec.hyperparameters,
            "status": "diverged" if outcome.diverged else "ok", "reason": outcome.reason,
            "seed": task.spec.seed, "steps_run": outcome.steps_run,
            "steps_to_result": outcome.steps_to_result, "seconds": round(outcome.seconds, 3)}
    (tmp / "metadata.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if final.exists():  # finished meanwhile by another runner: keep the first result
        shutil.rmtree(tmp)
        return final
    os.rename(tmp, final)
    return final


def read_outcome(task: TrialTask, metric: str | None = None) -> TrialOutcome | None:
    """A finished trial's summary from its metadata.json, with its measurements when
    ``metric`` names their column; None while the trial has not finished."""
    try:
        meta = json.loads((task.folder() / "metadata.json").read_text())
    except (OSError, ValueError):
        return None
    measurements = (read_measurements(task.folder() / "measurements.csv", metric)
                    if metric is not None else [])
    return TrialOutcome(measurements=measurements, diverged=meta.get("status") == "diverged",
                        reason=meta.get("reason", ""), steps_run=meta.get("steps_run", 0),
                        steps_to_result=meta.get("steps_to_result"),
                        seconds=meta.get("seconds", 0.0))
