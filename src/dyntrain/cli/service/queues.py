"""``dyntrain queue``: job queues."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

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
@click.option("--scheduling-policy", "policy", default=None, metavar="NAME",
              help="A fair-share scheduling policy (`dyntrain policy`); none: first in, first "
                   "out.")
@click.option("--preempt-plain-jobs/--no-preempt-plain-jobs", "preempt", default=None,
              help="Under `--policy fairshare`, a plain job of an over-entitled share may be "
                   "preempted (queued again, the attempt not counted) when no elastic job "
                   "can shrink.")
@conn_options
@friendly
def queue_create(name, path, priority, envs, state, policy, preempt, url, token):
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
    if policy:
        body["scheduling_policy"] = policy
    if preempt is not None:
        body["preempt_plain_jobs"] = preempt
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
    table = make_table("NAME", "PRIORITY", "COMPUTE ENVIRONMENTS", "STATE", "POLICY")
    for q in queues:
        table.add_row(str(q.get("name", "")), str(q.get("priority", "")),
                      ",".join(q.get("compute_environments") or []), str(q.get("state", "")),
                      str(q.get("scheduling_policy") or "-"))
    make_console().print(table)


@queue.command("update")
@click.argument("name")
@click.option("--priority", type=int, default=None)
@click.option("--ce", "envs", default=None, metavar="A,B")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@click.option("--scheduling-policy", "policy", default=None, metavar="NAME",
              help="Replace the queue's fair-share scheduling policy.")
@click.option("--preempt-plain-jobs/--no-preempt-plain-jobs", "preempt", default=None,
              help="Under `--policy fairshare`, a plain job of an over-entitled share may be "
                   "preempted (queued again, the attempt not counted) when no elastic job "
                   "can shrink.")
@conn_options
@friendly
def queue_update(name, priority, envs, state, policy, preempt, url, token):
    """Change job queue NAME's priority, environments or state."""
    fields: dict[str, Any] = {}
    if priority is not None:
        fields["priority"] = priority
    if envs is not None:
        fields["compute_environments"] = split_names(envs, "--ce")
    if state:
        fields["state"] = state.upper()
    if policy:
        fields["scheduling_policy"] = policy
    if preempt is not None:
        fields["preempt_plain_jobs"] = preempt
    if not fields:
        raise click.UsageError("queue update needs at least one of --priority, --ce, --state, "
                               "--scheduling-policy, --preempt-plain-jobs")
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


@queue.command("snapshot")
@click.argument("name")
@conn_options
@friendly
def queue_snapshot(name, url, token):
    """The front of job queue NAME (in the order its jobs would start) and each share's
    slots."""
    snap = make_client(url, token).request("GET", f"/job-queues/{quote(name, safe='')}/snapshot")
    console = make_console()
    shares = snap.get("shares") or {}
    if shares:
        console.print("shares: " + ", ".join(f"{s or '-'}={n}" for s, n in sorted(shares.items())))
    if not snap.get("front"):
        console.print("no job waits")
        return
    table = make_table("#", "JOB", "NAME", "SHARE", "PRIORITY", "WHY IT WAITS")
    for i, job in enumerate(snap["front"], 1):
        table.add_row(str(i), job["id"], str(job.get("name") or ""), str(job.get("share") or "-"),
                      str(job.get("scheduling_priority", "")), str(job.get("reason") or ""))
    console.print(table)
