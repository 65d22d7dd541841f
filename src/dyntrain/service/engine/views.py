"""Store records as JSON-ready dicts (enums as their values, times as epoch seconds)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from dyntrain.service.core.cost import JobCost
from dyntrain.service.core.fit import machine_note
from dyntrain.service.core.model import JobStatus, Resources, RetryStrategy
from dyntrain.service.core.plan import WaitInfo
from dyntrain.service.core.records import (
    AttemptRecord,
    ComputeEnvironment,
    Event,
    Job,
    JobDefinition,
    JobQueue,
    LogLine,
    WorkerRecord,
)


def resources(r: Resources) -> dict[str, Any]:
    return {"cpus": r.cpus, "gpus": r.gpus, "memory_mib": r.memory_mib}


def retry_strategy(r: RetryStrategy) -> dict[str, Any]:
    return {"attempts": r.attempts,
            "evaluate_on_exit": [{"action": rule.action.value, "on_exit_code": rule.on_exit_code,
                                  "on_reason": rule.on_reason} for rule in r.evaluate_on_exit]}


def compute_environment(ce: ComputeEnvironment, available: dict[str, int],
                        in_use: Counter, traces: dict[str, tuple[str, float, bool]],
                        machine: Resources | None = None) -> dict[str, Any]:
    """``machine``: the one machine all its slots share (the local executor's), if so."""
    s = ce.spec
    trace = traces.get(ce.name)
    return {
        "name": s.name, "capacity_type": s.capacity_type.value,
        "price_per_slot_hour": s.price_per_slot_hour, "slot": resources(s.slot),
        "min_slots": s.min_slots, "desired_slots": s.desired_slots, "max_slots": s.max_slots,
        "state": s.state.value, "status": ce.status.value, "status_reason": ce.status_reason,
        "available_slots": available.get(ce.name, 0), "slots_in_use": in_use.get(ce.name, 0),
        "machine_note": None if machine is None else machine_note(s, machine),
        "trace": None if trace is None else {"csv": trace[0], "started_at": trace[1],
                                             "loop": trace[2]},
        "created_at": ce.created_at, "updated_at": ce.updated_at,
    }


def job_queue(q: JobQueue) -> dict[str, Any]:
    return {"name": q.name, "priority": q.spec.priority,
            "compute_environments": list(q.spec.compute_environments),
            "state": q.spec.state.value, "scheduling_policy": q.spec.scheduling_policy,
            "preempt_plain_jobs": q.spec.preempt_plain_jobs,
            "created_at": q.created_at, "updated_at": q.updated_at}


def job_definition(d: JobDefinition) -> dict[str, Any]:
    s = d.spec
    return {
        "name": s.name, "revision": d.revision, "ref": d.ref, "status": d.status,
        "command": list(s.command), "environment": dict(s.environment),
        "parameters": dict(s.parameters), "resources": resources(s.resources),
        "retry_strategy": retry_strategy(s.retry_strategy), "timeout_seconds": s.timeout_seconds,
        "elastic": None if s.elastic is None else {"min_workers": s.elastic.min_workers,
                                                   "max_workers": s.elastic.max_workers},
        "launcher": None if s.elastic is None else s.elastic.launcher.value,
        "created_at": d.created_at,
    }


def job(j: Job, waiting: WaitInfo | None = None) -> dict[str, Any]:
    """``waiting`` is shown for a RUNNABLE job the scheduler did not start (else None)."""
    definition = (None if j.definition_name is None
                  else f"{j.definition_name}:{j.definition_revision}")
    return {
        "id": j.id, "name": j.name, "queue": j.queue, "status": j.status.value,
        "status_reason": j.status_reason, "definition": definition, "command": list(j.command),
        "environment": dict(j.environment), "parameters": dict(j.parameters),
        "resources": resources(j.resources), "retry_strategy": retry_strategy(j.retry_strategy),
        "timeout_seconds": j.timeout_seconds,
        "elastic": None if j.min_workers is None else {"min_workers": j.min_workers,
                                                       "max_workers": j.max_workers},
        "launcher": None if j.elastic is None else j.elastic.launcher.value,
        "array_parent_id": j.array_parent_id, "array_index": j.array_index,
        "array_size": j.array_size,
        "depends_on": [{"job_id": d.job_id, "type": d.type.value} for d in j.depends_on],
        "attempts": j.attempts, "preemptions": j.preemptions, "exit_code": j.exit_code,
        "current_workers": j.current_workers,
        "waiting": (None if waiting is None or j.status is not JobStatus.RUNNABLE
                    else {"reason": waiting.reason, "position": waiting.position}),
        "workdir": j.workdir, "progress": j.progress, "result": j.result,
        "share": j.share, "scheduling_priority": j.scheduling_priority,
        "created_at": j.created_at, "updated_at": j.updated_at, "started_at": j.started_at,
        "stopped_at": j.stopped_at,
    }


def worker(w: WorkerRecord) -> dict[str, Any]:
    """A worker without the executor's handle (an internal detail: pid and start time)."""
    return {"id": w.id, "attempt": w.attempt_no, "compute_environment": w.compute_environment,
            "capacity_type": w.capacity_type, "price_per_slot_hour": w.price_per_slot_hour,
            "state": w.state, "started_at": w.started_at, "leave_reason": w.leave_reason,
            "leave_at": w.leave_at, "exit_code": w.exit_code, "stopped_at": w.stopped_at}


def attempt(a: AttemptRecord) -> dict[str, Any]:
    """One attempt: when it ran and how it ended (``reason``: the job's status reason then)."""
    return {"attempt": a.attempt_no, "started_at": a.started_at, "stopped_at": a.stopped_at,
            "exit_code": a.exit_code, "reason": a.reason}


def log_line(line: LogLine) -> dict[str, Any]:
    return {"seq": line.seq, "attempt": line.attempt_no, "worker": line.worker,
            "line": line.line, "at": line.at}


def event(e: Event) -> dict[str, Any]:
    return {"id": e.id, "job_id": e.job_id, "kind": e.kind, "payload": e.payload, "at": e.at}


def job_cost(job_id: str, cost: JobCost) -> dict[str, Any]:
    def by_type(d: dict) -> dict[str, float]:
        return {k.value: v for k, v in d.items()}

    return {
        "job_id": job_id, "total": cost.total, "worker_seconds": cost.worker_seconds,
        "useful_worker_seconds": cost.useful_worker_seconds,
        "cost_by_compute_environment": dict(cost.cost_by_compute_environment),
        "cost_by_capacity_type": by_type(cost.cost_by_capacity_type),
        "worker_seconds_by_compute_environment": dict(cost.worker_seconds_by_compute_environment),
        "worker_seconds_by_capacity_type": by_type(cost.worker_seconds_by_capacity_type),
        "wasted_worker_seconds": cost.wasted_worker_seconds, "wasted_cost": cost.wasted_cost,
        "wall_seconds": cost.wall_seconds,
        "static_on_demand": dataclasses.asdict(cost.static_on_demand),
        "saving_percent": cost.saving_percent,
        "time_overhead_percent": cost.time_overhead_percent,
    }
