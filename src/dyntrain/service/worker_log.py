"""Why a worker failed, read from its log: the line a job's status reason quotes."""

from __future__ import annotations

from pathlib import Path

TRACEBACK = "Traceback (most recent call last):"
MAX_CHARS = 300
TAIL_BYTES = 64 * 1024


def error_line(text: str) -> str:
    """``error: <the exception line of the last traceback>`` in ``text``, else ``last output:
    <its last non-empty line>``; '' for an empty log.

    ``python missing.py`` and ``python -m missing`` print one line and no traceback; an exception
    prints a traceback whose first unindented line after the header names it.
    """
    lines = text.splitlines()
    header = max((i for i, line in enumerate(lines) if line.startswith(TRACEBACK)), default=None)
    if header is not None:
        for line in lines[header + 1:]:
            if line.strip() and not line[0].isspace():
                return "error: " + _cut(line.strip())
    found = [line.strip() for line in lines if line.strip()]
    return "last output: " + _cut(found[-1]) if found else ""


def read_error_line(path: str | Path) -> str:
    """``error_line`` of the end of a log file; '' when it is missing or empty."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    return error_line(data.decode(errors="replace"))


def _cut(line: str) -> str:
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 3] + "..."
