"""``dyntrain lab sweep``."""

from __future__ import annotations

import os
import signal
import sys

import click

from dyntrain.lab.results import LabError


def _workload_args(pairs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LabError(f"--workload-arg must be KEY=VALUE, got {pair!r}")
        out.append((key, value))
    return tuple(out)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _csv(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(p.strip() for p in text.split(",") if p.strip())


@click.command()
@click.option("--preset", type=click.Choice(["quick", "full"]), default=None,
              help="Start from a preset (quick: a few minutes on 2 cores; full: bigger machines); "
                   "other options override it.")
@click.option("--workload", default=None,
              help="digits-mlp (default), digits-cnn, module:function or file.py:function.")
@click.option("--workload-arg", "workload_args", multiple=True, metavar="KEY=VALUE",
              help="Keyword argument for the workload function (repeatable).")
@click.option("--optimizers", default=None, help="Comma-separated: sgd, momentum, nesterov.")
@click.option("--batch-sizes", default=None,
              help="LOW:HIGH (doubling) or a comma-separated list, e.g. 8:1024.")
@click.option("--trials", type=int, default=None, help="Trials per batch size and optimizer.")
@click.option("--budget-steps", type=int, default=None, help="Step budget of every trial.")
@click.option("--eval-every", type=int, default=None, help="Evaluate every K steps.")
@click.option("--target", type=float, default=None,
              help="Target validation metric [default: the workload's].")
@click.option("--lr-range", default=None, metavar="LOW:HIGH",
              help="Learning-rate search range (log scale) [default: 0.001:3].")
@click.option("--momentum-range", default=None, metavar="LOW:HIGH",
              help="Momentum search range (log(1-m) scale) [default: 0.5:0.999].")
@click.option("--seed", type=int, default=None)
@click.option("--no-stop-at-target", is_flag=True,
              help="Train every trial to the budget (full curves; slower).")
@click.option("--jobs", type=int, default=None,
              help="Parallel trial processes when inline [default: CPU count].")
@click.option("--service", default="auto", show_default=True,
              help="auto (use $DYNTRAIN_URL or the default URL if a service answers), none "
                   "(inline), or a service URL.")
@click.option("--queue", default=None, help="Job queue on the service [default: the "
              "highest-priority enabled queue].")
@click.option("--trial-cpus", type=float, default=1.0, show_default=True,
              help="CPUs per trial on the service.")
@click.option("--out", "out_dir", default="runs/sweep", show_default=True,
              type=click.Path(), help="Sweep folder (batch-science layout).")
@click.option("--quiet", is_flag=True, help="No progress output.")
def sweep(preset, workload, workload_args, optimizers, batch_sizes, trials, budget_steps,
          eval_every, target, lr_range, momentum_range, seed, no_stop_at_target, jobs,
          service, queue, trial_cpus, out_dir, quiet):
    """Steps to a target at each batch size, with a quasi-random search per batch size.

    Re-running the same command resumes: finished trials are skipped. Analyse the result with
    `dyntrain lab report OUT`.
    """
    from dyntrain.lab.search import parse_range
    from dyntrain.lab.sweep import run_sweep
    from dyntrain.lab.sweep_plan import config_from, parse_batch_sizes

    if jobs is not None and jobs <= 0:
        raise LabError(f"--jobs must be positive, got {jobs}")
    if trial_cpus <= 0:
        raise LabError(f"--trial-cpus must be positive, got {trial_cpus}")
    config = config_from(
        preset,
        workload=workload,
        workload_args=_workload_args(workload_args) or None,
        optimizers=_csv(optimizers),
        batch_sizes=None if batch_sizes is None else parse_batch_sizes(batch_sizes),
        trials=trials, budget_steps=budget_steps, eval_every=eval_every, target=target,
        lr_range=None if lr_range is None else parse_range(lr_range, "--lr-range"),
        momentum_range=(None if momentum_range is None
                        else parse_range(momentum_range, "--momentum-range")),
        seed=seed, stop_at_target=False if no_stop_at_target else None,
    )
    # SIGTERM (e.g. from a batch system) stops the sweep like Ctrl-C: finished trials are kept
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        run_sweep(out_dir, config, jobs=jobs or os.cpu_count() or 1, service=service,
                  queue=queue, cpus=trial_cpus, quiet=quiet)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not quiet:
        print(f"results in {out_dir}; analyse with: dyntrain lab report {out_dir}",
              file=sys.stderr)
