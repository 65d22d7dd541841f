"""What each benchmark report holds: the pages of docs/benchmarks/ and their helpers.

A ``Page`` is one benchmark: what it measures, its runs (one ``Run`` per result file, with the
metadata the file lacks), a function that turns a result into Markdown tables, and how to read
the numbers. The pages themselves are in ``report_runtime.py``, ``report_numerics.py``,
``report_sharded.py``, ``report_multihost.py``, ``report_data.py``, ``report_service.py``,
``report_sim.py`` and ``report_scale.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Run:
    """One result file of a benchmark, and what the report must say that the file does not."""

    file: str  # under bench/results/
    label: str  # the section heading
    date: str | None = None  # ISO time, where the file has none (from `git log` of the file)
    load: str | None = None  # the load while it ran, where the file has none
    machine: str | None = None
    command: str | None = None
    note: str = ""  # Markdown printed above the run's tables


@dataclass(frozen=True)
class Page:
    """One benchmark report: ``docs/benchmarks/<slug>.md``."""

    slug: str
    title: str
    headline: str  # one line for the index
    what: str  # Markdown: what it measures and how
    command: str
    runs: Sequence[Run]
    tables: Callable[[dict, Run], str]
    reading: str = ""  # Markdown: how to read the numbers
    recorded: str = ""  # Markdown: figures of earlier runs whose result files were not kept
    extra: dict = field(default_factory=dict)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
             right: Sequence[int] = ()) -> str:
    """A Markdown table; columns whose index is in ``right`` are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_block(text: str) -> str:
    """A preformatted table that the benchmark printed (and stored in its result file)."""
    return "```text\n" + text.rstrip() + "\n```"


def num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def secs(x: float | None) -> str:
    """Seconds as the reports print them: 3 decimals under 1 s, else 1 decimal."""
    if x is None:
        return "–"
    return f"{x:.3f}" if x < 1 else f"{x:.1f}"


def printed_table(data: dict, run: Run) -> str:
    """The table the benchmark printed, as stored in its result file."""
    return text_block(data["table"])
