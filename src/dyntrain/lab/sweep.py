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

The plan is :mod:`dyntrain.lab.sweep_plan`, the folder :mod:`dyntrain.lab.sweep_files`, the
service side :mod:`dyntrain.lab.sweep_service`; this module runs trials inline and holds the
command's body (:func:`run_sweep`) and the array child (:func:`child_main`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dyntrain.lab.results import LabError
from dyntrain.lab.sweep_files import prepare, read_outcome, write_trial
from dyntrain.lab.sweep_plan import Sweep, SweepConfig, TrialTask, plan
from dyntrain.lab.sweep_service import run_on_service, service_url
from dyntrain.lab.trial import TrialOutcome, run_trial
from dyntrain.lab.workload import LabWorkload, load_workload

__all__ = ["best_so_far", "child_main", "describe", "run_inline", "run_sweep"]


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

#: what the pool's fork server imports before it forks a trial process
POOL_PRELOAD = ("torch", "torch._dynamo", "dyntrain.lab.trial", "dyntrain.lab.workload")


def _init_worker(spec: str, args: dict[str, str]) -> None:
    global _WORKER_WORKLOAD
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

    # A fork server that imported torch once (and torch._dynamo, which the first optimizer
    # imports) forks the pool's processes: each starts with them loaded (about 3 CPU-s saved per
    # process) and none inherits this process's threads, as with "spawn".
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(POOL_PRELOAD))
    # The workers start with Ctrl-C ignored (an ignored signal stays ignored across exec): one
    # still importing torch when Ctrl-C reaches the process group would otherwise die with a
    # traceback, and the pool would start another while it is being stopped. The parent
    # handles Ctrl-C and stops the pool (it ignores one only while the pool starts, milliseconds).
    main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        pool = ctx.Pool(jobs, initializer=_init_worker,
                        initargs=(sweep.config.workload, dict(sweep.config.workload_args)))
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
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



if __name__ == "__main__":
    sys.exit(child_main())
