"""``dyntrain run`` and ``dyntrain worker``."""

from __future__ import annotations

import difflib
import json
import os
import socket
import sys
from pathlib import Path

import click

from dyntrain.cli.numerics import asked_numerics, numerics_options
from dyntrain.elastic.protocol import FAILURE_TIMEOUT
from dyntrain.errors import DyntrainError
from dyntrain.launch.events import parse_events, parse_workers

# torch is imported inside the commands: the rest of the CLI starts without it.


def _script_command(script: str, args: tuple[str, ...]) -> list[str]:
    """Validate SCRIPT (a .py path, or ``-m module``) and build the worker's argv."""
    if script == "-m":
        if not args:
            raise DyntrainError("-m needs a module name")
        return ["-m", *args]
    if script.startswith("-"):
        # SCRIPT takes the first word that is not one of our options: a typo lands here
        ctx = click.get_current_context()
        known = [o for param in ctx.command.params for o in getattr(param, "opts", ())
                 if o.startswith("--")]
        name = script.split("=")[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        raise click.NoSuchOption(name, ctx=ctx, possibilities=close)
    if not Path(script).is_file():
        raise DyntrainError(f"script not found: {script}")
    return [script, *args]


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--workers", "workers", default="1:1", show_default=True,
              help="MIN:MAX workers; the job pauses below MIN and never exceeds MAX.")
@click.option("--nproc", type=int, default=None, help="Workers to start now [default: MIN].")
@click.option("--standby", type=int, default=0, show_default=True,
              help="Local workers kept ready beyond the job's members: each runs the script up "
                   "to fit() and takes the place of a member that leaves or dies within a "
                   "fraction of a second (one joins where the job has room).")
@click.option("--events", default=None,
              help="Injected membership changes, e.g. 'step=5:join=2,step=9:kill=1'.")
@click.option("--chaos", default=None, metavar="SEED:N[:AIM,...]",
              help="N random joins, leaves, kills and hangs at the worst moments, without "
                   "waiting for the previous change (a robustness test; see docs/running.md). "
                   "AIMs: any, reform, sender, receiver, checkpoint, burst.")
@click.option("--out", "out_dir", default="runs/latest", show_default=True,
              help="Run folder (checkpoints, logs, metrics): a local folder or an object-store "
                   "URL such as s3://bucket/prefix (see docs/several-hosts.md).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address the coordinator listens on.")
@click.option("--port", default=0, type=int, help="Coordinator port [default: any free port].")
@click.option("--failure-timeout", default=FAILURE_TIMEOUT, show_default=True, type=float,
              help="Seconds without a heartbeat before a remote worker counts as dead.")
@click.option("--grace-seconds", default=30.0, show_default=True, type=float,
              help="After Ctrl-C, seconds the workers get to finish their step and checkpoint "
                   "before they are killed.")
@click.option("--quiet", is_flag=True,
              help="No progress output; how the run ended (a failure and why) is still said.")
@click.option("--takeover", is_flag=True,
              help="Should this host be lost for good, a worker on another host hosts the "
                   "job's coordinator and the job goes on (see docs/several-hosts.md).")
@click.option("--tensorboard/--no-tensorboard", default=None,
              help="TensorBoard event files in OUT/tensorboard [default: on when the "
                   "tensorboard package is installed].")
@numerics_options
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(workers, nproc, standby, events, chaos, out_dir, host, port, failure_timeout,
        grace_seconds, quiet, takeover, tensorboard, threads, cpu_kernels, deterministic,
        matmul_precision, allow_mixed_numerics, script, args):
    """Train SCRIPT elastically with local worker processes.

    SCRIPT is a Python file (or -m MODULE) that builds an ElasticTrainer and calls fit().
    """
    from dyntrain.elastic.runs.storage import open_store

    low, high = parse_workers(workers)
    command = _script_command(script, args)
    # a folder that cannot be one or a bucket that is not there: said before torch is imported
    open_store(out_dir, "--out").check()
    from dyntrain.elastic.runs.tensorboard import wanted

    tensorboard = wanted(tensorboard, "--tensorboard")  # asked for but not installed: one line

    from dyntrain.launch.chaos import parse_chaos
    from dyntrain.launch.runner import RunOptions, run_job

    opts = RunOptions(command=command, min_workers=low, max_workers=high,
                      nproc=low if nproc is None else nproc, standby=standby, out_dir=out_dir,
                      events=parse_events(events), host=host, port=port,
                      chaos=parse_chaos(chaos) if chaos else None,
                      failure_timeout=failure_timeout, grace_seconds=grace_seconds,
                      quiet=quiet, tensorboard=tensorboard,
                      numerics=asked_numerics(threads, cpu_kernels, deterministic,
                                              matmul_precision),
                      allow_mixed_numerics=allow_mixed_numerics, takeover=takeover)
    sys.exit(run_job(opts))


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--coordinator", required=True, help="HOST:PORT printed by `dyntrain run`.")
@click.option("--connect-timeout", default=30.0, show_default=True, type=float,
              help="Seconds to wait for the coordinator to listen and to publish its job.")
@click.option("--advertise-address", default=None, metavar="ADDRESS",
              help="Address the other workers connect to [default: the one this host reaches "
                   "the coordinator from].")
@click.option("--iface", default=None, metavar="NAME",
              help="Advertise the address of this network interface instead.")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def worker(coordinator, connect_timeout, advertise_address, iface, script, args):
    """Join a running job as one more worker (e.g. from another machine).

    Should the job declare it dead while it is cut off (frozen, or behind a network partition
    that heals later), it starts over as a new worker and is re-admitted with the state handed
    over afresh."""
    from dyntrain.elastic.numerics import Numerics, host_refusal
    from dyntrain.elastic.protocol import (
        ENV_ADVERTISE,
        ENV_COORDINATOR,
        ENV_IFACE,
        ENV_OUT,
        ENV_WORKER_ARGV,
    )
    from dyntrain.elastic.worker import address
    from dyntrain.elastic.worker.connect import connect_store, parse_address, wait_job_info

    command = _script_command(script, args)
    if advertise_address and iface:
        raise DyntrainError("give --advertise-address or --iface, not both")
    # checked here, so that a wrong one is said before the script starts
    address.advertise_address(parse_address(coordinator), advertise_address, iface)
    info = wait_job_info(connect_store(coordinator, connect_timeout), coordinator,
                         connect_timeout)
    env = {**os.environ, ENV_COORDINATOR: coordinator, "DYNTRAIN_CONNECT_TIMEOUT":
           str(connect_timeout), ENV_WORKER_ARGV: json.dumps([sys.executable, *command])}
    if info.get("numerics"):  # the job's numerics, whatever this host's shell says
        numerics = Numerics.from_json(info["numerics"])
        refusal = host_refusal(numerics, f"this host ({socket.gethostname()})")
        if refusal:
            raise DyntrainError(f"this worker cannot join the job: {refusal}")
        env.update(numerics.env())
    if advertise_address:
        env[ENV_ADVERTISE] = advertise_address
    if iface:
        env[ENV_IFACE] = iface
    if info.get("out_dir") and ENV_OUT not in env:
        env[ENV_OUT] = info["out_dir"]
    os.execve(sys.executable, [sys.executable, *command], env)
