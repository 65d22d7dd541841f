"""What a job's workers leave behind: why one failed (the line a job's status reason quotes,
from its log), and what its training reported (``result.json`` in the run folder)."""

from __future__ import annotations

import json
from pathlib import Path

RESULT_FILE = "result.json"  # written by ``trainer.report()`` (or its job's coordinator)

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


def read_result(run_dir: Path, since: float) -> dict | None:
    """The values in the run folder's ``result.json`` when it was written at ``since`` or later
    (by the attempt that started then); None when there are none."""
    path = run_dir / RESULT_FILE
    try:
        if path.stat().st_mtime < since:
            return None
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) and values else None


def _cut(line: str) -> str:
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 3] + "..."
