"""``submit``, ``status``, ``logs``, ``cancel`` and ``terminate``."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from dyntrain.cli.service.common import (
    JOB_STATUSES,
    POLL_SECONDS,
    TERMINAL,
    conn_options,
    friendly,
    make_client,
    parse_dependency,
    parse_kv,
    parse_min_max,
    resources_fields,
)
from dyntrain.cli.service.output import (
    format_time,
    list_items,
    make_console,
    make_table,
    reason_text,
    short_id,
    workers_text,
)
from dyntrain.errors import DyntrainError


def _resolve_job(client, ref: str) -> dict[str, Any]:
    """The job ``ref`` names: its id, or a unique prefix of one (as ``status`` shows them)."""
    from dyntrain.service.client import ApiError

    try:
        return client.get_job(ref)
    except ApiError as first:
        if first.status != 404:
            raise
        parent, sep, index = ref.partition(":")
        try:
            jobs = list_items(client.list_jobs(limit=1000), "jobs", "items")
        except ApiError:
            raise first from None
        matches = [j for j in jobs if str(j.get("id", "")).startswith(parent)]
        if len(matches) == 1:
            return client.get_job(matches[0]["id"] + sep + index)
        if len(matches) > 1:
            some = ", ".join(j["id"] for j in matches[:3]) + (", ..." if len(matches) > 3 else "")
            raise DyntrainError(f"job id {ref!r} is ambiguous: {len(matches)} job ids start "
                                f"with it ({some})") from None
        raise


def _print_log_page(client, job_id: str, after: int) -> tuple[int, dict[str, Any]]:
    """Print the lines after ``after``; returns the seq to go on from and the page."""
    page = client.logs(job_id, after_seq=after)
    for line in page.get("lines") or []:
        click.echo(line.get("line", "") if isinstance(line, dict) else str(line))
    return int(page.get("last_seq", after)), page


def _print_log(client, job_id: str) -> None:
    after = 0
    while True:
        after, page = _print_log_page(client, job_id, after)
        if not page.get("lines"):
            return


def _follow(client, job_id: str, *, announce: bool) -> dict[str, Any]:
    """Print a job's log (and, with ``announce``, its status changes) until it ends."""
    after, shown = 0, None
    while True:
        after, page = _print_log_page(client, job_id, after)
        if announce and page.get("status") != (shown or {}).get("status"):
            job = client.get_job(job_id)
            reason = reason_text(job)
            click.echo(f"[{short_id(job_id)}] {job['status']}" + (f": {reason}" if reason else ""),
                       err=True)
            shown = job
        if page.get("done") and not page.get("lines"):
            return client.get_job(job_id)
        if not page.get("lines"):
            time.sleep(POLL_SECONDS)


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--queue", "-q", default="default", show_default=True, help="Job queue.")
@click.option("--name", "-n", default=None, help="Job name [default: the definition's].")
@click.option("--definition", "-d", default=None, metavar="NAME[:REV]",
              help="Job definition (latest revision unless :REV).")
@click.option("--workers", default=None, metavar="MIN:MAX",
              help="Run elastically with MIN to MAX workers.")
@click.option("--array", "array_size", type=int, default=None, metavar="N",
              help="An array job of N children.")
@click.option("--depends-on", multiple=True, metavar="ID[:TYPE]",
              help="Wait for another job (TYPE: STANDARD, N_TO_N, SEQUENTIAL); repeatable.")
@click.option("--retries", type=int, default=None, metavar="N", help="Attempts in all (1-10).")
@click.option("--timeout", type=float, default=None, metavar="S", help="Seconds per attempt.")
@click.option("--param", "params", multiple=True, metavar="K=V",
              help="A parameter for Ref::K in the command; repeatable.")
@click.option("--env", "envs", multiple=True, metavar="K=V",
              help="An environment variable; repeatable.")
@click.option("--cpus", type=float, default=None, help="CPUs per worker.")
@click.option("--gpus", type=int, default=None, help="GPUs per worker.")
@click.option("--memory", type=int, default=None, metavar="MiB", help="Memory per worker.")
@click.option("--wait", is_flag=True,
              help="Follow status and logs until the job ends; exit 1 if it failed.")
@conn_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@friendly
def submit(queue, name, definition, workers, array_size, depends_on, retries, timeout,
           params, envs, cpus, gpus, memory, wait, url, token, command):
    """Submit a job: a COMMAND (after --), or a job definition; prints the job id.

    \b
    dyntrain submit -- python train.py --epochs 3
    dyntrain submit --definition train:2 --workers 1:4 --param epochs=3 --wait
    """
    body: dict[str, Any] = {"queue": queue}
    if not command and definition is None:
        raise click.UsageError("submit needs a COMMAND (after --) or --definition")
    if definition is not None:
        body["definition"] = definition
    if command:
        body["command"] = list(command)
    if name is not None:
        body["name"] = name
    if workers is not None:
        body["workers"] = parse_min_max(workers)
    if array_size is not None:
        body["array_size"] = array_size
    if retries is not None:
        body["retry_attempts"] = retries
    if timeout is not None:
        body["timeout_seconds"] = timeout
    if params:
        body["parameters"] = parse_kv(params, "--param")
    if envs:
        body["environment"] = parse_kv(envs, "--env")
    res = resources_fields(cpus, gpus, memory)
    deps = [parse_dependency(d) for d in depends_on]
    client = make_client(url, token)
    if res and definition is not None and len(res) < 3:
        # what is not given comes from the definition, not from the service's defaults
        dname, _, drev = definition.partition(":")
        if drev and not drev.isdigit():
            raise DyntrainError(f"--definition {definition!r}: revision must be a number")
        spec = client.get_job_definition(dname, int(drev) if drev else None)
        res = {**(spec.get("resources") or {}), **res}
    if res:
        body["resources"] = res
    for dep in deps:
        parent, sep, index = dep["job_id"].partition(":")
        dep["job_id"] = _resolve_job(client, parent)["id"] + sep + index
    if deps:
        body["depends_on"] = deps
    job = client.submit(**body)
    click.echo(job["id"])
    if not wait:
        return
    final = _follow(client, job["id"], announce=True)
    sys.exit(0 if final["status"] == "SUCCEEDED" else 1)


def _jobs_table(jobs: list[dict[str, Any]]):
    table = make_table("ID", "NAME", "QUEUE", "STATUS", "WORKERS", "REASON")
    for job in jobs:
        table.add_row(short_id(str(job.get("id", ""))), str(job.get("name", "")),
                      str(job.get("queue", "")), str(job.get("status", "")),
                      workers_text(job), reason_text(job))
    return table


def _job_cost_lines(answer: Any) -> list[str] | None:
    """``format_cost`` of a ``cost`` answer; None when it is not a full cost record."""
    from dyntrain.service.cost import JobCost, StaticBaseline, format_cost
    from dyntrain.service.model import CapacityType

    if not isinstance(answer, dict):
        return None
    if isinstance(answer.get("lines"), list):
        return [str(x) for x in answer["lines"]]
    data = answer.get("cost", answer) if isinstance(answer.get("cost"), dict) else answer
    try:
        base = data["static_on_demand"]
        cost = JobCost(
            total=float(data["total"]),
            worker_seconds=float(data["worker_seconds"]),
            cost_by_compute_environment=dict(data["cost_by_compute_environment"]),
            cost_by_capacity_type={CapacityType(k): float(v)
                                   for k, v in data["cost_by_capacity_type"].items()},
            worker_seconds_by_compute_environment=dict(
                data["worker_seconds_by_compute_environment"]),
            worker_seconds_by_capacity_type={
                CapacityType(k): float(v)
                for k, v in data["worker_seconds_by_capacity_type"].items()},
            wasted_worker_seconds=float(data["wasted_worker_seconds"]),
            wasted_cost=float(data["wasted_cost"]),
            wall_seconds=float(data["wall_seconds"]),
            static_on_demand=StaticBaseline(int(base["workers"]),
                                            float(base["price_per_slot_hour"]),
                                            float(base["wall_seconds"]), float(base["cost"])),
            saving_percent=None if data.get("saving_percent") is None
            else float(data["saving_percent"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return format_cost(cost)


def _job_details(client, job: dict[str, Any]) -> list[str]:
    lines = [f"job:          {job.get('id')}",
             f"name:         {job.get('name')}",
             f"queue:        {job.get('queue')}",
             f"status:       {job.get('status')}"]
    reason = reason_text(job)
    if reason:
        lines.append(f"reason:       {reason}")
    lines += [f"attempts:     {job.get('attempts', 0)}",
              f"preemptions:  {job.get('preemptions', 0)}",
              f"workers:      {workers_text(job)}"]
    for w in job.get("workers") or []:
        if isinstance(w, dict):
            leaving = f", leaving: {w['leave_reason']}" if w.get("leave_reason") else ""
            lines.append(f"  {w.get('id')}  {w.get('state')} on {w.get('compute_environment')} "
                         f"({w.get('capacity_type')}, {w.get('price_per_slot_hour')}/slot-h)"
                         f"{leaving}")
    array = job.get("array")
    if isinstance(array, dict):
        counts = array.get("status_counts") or {}
        lines.append(f"array:        {array.get('size', job.get('array_size'))} children: "
                     + (", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none yet"))
    elif job.get("array_index") is not None:
        lines.append(f"array child:  {job['array_index']} of {job.get('array_parent_id')}")
    deps = job.get("depends_on") or []
    if deps:
        lines.append("depends on:   " + ", ".join(
            f"{short_id(str(d.get('job_id')))} ({d.get('type', 'STANDARD')})"
            if isinstance(d, dict) else str(d) for d in deps))
    lines += [f"created:      {format_time(job.get('created_at'))}",
              f"started:      {format_time(job.get('started_at'))}",
              f"stopped:      {format_time(job.get('stopped_at'))}"]
    cost_lines = _job_cost_lines(client.cost(job["id"]))
    if cost_lines:
        lines += ["", "cost", *cost_lines]
    return lines


@click.command()
@click.argument("job", required=False)
@click.option("--queue", "-q", default=None, help="Only this queue's jobs.")
@click.option("--status", "-s", "status_filter", default=None,
              type=click.Choice(JOB_STATUSES, case_sensitive=False),
              help="Only jobs in this status.")
@click.option("--watch", "-w", is_flag=True, help="Refresh every second (Ctrl-C to stop).")
@conn_options
@friendly
def status(job, queue, status_filter, watch, url, token):
    """A table of jobs, or JOB's details (status, workers, attempts, cost)."""
    client = make_client(url, token)
    console = make_console()
    if job is not None:
        job_id = _resolve_job(client, job)["id"]

        def render():
            from rich.text import Text

            current = client.get_job(job_id)
            return Text("\n".join(_job_details(client, current))), current
    else:
        filters: dict[str, Any] = {}
        if queue:
            filters["queue"] = queue
        if status_filter:
            filters["status"] = status_filter.upper()

        def render():
            jobs = list_items(client.list_jobs(**filters), "jobs", "items")
            if not jobs:
                from rich.text import Text

                return Text("no jobs"), None
            return _jobs_table(jobs), None

    if not watch:
        console.print(render()[0])
        return
    from rich.live import Live

    try:
        with Live(render()[0], console=console, auto_refresh=False) as live:
            while True:
                time.sleep(1.0)
                renderable, current = render()
                live.update(renderable, refresh=True)
                if current is not None and current.get("status") in TERMINAL:
                    break
    except KeyboardInterrupt:
        pass
    if not console.is_terminal:
        console.line()  # Live ends a redirected render without a newline


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
@click.argument("job")
@conn_options
@friendly
def logs(follow, job, url, token):
    """Print JOB's log."""
    client = make_client(url, token)
    job_id = _resolve_job(client, job)["id"]
    if follow:
        _follow(client, job_id, announce=False)
    else:
        _print_log(client, job_id)


@click.command()
@click.argument("job")
@conn_options
@friendly
def cancel(job, url, token):
    """Cancel JOB before it starts (SUBMITTED, PENDING or RUNNABLE)."""
    client = make_client(url, token)
    job_id = _resolve_job(client, job)["id"]
    answer = client.cancel(job_id)
    _report_stop("cancelled", job_id, answer)


@click.command()
@click.argument("job")
@conn_options
@friendly
def terminate(job, url, token):
    """Stop JOB, running or not; it ends FAILED."""
    client = make_client(url, token)
    job_id = _resolve_job(client, job)["id"]
    answer = client.terminate(job_id)
    _report_stop("terminated", job_id, answer)


def _report_stop(verb: str, job_id: str, answer: Any) -> None:
    status = answer.get("status") if isinstance(answer, dict) else None
    click.echo(f"{verb} {job_id}" + (f" ({status})" if status else ""))
