"""Copying the workers' log files into the store, a few complete lines at a time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dyntrain.service.store import Store


@dataclass
class LogTail:
    """The part of one worker's log file not yet copied into the store."""

    path: Path
    job_id: str
    attempt_no: int
    offset: int = 0
    exited: bool = False
    drained: bool = True  # the last read left nothing behind

    def read_lines(self) -> list[str]:
        """The complete new lines (advancing past them); a partial last line waits."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            data = b""
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        self.drained = len(complete) == len(data)
        if not complete:
            return []
        return [x.decode(errors="replace") for x in complete[:-1].split(b"\n")]


class LogPump:
    """Follows each live worker's log file and copies its new lines into the store.

    Args:
        store: where the lines go (``Store.append_log``).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tails: dict[str, LogTail] = {}

    def follow(self, worker_id: str, path: Path, job_id: str, attempt_no: int,
               offset: int = 0) -> None:
        """Copy ``worker_id``'s log from byte ``offset`` on."""
        self._tails[worker_id] = LogTail(path, job_id, attempt_no, offset)

    def exited(self, worker_id: str) -> None:
        """The worker is gone: its log is followed until it is drained, then dropped."""
        tail = self._tails.get(worker_id)
        if tail is not None:
            tail.exited = True

    def pump(self) -> None:
        """Copy complete new lines of each followed log into the store, in one transaction."""
        with self.store.batch():
            for wid, tail in list(self._tails.items()):
                lines = tail.read_lines()
                if lines:
                    self.store.logs.append_log(tail.job_id, tail.attempt_no, wid, lines)
                if tail.exited and tail.drained:
                    del self._tails[wid]


def after_lines(path: Path, n: int) -> int:
    """The byte offset just past the first ``n`` lines of a log file (its size if shorter)."""
    offset = 0
    try:
        with open(path, "rb") as f:
            for _ in range(n):
                line = f.readline()
                if not line.endswith(b"\n"):
                    break
                offset += len(line)
    except OSError:
        pass
    return offset
