"""``dyntrain lab throughput``: samples/s and scaling efficiency at 1, 2, 4 ... workers."""

from __future__ import annotations

import click

from dyntrain.cli.run import _script_command

# torch (and matplotlib) are imported only once the runs start.


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--workers", "workers", default="1,2,4", show_default=True,
              help="Worker counts to measure, comma-separated.")
@click.option("--mode", default="both", show_default=True,
              type=click.Choice(["weak", "strong", "both"]),
              help="weak: fixed per-worker batch; strong: fixed global batch.")
@click.option("--per-worker-batch", default=32, show_default=True, type=int,
              help="Weak scaling: samples per worker per step (global batch = this x workers).")
@click.option("--global-batch", default=128, show_default=True, type=int,
              help="Strong scaling: samples per step at every worker count.")
@click.option("--chunk-size", default=8, show_default=True, type=int,
              help="Samples per chunk (the unit of work a worker computes).")
@click.option("--steps", default=30, show_default=True, type=int,
              help="Optimizer steps each run trains (warm-up and the last step included).")
@click.option("--warmup", default=5, show_default=True, type=int,
              help="Leading steps left out of the timing.")
@click.option("--repeat", "repeats", default=1, show_default=True, type=int,
              help="Runs per (mode, workers); the one with the median samples/s counts.")
@click.option("--out", "out_dir", default="runs/throughput", show_default=True,
              type=click.Path(),
              help="Writes throughput.json, throughput.md, throughput.png and runs/ here.")
@click.argument("script", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def throughput(workers, mode, per_worker_batch, global_batch, chunk_size, steps, warmup,
               repeats, out_dir, script, args):
    """Samples/s and scaling efficiency for each worker count, as a table and a plot.

    Every (mode, workers) pair is a real elastic job with exactly that many local workers.
    SCRIPT (or -m MODULE) with ARGS is the workload [default: -m dyntrain.workloads.digits]; it
    must accept --global-batch, --chunk-size and --max-steps, which are appended for each run.
    """
    from dyntrain.lab.scaling import DIGITS, ThroughputConfig, parse_modes, parse_worker_counts
    from dyntrain.lab.throughput import run_throughput
    from dyntrain.lab.throughput_output import markdown_table

    command = DIGITS if script is None else _script_command(script, args)
    config = ThroughputConfig(
        workers=tuple(parse_worker_counts(workers)), modes=parse_modes(mode),
        per_worker_batch=per_worker_batch, global_batch=global_batch, chunk_size=chunk_size,
        steps=steps, warmup=warmup, command=tuple(command), out_dir=out_dir,
        repeats=repeats)
    doc = run_throughput(config)
    click.echo(markdown_table(doc), nl=False)
    click.echo(f"\nwrote {out_dir}/throughput.json, throughput.md and throughput.png "
               f"({doc['seconds']:.0f} s)")
