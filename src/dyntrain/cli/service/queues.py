"""``dyntrain queue``: job queues."""

from __future__ import annotations

from typing import Any

import click

from dyntrain.cli.service.common import (
    STATES,
    conn_options,
    friendly,
    from_file,
    load_body,
    make_client,
    remember_conn,
    split_names,
)
from dyntrain.cli.service.output import list_items, make_console, make_table


@click.group("queue")
@conn_options
@click.pass_context
def queue(ctx, url, token):
    """Job queues: a priority over an ordered list of compute environments."""
    remember_conn(ctx, url, token)


@queue.command("create")
@click.argument("name", required=False)
@click.option("-f", "--file", "path", default=None, metavar="FILE.yaml",
              help="Fields of the queue (flags override them).")
@click.option("--priority", type=int, default=None, help="Higher runs first [default: 1].")
@click.option("--ce", "envs", default=None, metavar="A,B",
              help="Compute environments, in order of preference.")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@conn_options
@friendly
def queue_create(name, path, priority, envs, state, url, token):
    """Create job queue NAME from flags or -f FILE.yaml."""
    body = load_body(path, "JobQueueIn") if path else {}
    if name:
        body["name"] = name
    if not body.get("name"):
        raise click.UsageError("queue create needs a NAME (or a name in -f FILE)")
    if priority is not None:
        body["priority"] = priority
    if envs is not None:
        body["compute_environments"] = split_names(envs, "--ce")
    if state:
        body["state"] = state.upper()
    if not path and "compute_environments" not in body:
        raise click.UsageError("queue create needs --ce A[,B...]")
    client = make_client(url, token)
    from_file(path, lambda: client.create_job_queue(**body))
    click.echo(f"created job queue {body['name']}")


@queue.command("list")
@conn_options
@friendly
def queue_list(url, token):
    """List job queues."""
    queues = list_items(make_client(url, token).list_job_queues(), "job_queues", "queues", "items")
    if not queues:
        make_console().print("no job queues")
        return
    table = make_table("NAME", "PRIORITY", "COMPUTE ENVIRONMENTS", "STATE")
    for q in queues:
        table.add_row(str(q.get("name", "")), str(q.get("priority", "")),
                      ",".join(q.get("compute_environments") or []), str(q.get("state", "")))
    make_console().print(table)


@queue.command("update")
@click.argument("name")
@click.option("--priority", type=int, default=None)
@click.option("--ce", "envs", default=None, metavar="A,B")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@conn_options
@friendly
def queue_update(name, priority, envs, state, url, token):
    """Change job queue NAME's priority, environments or state."""
    fields: dict[str, Any] = {}
    if priority is not None:
        fields["priority"] = priority
    if envs is not None:
        fields["compute_environments"] = split_names(envs, "--ce")
    if state:
        fields["state"] = state.upper()
    if not fields:
        raise click.UsageError("queue update needs at least one of --priority, --ce, --state")
    make_client(url, token).update_job_queue(name, **fields)
    click.echo(f"updated job queue {name}")


@queue.command("delete")
@click.argument("name")
@conn_options
@friendly
def queue_delete(name, url, token):
    """Delete job queue NAME."""
    make_client(url, token).delete_job_queue(name)
    click.echo(f"deleted job queue {name}")
