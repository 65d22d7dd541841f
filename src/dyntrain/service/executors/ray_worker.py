"""A worker as the Ray executor tracks it, and copying its output from its actor to this host."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dyntrain.service.core.executor import WorkerExit, WorkerHandle, WorkerSpec

LOG_CHUNK = 1 << 20
CALL_S = 30.0  # bound on one call that the service waits for


@dataclass
class RayWorker:
    """One worker: its actor, its node, its outstanding calls and how far its output was copied."""

    spec: WorkerSpec
    handle: WorkerHandle
    actor: object
    node: str | None
    mirrored: int = 0  # bytes of its output already copied to spec.log_path
    waiting: object | None = None  # the outstanding wait_exit call
    retry_at: float = 0.0  # when to ask again after the actor was unavailable
    starting: object | None = None  # the outstanding start call
    start_by: float = 0.0  # when a worker no node took is given up
    exit: WorkerExit | None = None  # known, output copied, not reported yet
    report_at: float = 0.0  # not reported before (monotonic): a lost worker's fence


def mirror_output(ray, workers: list[RayWorker], drain: bool = False) -> None:
    """Copy new output of ``workers`` from their actors into their log files on this host (all of
    it with ``drain``); ``ray``: the ``ray`` module."""
    while workers:
        refs = [w.actor.read_log.remote(w.mirrored, LOG_CHUNK) for w in workers]
        ray.wait(refs, num_returns=len(refs), timeout=CALL_S if drain else 2.0)
        more = []
        for w, ref in zip(workers, refs, strict=True):
            try:
                data = ray.get(ref, timeout=0)
            except Exception:
                continue  # unreachable now: the next round (or its exit) tells
            if data:
                path = Path(w.spec.log_path)
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "ab") as f:
                    f.write(data)
                w.mirrored += len(data)
            if drain and len(data) == LOG_CHUNK:
                more.append(w)
        workers = more


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
