"""Line files of a run folder (``metrics.jsonl``, ``events.jsonl``): appended as the run goes,
read back in order, on a local disk or an object store.

Locally a line file is one file, appended to and flushed line by line, as always. An object
store cannot append, and rewriting one ever-growing object would cost more with every line, so
there a line file ``NAME`` is a folder of numbered segments, ``NAME.d/00000001.jsonl``, ... A
writer buffers its lines and, from a thread of its own, rewrites its current segment whole
every ``flush_seconds`` (at once for an urgent line), so the run never waits on the network;
a segment that reaches ``segment_bytes`` is left as it is and the next one begins. A new writer
(a resumed run) starts a segment after the last one. Readers concatenate ``NAME`` (if there is
one) and then the segments in number order; every segment holds whole lines only.

What is lost when the writing process is killed: the lines of the last ``flush_seconds``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

from dyntrain.elastic.runs.storage import RunStore

log = logging.getLogger("dyntrain.linelog")

FLUSH_SECONDS = 2.0
SEGMENT_BYTES = 256 << 10
_SEGMENT_RE = re.compile(r"(\d{8,})\.jsonl")


def segment_folder(name: str) -> str:
    return f"{name}.d"


def open_lines(store: RunStore, name: str, *, flush_seconds: float = FLUSH_SECONDS,
               segment_bytes: int = SEGMENT_BYTES,
               on_error: Callable[[str], None] | None = None) -> LineWriter:
    """A writer that appends lines to the line file ``name`` of ``store``.

    Args:
        store: the run folder.
        name: the line file (``metrics.jsonl``).
        flush_seconds: on an object store, how often buffered lines are uploaded.
        segment_bytes: on an object store, the size at which a segment is closed.
        on_error: told (one line) when an upload fails; the lines are kept and tried again.
    """
    if store.local is not None:
        return LineWriter(store, name)
    return SegmentWriter(store, name, flush_seconds, segment_bytes,
                         on_error or (lambda line: log.warning("%s", line)))


class LineWriter:
    """Appends to one local file, flushed after every line.

    Args:
        store: a local run folder.
        name: the line file in it.
    """

    def __init__(self, store: RunStore, name: str) -> None:
        self.store, self.name = store, name
        self._file = None

    def write(self, line: str, urgent: bool = False) -> None:
        """Append ``line`` (without its newline)."""
        if self._file is None:
            path = self.store.local / self.name
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a")
        self._file.write(line + "\n")
        self._file.flush()

    def flush(self) -> None:
        """Make every line written so far readable by others."""

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class SegmentWriter(LineWriter):
    """Appends to numbered segments on an object store, uploaded from a thread of its own.

    Args: as ``open_lines``'s.
    """

    def __init__(self, store: RunStore, name: str, flush_seconds: float, segment_bytes: int,
                 on_error: Callable[[str], None]) -> None:
        super().__init__(store, name)
        self.flush_seconds, self.segment_bytes, self.on_error = (flush_seconds, segment_bytes,
                                                                 on_error)
        self._base: int | None = None  # segments already there (listed at the first upload)
        self._seq = 1  # this writer's current segment, counted from 1 after the base
        self._open: dict[int, list[str]] = {self._seq: []}  # segments not all uploaded yet
        self._size = 0
        self._dirty: set[int] = set()
        self._lock = threading.Lock()  # the buffers
        self._upload_lock = threading.Lock()  # one upload at a time, in order
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False

    def write(self, line: str, urgent: bool = False) -> None:
        with self._lock:
            self._open[self._seq].append(line + "\n")
            self._dirty.add(self._seq)
            self._size += len(line) + 1
            if self._size >= self.segment_bytes:
                self._seq += 1
                self._open[self._seq], self._size = [], 0
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"dyntrain-lines-{self.name}")
                self._thread.start()
        if urgent:
            self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            if not self._stop.is_set():
                self.flush()

    def flush(self, last: bool = False) -> None:
        with self._upload_lock:
            with self._lock:
                todo = {s: "".join(self._open[s]) for s in sorted(self._dirty)}
                self._dirty.clear()
            for seq, text in todo.items():
                try:
                    if self._base is None:
                        self._base = max(_segments(self.store, self.name), default=0)
                    self.store.put(_segment_name(self.name, self._base + seq), text.encode())
                except Exception as exc:  # kept, and tried again at the next flush
                    with self._lock:
                        self._dirty.update(s for s in todo if s >= seq)
                    if last:
                        self.on_error(f"the last lines of {self.name} are not written: {exc}")
                    elif not self._failed:
                        self.on_error(f"cannot write {self.name} now (tried again every "
                                      f"{self.flush_seconds:g} s): {exc}")
                    self._failed = True
                    return
                with self._lock:
                    if seq != self._seq and seq not in self._dirty:
                        del self._open[seq]
            if self._failed and todo:
                self.on_error(f"{self.name} is written again")
                self._failed = False

    def close(self) -> None:
        """Upload what is left; a failure is told to ``on_error``."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.flush(last=True)


def _segment_name(name: str, seq: int) -> str:
    return f"{segment_folder(name)}/{seq:08d}.jsonl"


def _segments(store: RunStore, name: str) -> list[int]:
    folder = segment_folder(name)
    return sorted(int(m.group(1)) for n in store.list(folder)
                  if (m := _SEGMENT_RE.fullmatch(n.rpartition("/")[2])))


def pieces(store: RunStore, name: str) -> list[tuple[str, int]]:
    """The files that make up line file ``name``, in reading order, with their sizes."""
    folder = name.rpartition("/")[0]
    out = []
    if store.local is not None:
        try:
            out.append((name, (store.local / name).stat().st_size))
        except FileNotFoundError:
            pass
    else:
        size = store.list(folder).get(name)
        if size is not None:
            out.append((name, size))
    listing = store.list(segment_folder(name))
    by_number = sorted((int(m.group(1)), n, size) for n, size in listing.items()
                       if (m := _SEGMENT_RE.fullmatch(n.rpartition("/")[2])))
    return out + [(n, size) for _, n, size in by_number]


def read_bytes(store: RunStore, name: str, offset: int = 0, max_bytes: int | None = None
               ) -> bytes:
    """Bytes ``offset`` on (at most ``max_bytes``) of line file ``name``, read across its
    pieces as if they were one file; empty when there is none."""
    out, at = [], 0
    left = max_bytes
    for piece, size in pieces(store, name):
        if left is not None and left <= 0:
            break
        if at + size > offset:
            start = max(0, offset - at)
            end = size if left is None else min(size, start + left)
            try:
                data = store.get(piece, start, end)
            except FileNotFoundError:
                break  # replaced meanwhile: the next read picks it up
            out.append(data)
            if left is not None:
                left -= len(data)
        at += size
    return b"".join(out)


def size(store: RunStore, name: str) -> int:
    """How many bytes line file ``name`` holds now."""
    return sum(s for _, s in pieces(store, name))


def read_lines(store: RunStore, name: str) -> list[str]:
    """Every whole line of line file ``name``, in order (none when there is no such file)."""
    data = read_bytes(store, name)
    return data[: data.rfind(b"\n") + 1].decode(errors="replace").splitlines()
