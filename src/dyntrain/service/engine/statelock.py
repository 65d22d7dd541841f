"""One service per state directory: an exclusive lock that names who holds it.

Two services over one state directory would both start the same workers' successors, host two
coordinators for one job and write the same run folders. The lock is ``fcntl.flock`` on
``STATE_DIR/service.lock``: the kernel drops it when the process ends however it ends, so a
crashed service never leaves a stale lock behind. Its file says who holds it (pid and URL) so
that the refusal can name the running service. The file descriptor is not inherited by the
processes the service starts (Python's default), so workers that outlive it do not hold it.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from dyntrain.errors import DyntrainError

LOCK_FILE = "service.lock"


class StateDirLocked(DyntrainError):
    """Another service runs on this state directory."""


class StateDirLock:
    """The lock of one state directory, held from ``acquire`` to ``release``.

    Args:
        state_dir: the service's state directory (created if missing).
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, url: str | None = None) -> None:
        """Take the lock or raise ``StateDirLocked`` naming the service that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(fd)
            os.close(fd)
            raise StateDirLocked(
                f"another dyntrain service ({holder}) runs on the state directory "
                f"{self.path.parent}: stop it first, or give this one another --state-dir"
            ) from None
        self._fd = fd
        self.record(url)

    def record(self, url: str | None) -> None:
        """Write who holds the lock: this process and the URL it serves (once known)."""
        if self._fd is None:
            raise DyntrainError(f"{self.path}: the lock is not held")
        data = json.dumps({"pid": os.getpid(), "url": url}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.ftruncate(fd, 0)
            os.close(fd)  # closing drops the lock


def _describe(fd: int) -> str:
    """``pid 1234, http://127.0.0.1:8642`` from a held lock's file (what it says, if readable)."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        record = {}
    pid, url = record.get("pid"), record.get("url")
    parts = [f"pid {pid}" if pid else "", str(url) if url else ""]
    return ", ".join(p for p in parts if p) or "its pid unknown"
