"""The executor interface: how the service starts, signals and watches the worker processes of jobs.

An executor owns a pool of resources (``capacity()``) and runs workers in it. The controller only
ever talks to this interface, so a cluster engine (Ray, Kubernetes) is one more subclass, which
the service's assembly (``dyntrain.service.assembly``) builds; nothing in the scheduler changes.

Contract, for every implementation:

* ``start(spec)`` either returns a handle of a running worker or raises ``ExecutorError`` with a
  one-line message (does not fit; ``StartError`` when the command itself cannot be executed); it
  never leaves a half-started worker behind.
* ``poll()`` returns the workers that ended since the last call; each one is reported exactly once,
  and its resources are free again once it is reported.
* Workers outlive the service. After a restart a new executor ``adopt()``-s the stored handles;
  a worker that ended while nobody watched is still reported once by ``poll()``.
"""

from __future__ import annotations

import re
import signal as _signal
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from dyntrain.elastic.numerics import KernelLevel, host_levels
from dyntrain.errors import DyntrainError
from dyntrain.service.core.model import Resources

SIGNALS = ("TERM", "KILL")
_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


class ExecutorError(DyntrainError):
    """A worker cannot be started, found or signalled; the message is one line."""


class StartError(ExecutorError):
    """The worker's command cannot be executed: not found, not executable, argument list too
    long, no such working directory. The job's fault, not the capacity's: the attempt fails."""


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process of one attempt of a job."""

    job_id: str
    attempt: int
    worker_id: str  # unique over all jobs and attempts, e.g. "<job>-a1-w3"
    argv: list[str]
    env: dict[str, str]  # added to (and overriding) the executor's base environment
    resources: Resources  # what this one worker needs
    cwd: str | None
    log_path: str  # stdout and stderr of the worker go here (appended)
    environment: str | None = None  # the compute environment it was placed in
    #: a torchrun gang's or multi-node job's first worker: the host it runs on is the main
    #: node, whose address an executor with several hosts puts in the main-node variables
    #: (executors/main_node.py); None for every other job
    main_worker: str | None = None
    #: the CPU kernel level the job pins its workers to: a host that cannot run it refuses the
    #: start (``StartError``); None: not pinned (a job that chose its own kernel variables)
    cpu_kernels: KernelLevel | None = None


@dataclass(frozen=True)
class WorkerHandle:
    """What the service stores about a started worker, to find it again after a restart."""

    worker_id: str
    executor: str  # the executor's name
    ref: str  # opaque to everyone but the executor (local: "<pid>:<start time>")
    gpus: tuple[int, ...] = ()  # device indices assigned to the worker

    def to_dict(self) -> dict:
        return {"worker_id": self.worker_id, "executor": self.executor, "ref": self.ref,
                "gpus": list(self.gpus)}

    @classmethod
    def from_dict(cls, d: dict) -> WorkerHandle:
        return cls(worker_id=d["worker_id"], executor=d["executor"], ref=d["ref"],
                   gpus=tuple(int(g) for g in d.get("gpus", ())))


@dataclass(frozen=True)
class WorkerExit:
    """How a worker ended. ``exit_code`` is None when it was killed by a signal or is unknown;
    ``ended_at`` (epoch seconds) when the executor knows it, e.g. for an exit nobody watched."""

    worker_id: str
    exit_code: int | None
    signal: int | None
    reason: str
    ended_at: float | None = None
    lost: bool = False  # capacity taken away (its node is gone), not the worker's doing


def make_resources(cpus: float, gpus: int, memory_mib: int) -> Resources:
    """A ``Resources`` without the positivity check, so that "nothing left" is representable."""
    r = object.__new__(Resources)
    object.__setattr__(r, "cpus", cpus)
    object.__setattr__(r, "gpus", gpus)
    object.__setattr__(r, "memory_mib", memory_mib)
    return r


def describe(r: Resources) -> str:
    """``cpus=4 gpus=0 memory=2048 MiB``"""
    cpus = int(r.cpus) if float(r.cpus).is_integer() else round(r.cpus, 3)
    return f"cpus={cpus} gpus={r.gpus} memory={r.memory_mib} MiB"


def _signal_name(n: int) -> str:
    try:
        return _signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def exit_from_record(worker_id: str, record: dict | None) -> WorkerExit | None:
    """The exit a status file records, None when it records none (yet)."""
    if record is None or ("exit_code" not in record and "signal" not in record):
        return None
    sig, code, ended = record.get("signal"), record.get("exit_code"), record.get("ended_at")
    if sig is not None:
        return WorkerExit(worker_id, None, int(sig), f"killed by {_signal_name(int(sig))}", ended)
    code = None if code is None else int(code)
    return WorkerExit(worker_id, code, None, f"exited with code {code}", ended)


def check_worker_id(wid: str) -> None:
    if not isinstance(wid, str) or not _WORKER_ID.match(wid):
        raise ExecutorError(f"worker id {wid!r} must be 1-200 letters, digits, '.', '-' or '_' "
                            "and start with a letter or digit")



class Executor(ABC):
    """Starts, signals and watches worker processes within a fixed capacity."""

    name: str
    #: where job coordinators listen so that this executor's workers reach them
    coordinator_host: str = "127.0.0.1"

    @abstractmethod
    def capacity(self) -> Resources:
        """Everything this executor may hand out."""

    @abstractmethod
    def free(self) -> Resources:
        """What is not held by a worker that has not been reported by ``poll()`` yet."""

    @abstractmethod
    def start(self, spec: WorkerSpec) -> WorkerHandle:
        """Start a worker; raise ``ExecutorError`` if it does not fit or cannot start."""

    def start_many(self, specs: list[WorkerSpec]) -> list[WorkerHandle | ExecutorError]:
        """Start several workers: for each, its handle or the ``ExecutorError`` that kept it
        from starting. An executor may start them together, faster than one by one."""
        out: list[WorkerHandle | ExecutorError] = []
        for spec in specs:
            try:
                out.append(self.start(spec))
            except ExecutorError as e:
                out.append(e)
        return out

    def send_starts(self, specs: list[WorkerSpec]) -> None:
        """Start several workers without waiting for them to run; ``started()`` hands over each
        one's handle or error once known. This default starts them at once (``start_many``)."""
        sent = self.__dict__.setdefault("_sent", {})
        sent.update(zip((s.worker_id for s in specs), self.start_many(specs), strict=True))

    def started(self) -> dict[str, WorkerHandle | ExecutorError]:
        """Worker id -> handle or error of the workers sent by ``send_starts`` whose start is
        known by now (each handed over once). Until then, ``poll()`` reports none of their
        exits and ``signal()`` is applied once they run."""
        return self.__dict__.pop("_sent", {})

    @abstractmethod
    def signal(self, worker_id: str, sig: str) -> None:
        """Send ``"TERM"`` or ``"KILL"`` to all processes of the worker. No-op once it ended."""

    @abstractmethod
    def poll(self) -> list[WorkerExit]:
        """Workers that ended since the last call, each exactly once; their resources are freed."""

    @abstractmethod
    def alive(self, worker_id: str) -> bool:
        """Whether the worker is known to this executor and still running."""

    @abstractmethod
    def adopt(self, handle: WorkerHandle, spec: WorkerSpec) -> bool:
        """Re-attach to a worker started by an earlier incarnation of the service.

        True: it runs and is watched (and accounted) from now on. False: it is gone; ``poll()``
        will still report its exit once (from what the worker left behind, else as unknown).
        """

    def find(self, worker_id: str) -> WorkerHandle | None:
        """The handle of a worker started under ``worker_id`` whose handle the service did not
        get to store (it died between ``start()`` and the write), or None when no worker was
        started under that id. An executor that cannot tell raises ``ExecutorError``."""
        raise ExecutorError(f"executor {self.name!r} cannot find worker {worker_id} by its id")

    def kernel_levels(self) -> tuple[KernelLevel, ...]:
        """The CPU kernel levels this executor's hosts run, lowest first: a job pinned to
        another is refused at submit (each worker's start is checked on its own host too).
        This default is what an executor that cannot ask its hosts knows: the levels of the
        host the service runs on."""
        return tuple(host_levels())

    def slots(self, environments: dict[str, Resources]) -> dict[str, int] | None:
        """Slots each compute environment (name -> the resources of one slot) offers now, when
        this executor's capacity decides them (a cluster whose nodes come and go); None when
        environments are sized by their own specs."""
        return None

    def release(self, worker_ids: list[str]) -> None:
        """The service has stored these workers' exits: drop what was kept to report them."""
        return None

    def sweep(self) -> list[str]:
        """After a restart adopted every worker a record owns: end the workers this executor
        still runs that nobody adopted; returns their ids."""
        return []

    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds; an executor may return early once a worker exited."""
        time.sleep(timeout)

    @abstractmethod
    def shutdown(self) -> None:
        """Stop watching. Workers keep running, so that a later executor can adopt them."""

    def hand_over(self) -> None:
        """Stop watching for the executor that this process builds next (a service replica's
        next term): as ``shutdown``, but what that one can share (a cluster connection) is
        kept, and nothing here needs the workers' machines to answer."""
        self.shutdown()
