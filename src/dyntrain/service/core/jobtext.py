"""How a job record (the API's JSON) reads in one line: its attempts, its elastic progress,
its workers and its result; and an error message in one line (``one_line``).

Shared by the CLI (``dyntrain status``, ``logs``, ``submit --wait``), the API, the dashboard and
the demo.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from dyntrain.service.core.model import JobStatus, WorkerState

_WORKER = re.compile(r"^.+-(a\d+-w\d+)$")  # <job id>-a<attempt>-w<number>, as the service names


def attempts_text(job: dict[str, Any]) -> str:
    """A job record's (the API's JSON) counted attempts of the allowed ones, as the CLI and the
    dashboard show them: a running job is in its next one, "2 of 3 (running)"."""
    used = int(job.get("attempts") or 0)
    allowed = (job.get("retry_strategy") or {}).get("attempts")
    of = f" of {allowed}" if allowed else ""
    if job.get("status") in (JobStatus.STARTING, JobStatus.RUNNING) and not job.get("array"):
        return f"{used + 1}{of} (running)"
    return f"{used}{of}"


def progress_text(progress: dict[str, Any] | None) -> str:
    """``step 120/600  epoch 3  world 2  loss 0.4321  812.3 samples/s``; '' without a step."""
    if not isinstance(progress, dict) or progress.get("step") is None:
        return ""
    total = progress.get("total_steps")
    parts = [f"step {progress['step']}" + (f"/{total}" if total else "")]
    if progress.get("epoch") is not None:
        parts.append(f"epoch {progress['epoch']}")
    if progress.get("world_size") is not None:
        parts.append(f"world {progress['world_size']}")
    if isinstance(progress.get("loss"), (int, float)):
        parts.append(f"loss {progress['loss']:.4f}")
    if isinstance(progress.get("samples_per_s"), (int, float)):
        parts.append(f"{progress['samples_per_s']:.1f} samples/s")
    return "  ".join(parts)


def short_worker(worker_id: str) -> str:
    """A service worker's id without its job's: ``a1-w2`` (attempt 1, worker 2); any other
    worker id (one that joined with ``dyntrain worker``) as it is."""
    m = _WORKER.match(worker_id)
    return m.group(1) if m else worker_id


def live_workers(job: dict[str, Any]) -> dict[str, int]:
    """Workers per compute environment of a job record, those told to leave left out: the
    members it trains with (or will), not the ones on their way out."""
    out: dict[str, int] = {}
    for w in job.get("workers") or ():
        if isinstance(w, dict) and w.get("state") == WorkerState.RUNNING:
            env = str(w.get("compute_environment"))
            out[env] = out.get(env, 0) + 1
    return out


def result_text(result: dict[str, Any] | None) -> str:
    """What ``trainer.report()`` said, ``val_accuracy=0.97, steps=300``; '' without one."""
    if not isinstance(result, dict) or not result:
        return ""
    return ", ".join(f"{k}={v}" for k, v in result.items())


def attempt_text(attempt: dict[str, Any]) -> str:
    """One attempt of a job's ``attempt_history``: ``attempt 2: started 2026-05-01 12:00:01,
    ran 64 s, exit code 1: <why it ended>``; one that runs says so."""
    start, stop = attempt.get("started_at"), attempt.get("stopped_at")
    head = f"attempt {attempt.get('attempt')}: started {_clock(start)}"
    if stop is None:
        return f"{head}, running"
    ran = f", ran {stop - start:.0f} s" if isinstance(start, (int, float)) else ""
    code = attempt.get("exit_code")
    ended = f", exit code {code}" if code is not None else ""
    why = attempt.get("reason")
    if why == f"exit code {code}":  # a success says no more than its code
        why = None
    return f"{head}{ran}{ended}" + (f": {why}" if why else "")


def _clock(ts: Any) -> str:
    try:
        return datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OSError, OverflowError):
        return "?"


def one_line(text: Any) -> str:
    """Collapse whitespace (newlines included) so a message always fits on one line ("error"
    when there is none): how the API and the dashboard word an error."""
    return " ".join(str(text).split()) or "error"
