"""``dyntrain sim``: replay capacity and job traces through the scheduler, policies side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from dyntrain.errors import DyntrainError

DEFAULT_POLICIES = "static,fifo,fair,goodput"


def _capacity_arg(text: str) -> tuple[str, Path]:
    """``[NAME=]FILE``: the environment's name defaults to the file's stem."""
    name, sep, path = text.partition("=")
    if not sep:
        name, path = Path(text).stem, text
    if not name or not path:
        raise DyntrainError(f"--capacity {text!r}: expected FILE or NAME=FILE")
    return name, Path(path)


def _finite(record: dict) -> dict:
    """JSON has no NaN: an undefined figure (no job finished) is written as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in record.items()}


@click.command(context_settings={"show_default": True})
@click.option("--capacity", "capacity", multiple=True, required=True, metavar="[NAME=]FILE",
              help="A capacity trace, one compute environment each (repeatable): the public "
                   "JSON spot traces as they are, or the project's CSV (offset_s,slots[,price]).")
@click.option("--jobs", "jobs_file", default=None, type=click.Path(dir_okay=False),
              help="A job trace (JSON; see docs/sim.md) [default: the built-in mixed trace].")
@click.option("--count", default=50, type=int, help="Built-in trace: jobs.")
@click.option("--days", default=10.0, type=float, help="Built-in trace: days the arrivals span.")
@click.option("--seed", default=0, type=int, help="Built-in trace: the random seed.")
@click.option("--policies", default=DEFAULT_POLICIES,
              help="Comma-separated, from static, fifo, fair, goodput.")
@click.option("--spot-price", default=None, type=float,
              help="Price per slot-hour of traces without one [default: 0.918, spot p3.2xlarge].")
@click.option("--on-demand-price", default=None, type=float,
              help="The static cluster's price per slot-hour [default: 3.06, p3.2xlarge].")
@click.option("--static-slots", default=None, type=int,
              help="The static cluster's slots [default: the traces' maxima added up].")
@click.option("--loop/--no-loop", default=True,
              help="Repeat the capacity traces when they end (jobs may outlast them).")
@click.option("--pass-every", default=300.0, type=float,
              help="Seconds of simulated time between two scheduling passes, at most.")
@click.option("--oracle", is_flag=True,
              help="Policies see every job's true speed-up curve, not only what was measured.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False),
              help="Write one record per policy (and each job's) here.")
@click.option("--plots", "plots_dir", default=None, type=click.Path(file_okay=False),
              help="Write capacity, allocation and job plots (PNG) here (needs matplotlib).")
def sim(capacity, jobs_file, count, days, seed, policies, spot_price, on_demand_price,
        static_slots, loop, pass_every, oracle, json_out, plots_dir):
    """Replay capacity traces and a job trace through the service's scheduler, for each policy.

    Prints average and p95 job completion time, makespan, cost, utilisation and
    re-formations side by side; thousands of times faster than real time.
    """
    from dyntrain.service.core.trace_files import load_capacity
    from dyntrain.sim.compare import (
        ON_DEMAND_PRICE,
        SPOT_PRICE,
        StaticCluster,
        compare,
        parse_policies,
    )
    from dyntrain.sim.engine import EnvSpec, SimConfig
    from dyntrain.sim.jobs import builtin_jobs, load_jobs
    from dyntrain.sim.results import format_table

    if plots_dir is not None:  # a missing matplotlib is said before the simulation, not after
        import matplotlib  # noqa: F401
    names = parse_policies(policies)
    for flag, value in (("--spot-price", spot_price), ("--on-demand-price", on_demand_price)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise DyntrainError(f"{flag} must be a finite number >= 0, got {value}")
    if not pass_every > 0:
        raise DyntrainError(f"--pass-every must be > 0, got {pass_every}")
    if static_slots is not None and static_slots < 1:
        raise DyntrainError(f"--static-slots must be >= 1, got {static_slots}")
    envs, seen = [], set()
    for text in capacity:
        name, path = _capacity_arg(text)
        if name in seen:
            raise DyntrainError(f"--capacity: two traces are named {name}; name one NAME=FILE")
        seen.add(name)
        envs.append(EnvSpec(name, load_capacity(path, loop=loop),
                            price=SPOT_PRICE if spot_price is None else spot_price))
    if jobs_file is not None:
        jobs = load_jobs(jobs_file)
    else:
        if count < 1 or not days > 0:
            raise DyntrainError("--count must be >= 1 and --days > 0")
        jobs = builtin_jobs(count, days * 86400.0, seed)
    config = SimConfig(pass_every_s=pass_every, learn=not oracle, record=plots_dir is not None)
    cluster = StaticCluster(static_slots or sum(e.trace.max_slots for e in envs),
                            ON_DEMAND_PRICE if on_demand_price is None else on_demand_price)
    results = compare(names, envs, jobs, config, cluster)
    summaries = [r.summary() for r in results]
    click.echo(f"{len(jobs.jobs)} jobs ({jobs.source}) on {', '.join(e.name for e in envs)}")
    for line in format_table(summaries):
        click.echo(line)
    simulated = sum(r.sim_s for r in results)
    wall = sum(r.wall_s for r in results)
    click.echo(f"simulated {simulated / 86400:.1f} days in {wall:.1f} s "
               f"({simulated / max(wall, 1e-9):,.0f} simulated seconds per second)")
    if json_out is not None:
        doc = {"jobs_source": jobs.source, "capacity": [str(c) for c in capacity],
               "policies": [_finite(s) for s in summaries],
               "jobs": {r.policy: [_finite(j.to_dict()) for j in r.jobs] for r in results}}
        try:
            Path(json_out).write_text(json.dumps(doc, indent=1) + "\n")
        except OSError as e:
            raise DyntrainError(f"cannot write {json_out}: {e.strerror or e}") from None
        click.echo(f"wrote {json_out}")
    if plots_dir is not None:
        from dyntrain.sim.plots import render

        for path in render(results, Path(plots_dir)):
            click.echo(f"wrote {path}")
