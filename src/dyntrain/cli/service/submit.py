"""``dyntrain submit``: a job from flags and/or a YAML file of the REST body's fields.

The job runs in this shell's working directory with this shell's environment unless told
otherwise (``--workdir``, ``--export``; see ``dyntrain.service.core.submitter``). ``--wait``
follows it to its end; interrupting the wait leaves the job running and says how to stop it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click

from dyntrain.cli.service.common import (
    attempts_from_flags,
    conn_options,
    friendly,
    from_file,
    load_body,
    make_client,
    parse_dependency,
    parse_kv,
    parse_min_max,
    resolve_job,
    resources_fields,
)
from dyntrain.cli.service.follow import follow
from dyntrain.errors import DyntrainError
from dyntrain.service.core.model import TERMINAL_STATUSES, JobStatus, Launcher
from dyntrain.service.core.model import values as enum_values

MAX_ARRAY_SIZE = 10_000


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("-f", "--file", "path", default=None, metavar="FILE.yaml",
              help="Fields of the job, as the REST body names them (queue, command, workers: "
                   "{min, max}, array_size, retry_attempts, ...); flags override them.")
@click.option("--queue", "-q", default=None, help="Job queue.  [default: default]")
@click.option("--name", "-n", default=None, help="Job name [default: the definition's].")
@click.option("--definition", "-d", default=None, metavar="NAME[:REV]",
              help="Job definition (latest revision unless :REV).")
@click.option("--workers", default=None, metavar="MIN:MAX",
              help="Run elastically with MIN to MAX workers.")
@click.option("--launcher", type=click.Choice(enum_values(Launcher)), default=None,
              help="How the elastic workers run: dyntrain (the exact runtime) or torchrun (a "
                   "plain DDP script, restarted at each resize). Needs --workers (or a "
                   "definition's).")
@click.option("--array", "array_size", type=int, default=None, metavar="N",
              help=f"An array job of N children (2-{MAX_ARRAY_SIZE}), PARENT:0 to PARENT:N-1.")
@click.option("--depends-on", multiple=True, metavar="ID[:TYPE]",
              help="Wait for another job (TYPE: STANDARD, N_TO_N, SEQUENTIAL); repeatable.")
@click.option("--attempts", type=int, default=None, metavar="N",
              help="Attempts in all, the first included (1-10; AWS Batch's "
                   "retryStrategy.attempts).  [default: 1]")
@click.option("--retries", type=int, default=None, metavar="N",
              help="Retries after a failed first attempt (0-9): the same as --attempts N+1.")
@click.option("--timeout", type=float, default=None, metavar="S", help="Seconds per attempt.")
@click.option("--param", "params", multiple=True, metavar="K=V",
              help="A parameter for Ref::K in the command; repeatable.")
@click.option("--env", "envs", multiple=True, metavar="K=V",
              help="An environment variable; repeatable.")
@click.option("--export", "export", default="ALL", show_default=True,
              metavar="ALL|NONE|NAME[,NAME=VALUE...]",
              help="Which of this shell's environment variables the job gets (as sbatch's).")
@click.option("--workdir", default=None, metavar="DIR",
              help="Where the job's workers start.  [default: this directory]")
@click.option("--cpus", type=float, default=None, help="CPUs per worker.")
@click.option("--gpus", type=int, default=None, help="GPUs per worker.")
@click.option("--memory", type=int, default=None, metavar="MiB", help="Memory per worker.")
@click.option("--share", default=None, metavar="ID",
              help="The job's share identifier (a queue with a fair-share policy needs one).")
@click.option("--scheduling-priority", type=int, default=None, metavar="N",
              help="Orders the jobs of one share, higher first (0-9999).")
@click.option("--wait", is_flag=True,
              help="Follow status, progress and logs until the job ends; exit 1 if it failed.")
@conn_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@friendly
def submit(path, queue, name, definition, workers, launcher, array_size, depends_on, attempts,
           retries, timeout, params, envs, export, workdir, cpus, gpus, memory, share,
           scheduling_priority, wait, url, token, command):
    """Submit a job: a COMMAND (after --), a job definition, or -f FILE.yaml; prints its id.

    The job runs in this directory with this shell's environment (--workdir, --export).

    \b
    dyntrain submit -- python train.py --epochs 3
    dyntrain submit --definition train:2 --workers 1:4 --param epochs=3 --wait
    dyntrain submit --launcher torchrun --workers 2:8 -- python train.py
    dyntrain submit -f job.yaml --attempts 3
    """
    body = load_body(path, "JobIn") if path else {}
    flags: dict[str, Any] = {"queue": queue, "definition": definition, "name": name,
                             "command": list(command) if command else None,
                             "workers": None if workers is None else parse_min_max(workers),
                             "launcher": launcher,
                             "array_size": _array_size(array_size),
                             "retry_attempts": attempts_from_flags(attempts, retries),
                             "timeout_seconds": timeout, "share": share,
                             "scheduling_priority": scheduling_priority}
    body.update({k: v for k, v in flags.items() if v is not None})
    body.setdefault("queue", "default")
    if "command" not in body and "definition" not in body:
        raise click.UsageError("submit needs a COMMAND (after --), --definition or -f FILE")
    if launcher is not None and "workers" not in body and "definition" not in body:
        raise click.UsageError(f"--launcher {launcher} needs --workers MIN:MAX")
    for key, values, flag in (("parameters", params, "--param"), ("environment", envs, "--env")):
        if values:
            body[key] = {**(body.get(key) or {}), **parse_kv(values, flag)}
    _add_submitter(body, export, workdir)
    client = make_client(url, token)
    res = resources_fields(cpus, gpus, memory)
    if res:
        base = body.get("resources") if isinstance(body.get("resources"), dict) else None
        if base is None and body.get("definition") is not None and len(res) < 3:
            base = _definition_resources(client, str(body["definition"]))
        body["resources"] = {**(base or {}), **res}
    deps = [parse_dependency(d) for d in depends_on]
    for dep in deps:
        parent, sep, index = dep["job_id"].partition(":")
        dep["job_id"] = resolve_job(client, parent)["id"] + sep + index
    if deps:
        body["depends_on"] = [*(body.get("depends_on") or []), *deps]
    job = from_file(path, lambda: client.submit(**body))
    click.echo(job["id"])
    if not wait:
        return
    seen: dict[str, Any] = {}
    try:
        final = follow(client, job["id"], announce=True, seen=seen)
    except KeyboardInterrupt:
        _left_running(client, job["id"], seen.get("status") or "")
    sys.exit(0 if final["status"] == JobStatus.SUCCEEDED.value else 1)


def _array_size(size: int | None) -> int | None:
    if size is not None and not 2 <= size <= MAX_ARRAY_SIZE:
        raise DyntrainError(f"--array must be 2-{MAX_ARRAY_SIZE} (the number of children), "
                            f"got {size}")
    return size


def _add_submitter(body: dict[str, Any], export: str, workdir: str | None) -> None:
    """This shell's working directory and exported variables (unless the file gives them)."""
    from dyntrain.service.core.submitter import exported, parse_export

    if workdir is not None:
        body["workdir"] = os.path.abspath(os.path.expanduser(workdir))
    elif "workdir" not in body:
        body["workdir"] = os.getcwd()
    elif isinstance(body["workdir"], str) and not os.path.isabs(body["workdir"]):
        body["workdir"] = os.path.abspath(body["workdir"])
    if isinstance(body["workdir"], str) and not os.path.isdir(body["workdir"]):
        raise DyntrainError(f"workdir {body['workdir']}: no such directory")
    variables = exported(os.environ, parse_export(export))
    if variables and "exported_environment" not in body:
        body["exported_environment"] = variables


def _definition_resources(client, definition: str) -> dict[str, Any]:
    """What is not given as a flag comes from the definition, not from the service's defaults."""
    dname, _, drev = definition.partition(":")
    if drev and not drev.isdigit():
        raise DyntrainError(f"--definition {definition!r}: revision must be a number")
    return client.get_job_definition(dname, int(drev) if drev else None).get("resources") or {}


#: how long a Ctrl-C of ``submit --wait`` waits for the job's status before it says the last seen
STATUS_LOOK_SECONDS = 2.0


def _left_running(client, job_id: str, seen: str) -> NoReturn:
    """Ctrl-C while waiting: the job is the service's, not this shell's; say so and how to stop
    it, with its status (a quick look; a busy or gone service: the status last ``seen``)."""
    try:
        status = client.get_job(job_id, timeout=STATUS_LOOK_SECONDS).get("status") or seen
    except Exception:  # the service may be slow or gone; the hint still holds
        status = seen
    if status in TERMINAL_STATUSES:
        click.echo(f"\ndyntrain: stopped waiting; job {job_id} already ended {status}", err=True)
    else:
        click.echo(f"\ndyntrain: stopped waiting; job {job_id} goes on running on the service"
                   + (f" ({status})" if status else "")
                   + f": stop it with `dyntrain terminate {job_id}`, follow it again with "
                     f"`dyntrain logs -f {job_id}`", err=True)
    sys.exit(130)
