"""``dyntrain lab sweep``: a metaparameter study at every batch size of a geometric grid.

For each optimizer and batch size, ``trials`` quasi-random settings (see :mod:`dyntrain.lab.search`)
are each trained for at most ``budget_steps`` steps, evaluating every ``eval_every`` steps until the
validation metric strictly passes the target. Results are written in the batch-science layout
(:mod:`dyntrain.lab.results`) as they finish::

    OUT/sweep.json                                   the sweep's settings
    OUT/DATASET/MODEL/OPTIMIZER/BATCH/study.json     metric, target, eval_every, search space
    OUT/DATASET/MODEL/OPTIMIZER/BATCH/trial_0007/{metadata.json, measurements.csv}

A trial folder appears atomically (written aside, then renamed) when its trial has finished, so
re-running the same command skips finished trials and runs the rest: a sweep is resumable, and
may be extended with more batch sizes, optimizers or trials (trial ``i`` always gets the same
setting and seed). Settings that change what a finished trial means (workload, target, budget,
evaluation interval, search ranges, seed) must match the sweep already in ``OUT``.

Trials run inline in a pool of ``jobs`` processes, or as one array job on a dyntrain service
(``service``): each array child runs ``python -m dyntrain.lab.sweep PLAN`` and picks its trial by
``AWS_BATCH_JOB_ARRAY_INDEX``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dyntrain.lab.results import LabError, read_measurements
from dyntrain.lab.search import OPTIMIZERS, search_space, trial_points
from dyntrain.lab.trial import TrialOutcome, TrialSpec, run_trial
from dyntrain.lab.workload import LabWorkload, load_workload
from dyntrain.outdir import make_out_dir

SWEEP_FILE = "sweep.json"
PLANS_DIR = ".plans"


@dataclass(frozen=True)
class SweepConfig:
    """A sweep's settings; see the module docstring."""

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


def _write_json(path: Path, data: Any) -> None:
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
    _write_json(path, {"fixed": config.fixed(), "config": asdict(config),
                       "workload": {"dataset": sweep.dataset, "model": sweep.model,
                                    "metric": sweep.metric,
                                    "higher_is_better": sweep.higher_is_better,
                                    "target": sweep.target}})
    for opt in config.optimizers:
        space = search_space(opt, config.lr_range, config.momentum_range)
        for b in config.batch_sizes:
            d = root / sweep.dataset / sweep.model / opt / str(b)
            d.mkdir(parents=True, exist_ok=True)
            _write_json(d / "study.json", {
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


# ---------------------------------------------------------------------------------------------
# progress


def describe(task: TrialTask, outcome: TrialOutcome | None) -> str:
    hp = task.spec.hyperparameters
    parts = [f"lr={hp['learning_rate']:.3g}"]
    if "momentum" in hp:
        parts.append(f"momentum={hp['momentum']:.4g}")
    text = f"{task.spec.optimizer:<8} B={task.spec.batch_size:<5} {task.trial_id} {' '.join(parts)}"
    if outcome is None:
        return text
    if outcome.diverged:
        result = "diverged"
    elif outcome.steps_to_result is not None:
        result = f"{outcome.steps_to_result} steps"
    else:
        values = [m.metric_value for m in outcome.measurements
                  if not math.isnan(m.metric_value)]
        best = (f"best {(max if task.spec.higher_is_better else min)(values):.4g}" if values
                else "not evaluated")
        result = f"not reached in {outcome.steps_run} ({best})"
    return f"{text:<60} -> {result} ({outcome.seconds:.1f}s)"


def best_so_far(sweep: Sweep) -> list[tuple[str, int, int | None, str, int, int]]:
    """(optimizer, batch, best steps, trial id, finished, total) per study, read from disk."""
    rows = []
    by_study: dict[tuple[str, int], list[TrialTask]] = {}
    for t in sweep.tasks:
        by_study.setdefault((t.spec.optimizer, t.spec.batch_size), []).append(t)
    for (opt, b), tasks in by_study.items():
        best, best_id, finished = None, "", 0
        for t in tasks:
            outcome = read_outcome(t)
            if outcome is None:
                continue
            finished += 1
            steps = outcome.steps_to_result
            if steps is not None and (best is None or steps < best):
                best, best_id = steps, t.trial_id
        rows.append((opt, b, best, best_id, finished, len(tasks)))
    return rows


# ---------------------------------------------------------------------------------------------
# running inline

_WORKER_WORKLOAD: LabWorkload | None = None


def _init_worker(spec: str, args: dict[str, str]) -> None:
    global _WORKER_WORKLOAD
    import signal

    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    torch.set_num_threads(1)
    _WORKER_WORKLOAD = load_workload(spec, args)


def _run_checked(workload: LabWorkload, task: TrialTask) -> TrialOutcome:
    """Run one trial; an error in the user's workload becomes a one-line LabError."""
    try:
        return run_trial(workload, task.spec)
    except LabError:
        raise
    except Exception as e:
        raise LabError(f"{task.spec.optimizer} B={task.spec.batch_size} {task.trial_id} failed: "
                       f"{type(e).__name__}: {e}") from None


def _run_in_worker(task_json: dict[str, Any]) -> tuple[dict[str, Any], TrialOutcome]:
    assert _WORKER_WORKLOAD is not None
    return task_json, _run_checked(_WORKER_WORKLOAD, TrialTask.from_json(task_json))


def run_inline(sweep: Sweep, tasks: list[TrialTask], jobs: int, workload: LabWorkload,
               progress: Callable[[TrialTask, TrialOutcome], None]) -> None:
    """Run ``tasks`` here: in this process when ``jobs == 1``, else in a process pool that is
    stopped at once (its trials in flight are dropped) on an error or Ctrl-C."""
    if jobs <= 1:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for task in tasks:
                outcome = _run_checked(workload, task)
                write_trial(task, outcome, sweep.metric)
                progress(task, outcome)
        finally:
            torch.set_num_threads(threads)
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(jobs, initializer=_init_worker,
                    initargs=(sweep.config.workload, dict(sweep.config.workload_args)))
    try:
        for task_json, outcome in pool.imap_unordered(_run_in_worker,
                                                      [t.to_json() for t in tasks]):
            task = TrialTask.from_json(task_json)
            write_trial(task, outcome, sweep.metric)
            progress(task, outcome)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


# ---------------------------------------------------------------------------------------------
# running on a dyntrain service


def service_url(choice: str) -> str | None:
    """The service to use: ``none`` -> None; ``auto`` -> $DYNTRAIN_URL or the default URL if a
    service answers there, else None; anything else is a URL that must answer."""
    from dyntrain.service.client import DEFAULT_URL, ApiError, Client

    if choice == "none":
        return None
    url = (os.environ.get("DYNTRAIN_URL") or DEFAULT_URL) if choice == "auto" else choice
    try:
        with Client(url, timeout=2) as client:
            client.health()
    except ApiError as e:
        if choice == "auto":
            return None
        raise LabError(str(e)) from None
    return url


def pick_queue(client: Any, queue: str | None) -> str:
    queues = client.list_job_queues()
    if queue is not None:
        if not any(q["name"] == queue for q in queues):
            raise LabError(f"the service has no job queue {queue!r} (it has: "
                           f"{', '.join(q['name'] for q in queues) or 'none'})")
        return queue
    enabled = [q for q in queues if q.get("state", "ENABLED") == "ENABLED"]
    if not enabled:
        raise LabError("the service has no enabled job queue: create one, pass --queue, "
                       "or run the sweep inline with --service none")
    return max(enabled, key=lambda q: q.get("priority", 0))["name"]


def run_on_service(sweep: Sweep, tasks: list[TrialTask], url: str, queue: str | None,
                   cpus: float, memory_mib: int,
                   progress: Callable[[TrialTask, TrialOutcome | None], None],
                   poll: float = 1.0) -> str:
    """Submit ``tasks`` as one array job (one child per trial) and wait; returns the job id."""
    from dyntrain.service.client import Client

    plans = sweep.root / PLANS_DIR
    plans.mkdir(exist_ok=True)
    plan_path = plans / f"plan-{uuid.uuid4().hex[:8]}.json"
    _write_json(plan_path, {"workload": sweep.config.workload,
                            "workload_args": dict(sweep.config.workload_args),
                            "metric": sweep.metric,
                            "tasks": [t.to_json() for t in tasks]})
    from dyntrain.service.core.submitter import exported

    command = [sys.executable, "-m", "dyntrain.lab.sweep", str(plan_path.resolve())]
    with Client(url) as client:
        queue = pick_queue(client, queue)
        # as `dyntrain submit` does: this directory (a workload given as a relative path) and
        # this shell's environment; a queue whose slots are too small refuses the job here
        fields: dict[str, Any] = {"queue": queue, "command": command,
                                  "name": f"sweep-{sweep.model}",
                                  "environment": {"OMP_NUM_THREADS": "1"},
                                  "workdir": os.getcwd(),
                                  "exported_environment": exported(os.environ),
                                  "resources": {"cpus": cpus, "gpus": 0,
                                                "memory_mib": memory_mib}}
        if len(tasks) > 1:
            fields["array_size"] = len(tasks)
        else:
            fields["environment"]["AWS_BATCH_JOB_ARRAY_INDEX"] = "0"
        job = client.submit(**fields)
        job_id = job["id"]
        print(f"submitted {len(tasks)} trials as job {job_id} to queue {queue} at {url}",
              file=sys.stderr, flush=True)
        waiting, said = list(tasks), ""
        while True:
            status = client.get_job(job_id)["status"]
            if status == "RUNNABLE":  # why no trial runs, as soon as the scheduler knows
                said = _say_why_waiting(client, job_id, said)
            for task in [t for t in waiting if t.done()]:
                waiting.remove(task)
                progress(task, read_outcome(task, sweep.metric))
            if status in ("SUCCEEDED", "FAILED"):
                break
            time.sleep(poll)
    return job_id


def _say_why_waiting(client: Any, job_id: str, said: str) -> str:
    """Print why the array's first waiting child waits, when that reason is new."""
    children = client.list_jobs(parent=job_id, status="RUNNABLE", limit=1)
    waiting = children[0].get("waiting") if children else None
    reason = waiting.get("reason", "") if isinstance(waiting, dict) else ""
    if reason and reason != said:
        print(f"waiting: {reason}", file=sys.stderr, flush=True)
        return reason
    return said


def child_main(argv: list[str] | None = None) -> int:
    """An array child: run the trial at ``$AWS_BATCH_JOB_ARRAY_INDEX`` of a plan file."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) != 1:
            raise LabError("usage: python -m dyntrain.lab.sweep PLAN.json")
        data = json.loads(Path(argv[0]).read_text())
        index_text = os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "0")
        index = int(index_text)
        tasks = data["tasks"]
        if not 0 <= index < len(tasks):
            raise LabError(f"array index {index} is outside the plan's {len(tasks)} trials")
        task = TrialTask.from_json(tasks[index])
        if task.done():
            print(f"{task.folder()} already finished")
            return 0
        import torch

        torch.set_num_threads(1)
        workload = load_workload(data["workload"], data.get("workload_args") or {})
        outcome = run_trial(workload, task.spec)
        write_trial(task, outcome, data["metric"])
        print(describe(task, outcome))
        return 0
    except (LabError, OSError, ValueError, KeyError) as e:
        print(f"dyntrain.lab.sweep: error: {e}", file=sys.stderr)
        return 2


# ---------------------------------------------------------------------------------------------
# the command's body


def run_sweep(root: str | Path, config: SweepConfig, *, jobs: int = 1, service: str = "none",
              queue: str | None = None, cpus: float = 1.0, memory_mib: int = 1024,
              quiet: bool = False, out: Any = None) -> Sweep:
    """Plan, prepare and run a sweep (skipping finished trials); returns the sweep."""
    out = out or sys.stderr

    def say(text: str) -> None:
        if not quiet:
            print(text, file=out, flush=True)

    url = service_url(service)  # first: an unreachable service named explicitly is an error
    workload = load_workload(config.workload, dict(config.workload_args))
    sweep = plan(Path(root), config, workload)
    prepare(sweep)
    pending = sweep.pending()
    total = len(sweep.tasks)
    cmp = ">" if sweep.higher_is_better else "<"
    say(f"sweep {sweep.dataset}/{sweep.model}: {len(config.optimizers)} optimizer(s) x "
        f"{len(config.batch_sizes)} batch sizes x {config.trials} trials = {total} trials; "
        f"target {sweep.metric} {cmp} {sweep.target:g}, budget {config.budget_steps} steps, "
        f"evaluated every {config.eval_every} step(s)")
    if len(pending) < total:
        say(f"resuming: {total - len(pending)} trials already finished, {len(pending)} to run")
    done = [total - len(pending)]

    def progress(task: TrialTask, outcome: TrialOutcome | None) -> None:
        done[0] += 1
        say(f"[{done[0]:>{len(str(total))}}/{total}] {describe(task, outcome)}")

    started = time.monotonic()
    try:
        if pending and url is not None:
            job_id = run_on_service(sweep, pending, url, queue, cpus, memory_mib, progress)
            missing = sweep.pending()
            if missing:
                raise LabError(f"{len(missing)} of {len(pending)} trials did not finish on the "
                               f"service (see `dyntrain status {job_id}` and `dyntrain logs`); "
                               "run the same command again to retry them")
        elif pending:
            say(f"running inline with {jobs} process(es)")
            run_inline(sweep, pending, jobs, workload, progress)
    except KeyboardInterrupt:
        kept = total - len(sweep.pending())
        where = (" (trials already submitted keep running on the service)"
                 if url is not None else "")
        say(f"interrupted: {kept} of {total} trials finished and kept{where}; run the same "
            "command again to resume")
        raise
    say(f"finished in {time.monotonic() - started:.1f}s; steps to result "
        f"({sweep.metric} {cmp} {sweep.target:g}):")
    for opt, b, best, best_id, finished, n in best_so_far(sweep):
        got = f"{best} steps ({best_id})" if best is not None else "not reached"
        say(f"  {opt:<8} B={b:<5} {got:<24} {finished}/{n} trials")
    return sweep


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


__all__ = ["PRESETS", "Sweep", "SweepConfig", "TrialTask", "config_from", "geometric_grid",
           "parse_batch_sizes", "plan", "prepare", "run_sweep", "write_trial"]


if __name__ == "__main__":
    sys.exit(child_main())
