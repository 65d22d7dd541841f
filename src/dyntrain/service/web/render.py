"""Jinja2 templates of the dashboard and the filters they format numbers and times with."""

from __future__ import annotations

import re
import time
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from dyntrain.service.core.jobtext import attempts_text, progress_text, result_text

_HEX_ID = re.compile(r"^([0-9a-f]{32})(.*)$", re.DOTALL)


def clock(ts: float | None) -> str:
    """A moment in the server's local time: ``14:03:12`` today, ``2026-05-01 14:03`` before."""
    if ts is None:
        return "–"
    t = time.localtime(ts)
    if time.strftime("%Y-%m-%d", t) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", t)
    return time.strftime("%Y-%m-%d %H:%M", t)


def duration(seconds: float | None) -> str:
    """``850 ms``, ``42 s``, ``3m05s``, ``2h04m``."""
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def money(value: float | None) -> str:
    if value is None:
        return "–"
    return f"${value:,.4f}" if 0 < abs(value) < 0.01 else f"${value:,.2f}"


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f} %"


def number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def short(job_id: str) -> str:
    """An id as the tables show it: a leading 32-hex job id cut to 8 characters, the rest (an
    array index, a worker's attempt and number) kept."""
    m = _HEX_ID.match(job_id)
    return job_id if m is None else m.group(1)[:8] + m.group(2)


def make_environment() -> Environment:
    env = Environment(loader=PackageLoader("dyntrain.service.web", "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters.update(clock=clock, duration=duration, money=money, percent=percent,
                       number=number, short=short, attempts=attempts_text,
                       progress=progress_text, result=result_text)
    return env
