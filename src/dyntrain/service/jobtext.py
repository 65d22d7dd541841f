"""How a job record (the API's JSON) reads in one line: its attempts and its elastic progress.

Shared by the CLI (``dyntrain status``, ``logs -f``, ``submit --wait``) and the dashboard.
"""

from __future__ import annotations

from typing import Any


def attempts_text(job: dict[str, Any]) -> str:
    """A job record's (the API's JSON) counted attempts of the allowed ones, as the CLI and the
    dashboard show them: a running job is in its next one, "2 of 3 (running)"."""
    used = int(job.get("attempts") or 0)
    allowed = (job.get("retry_strategy") or {}).get("attempts")
    of = f" of {allowed}" if allowed else ""
    if job.get("status") in ("STARTING", "RUNNING") and not job.get("array"):
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
