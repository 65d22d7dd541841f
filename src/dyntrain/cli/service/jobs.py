"""``status``, ``cancel`` and ``terminate``."""

from __future__ import annotations

import time
from typing import Any

import click

from dyntrain.cli.service.common import (
    JOB_STATUSES,
    conn_options,
    friendly,
    make_client,
    resolve_job,
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
from dyntrain.service.core.jobtext import (
    attempt_text,
    attempts_text,
    progress_text,
    result_text,
    short_worker,
)
from dyntrain.service.core.model import TERMINAL_STATUSES, CapacityType


def _jobs_table(jobs: list[dict[str, Any]]):
    table = make_table("ID", "NAME", "QUEUE", "STATUS", "WORKERS", "REASON")
    for job in jobs:
        table.add_row(short_id(str(job.get("id", ""))), str(job.get("name", "")),
                      str(job.get("queue", "")), str(job.get("status", "")),
                      workers_text(job), reason_text(job))
    return table


def _job_cost_lines(answer: Any) -> list[str] | None:
    """``format_cost`` of a ``cost`` answer; None when it is not a full cost record."""
    from dyntrain.service.core.cost import JobCost, StaticBaseline, format_cost
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
    lines.append(f"attempts:     {attempts_text(job)}")
    lines += [f"  {attempt_text(a)}" for a in job.get("attempt_history") or []
              if isinstance(a, dict)]
    lines += [f"preemptions:  {job.get('preemptions', 0)} (capacity taken back; never counted "
              "as attempts)",
              f"workers:      {workers_text(job)}"]
    progress = progress_text(job.get("progress"))
    if progress:
        lines.append(f"progress:     {progress}")
    result = result_text(job.get("result"))
    if result:
        lines.append(f"result:       {result}")
    if job.get("workdir"):
        lines.append(f"workdir:      {job['workdir']}")
    for w in job.get("workers") or []:
        if isinstance(w, dict):
            leaving = f", leaving: {w['leave_reason']}" if w.get("leave_reason") else ""
            lines.append(f"  {short_worker(str(w.get('id')))}  {w.get('state')} on "
                         f"{w.get('compute_environment')} "
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
    answer = client.cost(job["id"])
    cost_lines = _job_cost_lines(answer)
    if cost_lines:
        lines += ["", "cost", *cost_lines, *_price_hint(client, answer)]
    return lines


def _price_hint(client, answer: Any) -> list[str]:
    """Where to set the on-demand price when a zero price leaves the saving unknown."""
    base = answer.get("static_on_demand") if isinstance(answer, dict) else None
    if not isinstance(base, dict) or base.get("price_per_slot_hour") not in (0, 0.0):
        return []
    names = [ce.get("name") for ce in list_items(client.list_compute_environments(),
                                                 "compute_environments", "items")
             if ce.get("capacity_type") == CapacityType.ON_DEMAND.value]
    where = names[0] if names else "NAME"
    return [f"  (saving n/a: the on-demand price is 0; set the price of an ON_DEMAND "
            f"environment, e.g. `dyntrain ce update {where} --price 1.0`)"]


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
        job_id = resolve_job(client, job)["id"]

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
                if current is not None and current.get("status") in TERMINAL_STATUSES:
                    break
    except KeyboardInterrupt:
        pass
    if not console.is_terminal:
        console.line()  # Live ends a redirected render without a newline


@click.command()
@click.argument("job")
@conn_options
@friendly
def cancel(job, url, token):
    """Cancel JOB before it starts (SUBMITTED, PENDING or RUNNABLE)."""
    client = make_client(url, token)
    job_id = resolve_job(client, job)["id"]
    answer = client.cancel(job_id)
    _report_stop("cancelled", job_id, answer)


@click.command()
@click.argument("job")
@conn_options
@friendly
def terminate(job, url, token):
    """Stop JOB, running or not; it ends FAILED."""
    client = make_client(url, token)
    job_id = resolve_job(client, job)["id"]
    answer = client.terminate(job_id)
    _report_stop("terminated", job_id, answer)


def _report_stop(verb: str, job_id: str, answer: Any) -> None:
    status = answer.get("status") if isinstance(answer, dict) else None
    if verb == "terminated" and status not in TERMINAL_STATUSES:  # its workers are on their way out
        click.echo(f"terminating {job_id}: its workers were told to stop; it ends FAILED "
                   f"(`dyntrain status {job_id}` shows when)")
        return
    click.echo(f"{verb} {job_id}" + (f" ({status})" if status else ""))
