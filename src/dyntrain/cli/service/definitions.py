"""``dyntrain jobdef``: job definitions."""

from __future__ import annotations

import click

from dyntrain.cli.service.common import (
    attempts_from_flags,
    conn_options,
    friendly,
    from_file,
    load_body,
    make_client,
    parse_kv,
    parse_min_max,
    remember_conn,
    resources_fields,
)
from dyntrain.cli.service.output import list_items, make_console, make_table, print_record
from dyntrain.errors import DyntrainError
from dyntrain.service.core.model import Launcher, values


@click.group("jobdef")
@conn_options
@click.pass_context
def jobdef(ctx, url, token):
    """Job definitions: named, revisioned job templates."""
    remember_conn(ctx, url, token)


@jobdef.command("register")
@click.argument("name", required=False)
@click.option("-f", "--file", "path", default=None, metavar="FILE.yaml",
              help="Fields of the definition (flags override them).")
@click.option("--workers", default=None, metavar="MIN:MAX", help="Elastic between MIN and MAX.")
@click.option("--launcher", type=click.Choice(values(Launcher)), default=None,
              help="How the elastic workers run: dyntrain (the exact runtime) or torchrun (a "
                   "plain DDP script, restarted at each resize). Needs --workers.")
@click.option("--attempts", type=int, default=None, metavar="N",
              help="Attempts in all, the first included (1-10; retry_strategy.attempts).")
@click.option("--retries", type=int, default=None, metavar="N",
              help="Retries after a failed first attempt (0-9): the same as --attempts N+1.")
@click.option("--timeout", type=float, default=None, metavar="S", help="Seconds per attempt.")
@click.option("--param", "params", multiple=True, metavar="K=V", help="Default of Ref::K.")
@click.option("--env", "envs", multiple=True, metavar="K=V", help="Environment variable.")
@click.option("--cpus", type=float, default=None, help="CPUs per worker.")
@click.option("--gpus", type=int, default=None, help="GPUs per worker.")
@click.option("--memory", type=int, default=None, metavar="MiB", help="Memory per worker.")
@conn_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@friendly
def jobdef_register(name, path, workers, launcher, attempts, retries, timeout, params, envs,
                    cpus, gpus, memory, url, token, command):
    """Register job definition NAME (a new revision if it exists) from flags or -f FILE.yaml.

    \b
    dyntrain jobdef register train --workers 1:4 --param epochs=3 -- python t.py Ref::epochs
    """
    body = load_body(path, "JobDefinitionIn") if path else {}
    attempts = attempts_from_flags(attempts, retries)
    if name:
        body["name"] = name
    if not body.get("name"):
        raise click.UsageError("jobdef register needs a NAME (or a name in -f FILE)")
    if command:
        body["command"] = list(command)
    if "command" not in body:
        raise click.UsageError("jobdef register needs a COMMAND (after --) or -f FILE")
    if workers is not None:
        w = parse_min_max(workers)
        body["elastic"] = {"min_workers": w["min"], "max_workers": w["max"]}
    if launcher is not None:
        if not isinstance(body.get("elastic"), dict):
            raise click.UsageError(f"--launcher {launcher} needs --workers MIN:MAX")
        body["elastic"]["launcher"] = launcher
    if attempts is not None:
        base = body.get("retry_strategy") if isinstance(body.get("retry_strategy"), dict) else {}
        body["retry_strategy"] = {**base, "attempts": attempts}
    if timeout is not None:
        body["timeout_seconds"] = timeout
    if params:
        base = body.get("parameters") if isinstance(body.get("parameters"), dict) else {}
        body["parameters"] = {**base, **parse_kv(params, "--param")}
    if envs:
        base = body.get("environment") if isinstance(body.get("environment"), dict) else {}
        body["environment"] = {**base, **parse_kv(envs, "--env")}
    res = resources_fields(cpus, gpus, memory)
    if res:
        base = body.get("resources") if isinstance(body.get("resources"), dict) else {}
        body["resources"] = {**base, **res}
    client = make_client(url, token)
    answer = from_file(path, lambda: client.register_job_definition(**body))
    rev = answer.get("revision") if isinstance(answer, dict) else None
    click.echo(f"registered job definition {body['name']}" + (f":{rev}" if rev else ""))


@jobdef.command("list")
@conn_options
@friendly
def jobdef_list(url, token):
    """List job definitions."""
    defs = list_items(make_client(url, token).list_job_definitions(), "job_definitions",
                      "definitions", "items")
    if not defs:
        make_console().print("no job definitions")
        return
    table = make_table("NAME", "REV", "STATUS", "WORKERS", "COMMAND")
    for d in defs:
        elastic = d.get("elastic") or {}
        workers = f"{elastic.get('min_workers')}-{elastic.get('max_workers')}" \
            if elastic else "1"
        table.add_row(str(d.get("name", "")), str(d.get("revision", "")),
                      str(d.get("status", "")), workers, " ".join(d.get("command") or []))
    make_console().print(table)


@jobdef.command("show")
@click.argument("ref", metavar="NAME[:REV]")
@conn_options
@friendly
def jobdef_show(ref, url, token):
    """Show job definition NAME (its latest revision, or REV)."""
    name, _, rev = ref.partition(":")
    if rev and not rev.isdigit():
        raise DyntrainError(f"job definition {ref!r}: revision must be a number")
    answer = make_client(url, token).get_job_definition(name, int(rev) if rev else None)
    print_record(answer, ("name", "revision", "status", "command", "environment",
                          "parameters", "resources", "retry_strategy", "timeout_seconds",
                          "elastic"))
