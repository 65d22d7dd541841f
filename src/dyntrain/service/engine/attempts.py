"""What the controller keeps in memory about each running attempt, and its workers' log tails."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dyntrain.service.core.executor import WorkerExit
from dyntrain.service.store import WORKER_RUNNING, Job, WorkerRecord

if TYPE_CHECKING:  # torch: imported only once an elastic job runs
    from dyntrain.service.engine.elastic_host import ElasticHost


@dataclass
class Attempt:
    """A job's running attempt: its workers that have not exited, and how it is to end."""

    job_id: str
    number: int
    started_at: float
    host: ElasticHost | None = None
    stop_reason: str | None = None  # why every worker was told to leave
    preempted: bool = False
    timed_out: float | None = None
    terminated: str | None = None  # why the user terminated it
    last_exit: WorkerExit | None = None
    main_exit: WorkerExit | None = None  # a multi-node job's node 0: its exit decides
    workers_started: int = 0
    wasted: dict[str, float] = field(default_factory=dict)  # worker -> seconds thrown away
    priced_events: int = 0  # membership events already looked at for crash waste
    job: Job | None = None  # the job as it was when the attempt started
    workers: dict[str, WorkerRecord] = field(default_factory=dict)  # not exited, by start
    running_seen: bool = False  # an elastic job's first generation was reported running
    shrunk: int = 0  # workers told to leave by a shrink: preemptions, as a user counts them
    first_error: str | None = None  # the first failing worker's error line, from its log
    failed_untrained: int = 0  # an elastic job's workers failed before its first generation

    def running(self) -> list[WorkerRecord]:
        """Workers not told to leave, oldest first."""
        return [w for w in self.workers.values() if w.state == WORKER_RUNNING]


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


def terminating(reason: str) -> str:
    """The status reason of a job whose workers were told to stop by a terminate."""
    return f"terminating ({reason}): its workers were told to stop"


def worker_id(job_id: str, attempt: int, index: int) -> str:
    return f"{job_id.replace(':', '_')}-a{attempt}-w{index}"


def worker_index(wid: str) -> int:
    """The start order of a worker in its attempt (a multi-node job's node index)."""
    return int(wid.rsplit("-w", 1)[1])
