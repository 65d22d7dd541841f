"""How the service commands print: tables, times, short ids, records."""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import click

from dyntrain.service.core.model import JobStatus


def make_console():
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # piped or redirected: do not squeeze tables into 80 columns
        console = Console(highlight=False, width=200)
    return console


def make_table(*columns: str):
    """A plain table; only the last column wraps when the terminal is narrow."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, col in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(col, no_wrap=not last, overflow="fold" if last else "ellipsis")
    return table


def short_id(job_id: str) -> str:
    """The first 8 characters of a job id; an array child keeps its index."""
    parent, sep, index = job_id.partition(":")
    return (parent[:8] + sep + index) if len(parent) > 8 else job_id


def format_time(ts: Any) -> str:
    if ts is None:
        return "-"
    try:
        return datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OSError, OverflowError):
        return str(ts)


def workers_text(job: dict[str, Any]) -> str:
    cur = job.get("current_workers") or 0
    elastic = job.get("elastic") if isinstance(job.get("elastic"), dict) else job
    low, high = elastic.get("min_workers"), elastic.get("max_workers")
    if low is not None and high is not None:
        how = ", torchrun" if job.get("launcher") == "torchrun" else ""
        return f"{cur} ({low}-{high}{how})"
    return str(cur)


def reason_text(job: dict[str, Any]) -> str:
    waiting = job.get("waiting")
    if job.get("status") == JobStatus.RUNNABLE.value and isinstance(waiting, dict):
        pos = waiting.get("position")
        reason = waiting.get("reason") or ""
        return f"waiting: #{pos} {reason}".rstrip() if pos is not None else \
            f"waiting: {reason}".rstrip()
    return job.get("status_reason") or ""


def list_items(answer: Any, *keys: str) -> list[Any]:
    """A list answer, or the list under one of ``keys`` of a mapping answer."""
    if isinstance(answer, list):
        return answer
    if isinstance(answer, dict):
        for key in keys:
            if isinstance(answer.get(key), list):
                return answer[key]
    return []


def print_record(record: dict[str, Any], order: Iterable[str] = ()) -> None:
    """``key: value`` lines, ``order`` first; nested mappings indented."""
    keys = [k for k in order if k in record] + [k for k in record if k not in order]
    width = max((len(k) for k in keys), default=0)

    def show(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return " ".join(str(v) for v in value) if all(
                not isinstance(v, (dict, list)) for v in value) else str(value)
        return "-" if value is None else str(value)

    for key in keys:
        value = record[key]
        if key.endswith("_at") and isinstance(value, (int, float)):
            value = format_time(value)
        if key == "trace" and isinstance(value, dict):  # a capacity trace: not its whole CSV
            rows = [ln for ln in str(value.get("csv", "")).splitlines()
                    if ln.split("#", 1)[0].strip()]
            value = (f"{max(0, len(rows) - 1)} rows{', looping' if value.get('loop') else ''}, "
                     f"started {format_time(value.get('started_at'))}")
        if isinstance(value, dict) and value:
            click.echo(f"{key + ':':<{width + 1}}")
            for k, v in value.items():
                click.echo(f"  {k}: {show(v)}")
        else:
            click.echo(f"{key + ':':<{width + 1}} {show(value)}")
