"""A run folder's line files, ``metrics.jsonl`` and ``events.jsonl``: the one way their rows
are written and the one way they are read.

``metrics.jsonl`` holds a :class:`MetricsRow` per optimizer step the leader applied, in the
order the steps completed (a step computed again after a failure comes again, ``recomputed``);
``events.jsonl`` an :class:`EventRow` per membership change, written once the new world has
completed its first step. Each row is one JSON object on one line; the row types (and what is
a valid row) are in :mod:`dyntrain.elastic.runs.rows`. Where the lines live (one
local file, or numbered segments on an object store) is :mod:`dyntrain.elastic.runs.linefile`'s
business.

Every reader follows one policy:

* blank lines are skipped;
* the text after the last newline is a line still being written: it is read if it already is a
  whole JSON object (a file written by hand without a final newline), else left for the next
  read (``Records.end`` stops before it);
* any other line that is not a JSON object, or (for the typed readers) not a valid row, is an
  error: :class:`RunLogError`, naming the file and the line (``.../metrics.jsonl:12: ...``).
  A reader that must go on whatever a run wrote (a dashboard) passes ``on_bad``: it is told
  each such error, and the line is skipped.

A file that is not there has no rows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyntrain.elastic.runs import linefile
from dyntrain.elastic.runs.rows import (
    EventRow,
    MetricsRow,
    Row,
    RowError,
    as_row,
    encode,
)
from dyntrain.elastic.runs.storage import LocalStore, RunStore, StorageError, is_url, open_store
from dyntrain.errors import DyntrainError

__all__ = [
    "EVENTS_FILE",
    "METRICS_FILE",
    "Record",
    "Records",
    "RowWriter",
    "RunFile",
    "RunLogError",
    "last_step",
    "open_events",
    "open_metrics",
    "read_events",
    "read_metrics",
    "read_records",
    "run_file",
    "tail_records",
]

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
TAIL_BYTES = 64 << 10  # how far back from the end ``tail_records`` and ``last_step`` read


class RunLogError(DyntrainError):
    """A line of a run's line file is not a valid row; the message names the file and line."""


# ---- writing -------------------------------------------------------------------------------


class RowWriter:
    """Appends rows of one kind to a run folder's line file (made by ``open_metrics`` or
    ``open_events``)."""

    def __init__(self, lines: linefile.LineWriter, kind: type[Row], urgent: bool) -> None:
        self.lines, self.kind, self.urgent = lines, kind, urgent

    def write(self, row: Row | Mapping[str, Any]) -> None:
        """Append ``row`` (a JSON object is checked against the row type first: what is
        written is what every reader accepts; ``RowError`` when it is not)."""
        self.lines.write(encode(as_row(row, self.kind)), urgent=self.urgent)

    def close(self) -> None:
        """Write out what is still buffered (an object store's lines)."""
        self.lines.close()


def open_metrics(store: RunStore, on_error: Callable[[str], None] | None = None) -> RowWriter:
    """The writer of ``store``'s ``metrics.jsonl`` (uploaded every few seconds on an object
    store).

    Args:
        store: the run folder.
        on_error: told (one line) when an object store refuses the lines for a while.
    """
    return RowWriter(linefile.open_lines(store, METRICS_FILE, on_error=on_error), MetricsRow,
                     urgent=False)


def open_events(store: RunStore, on_error: Callable[[str], None] | None = None) -> RowWriter:
    """The writer of ``store``'s ``events.jsonl`` (each row uploaded at once).

    Args: as ``open_metrics``'s.
    """
    return RowWriter(linefile.open_lines(store, EVENTS_FILE, on_error=on_error), EventRow,
                     urgent=True)


# ---- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFile:
    """One line file of a run folder, and how messages name it.

    Args:
        store: the run folder.
        name: the line file in it.
        shown: how messages name the file (its path or URL).
    """

    store: RunStore
    name: str = METRICS_FILE
    shown: str = ""

    def __post_init__(self) -> None:
        if not self.shown:
            object.__setattr__(self, "shown", self.store.where(self.name))

    def exists(self) -> bool:
        """Whether the file (or a segment of it) is there."""
        return bool(linefile.pieces(self.store, self.name))


def run_file(location: RunStore | RunFile | str | os.PathLike, name: str = METRICS_FILE
             ) -> RunFile:
    """The line file ``name`` of a run folder; ``location`` is a run store, a run folder (a
    path or a URL), or a line file's own path or URL (one ending in ``.jsonl``: ``name`` is
    then ignored)."""
    if isinstance(location, RunFile):
        return location
    if isinstance(location, RunStore):
        return RunFile(location, name)
    text = os.fspath(location)
    if text.rstrip("/").endswith(".jsonl"):
        if is_url(text):
            folder, _, base = text.rstrip("/").rpartition("/")
            return RunFile(open_store(folder), base, text.rstrip("/"))
        path = Path(text)
        return RunFile(LocalStore(path.parent), path.name, text)
    return RunFile(open_store(text), name)


@dataclass(frozen=True)
class Record:
    """One line's JSON object and the line it was on (counted from 1; 0 when the read did not
    start at the beginning of the file)."""

    line: int
    data: dict[str, Any]


@dataclass(frozen=True)
class Records:
    """What one read found: the JSON objects, and the byte offset after the last line read
    (where the next read of a growing file starts)."""

    records: list[Record]
    end: int


def read_records(location: RunStore | RunFile | str | os.PathLike, name: str = METRICS_FILE,
                 *, offset: int = 0, max_bytes: int | None = None,
                 on_bad: Callable[[RunLogError], None] | None = None) -> Records:
    """The JSON objects of a line file from byte ``offset`` on (at most about ``max_bytes``),
    read as the module docstring says.

    Args:
        location: as ``run_file``'s.
        name: as ``run_file``'s.
        offset: where to start (a previous read's ``end``).
        max_bytes: read at most this much (None: to the end).
        on_bad: told about each line that is not a JSON object (which is then skipped);
            None: such a line raises ``RunLogError``.
    """
    file = run_file(location, name)
    data = linefile.read_bytes(file.store, file.name, offset, max_bytes)
    return _parse(file, data, offset, max_bytes is None, on_bad)


def _parse(file: RunFile, data: bytes, offset: int, to_the_end: bool,
           on_bad: Callable[[RunLogError], None] | None) -> Records:
    """The records in ``data``, bytes ``offset`` on of ``file`` (``to_the_end``: up to its end,
    so an unterminated last line is either whole or still being written)."""
    whole = data.rfind(b"\n") + 1
    pieces = data[:whole].split(b"\n")[:-1] if whole else []
    tail = data[whole:]
    out, at = [], offset
    for number, raw in enumerate(pieces, 1):
        where = _where(file, number, offset, at)
        at += len(raw) + 1
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError as exc:
            _bad(RunLogError(f"{where}: invalid JSON: {getattr(exc, 'msg', exc)}"), on_bad)
            continue
        if not isinstance(value, dict):
            _bad(RunLogError(f"{where}: not a JSON object: {raw[:60].decode(errors='replace')}"),
                 on_bad)
            continue
        out.append(Record(number if offset == 0 else 0, value))
    end = offset + whole
    if tail.strip() and to_the_end:
        try:
            value = json.loads(tail)
        except ValueError:
            value = None  # a line still being written
        if isinstance(value, dict):
            out.append(Record(len(pieces) + 1 if offset == 0 else 0, value))
            end += len(tail)
    return Records(out, end)


def _where(file: RunFile, number: int, offset: int, at: int) -> str:
    return f"{file.shown}:{number}" if offset == 0 else f"{file.shown} (the line at byte {at})"


def _bad(error: RunLogError, on_bad: Callable[[RunLogError], None] | None) -> None:
    if on_bad is None:
        raise error
    on_bad(error)


def rows_of(records: Iterable[Record], kind: type[Row], file: RunFile,
            on_bad: Callable[[RunLogError], None] | None = None) -> list[Row]:
    """Typed rows of ``records``; a record that is not a valid ``kind`` raises
    ``RunLogError`` naming its line (or is told to ``on_bad`` and skipped)."""
    out = []
    for r in records:
        try:
            out.append(kind.from_json(r.data))
        except RowError as exc:
            where = f"{file.shown}:{r.line}" if r.line else file.shown
            _bad(RunLogError(f"{where}: {exc}"), on_bad)
    return out


def read_metrics(location: RunStore | RunFile | str | os.PathLike, *,
                 on_bad: Callable[[RunLogError], None] | None = None) -> list[MetricsRow]:
    """Every row of a run's ``metrics.jsonl``, in order (none when there is no such file).

    Args:
        location: a run store, a run folder (path or URL), or the file's own path or URL.
        on_bad: as ``read_records``'s (a line that is not a valid row too).
    """
    file = run_file(location, METRICS_FILE)
    return rows_of(read_records(file, on_bad=on_bad).records, MetricsRow, file, on_bad)


def read_events(location: RunStore | RunFile | str | os.PathLike, *,
                on_bad: Callable[[RunLogError], None] | None = None) -> list[EventRow]:
    """Every row of a run's ``events.jsonl``, in order (none when there is no such file).

    Args: as ``read_metrics``'s.
    """
    file = run_file(location, EVENTS_FILE)
    return rows_of(read_records(file, on_bad=on_bad).records, EventRow, file, on_bad)


def tail_records(location: RunStore | RunFile | str | os.PathLike, n: int,
                 name: str = METRICS_FILE, window: int = TAIL_BYTES,
                 on_bad: Callable[[RunLogError], None] | None = None) -> list[Record]:
    """The last ``n`` records of a line file (fewer when it is short or absent), read from its
    last ``window`` bytes.

    Args:
        location: as ``run_file``'s.
        n: how many.
        name: as ``run_file``'s.
        window: how many bytes from the end to look at.
        on_bad: as ``read_records``'s.
    """
    file = run_file(location, name)
    start = max(0, linefile.size(file.store, file.name) - window)
    # from the byte before the window: the first line read is whole if that byte is a newline
    data = linefile.read_bytes(file.store, file.name, max(0, start - 1))
    if start > 0:
        cut = data.find(b"\n") + 1
        data, start = (data[cut:], start + cut - 1) if cut else (b"", start + len(data) - 1)
    found = _parse(file, data, start, True, on_bad).records
    return found[-n:] if n > 0 else []


def last_step(location: RunStore | RunFile | str | os.PathLike) -> int:
    """The step of the last row of a run's ``metrics.jsonl`` (0 when there is none, or when
    the run folder cannot be read now); lines that are not rows are passed over."""
    try:
        records = tail_records(location, 1 << 30, on_bad=lambda _: None)
    except (OSError, StorageError):
        return 0
    for record in reversed(records):
        step = record.data.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return 0
