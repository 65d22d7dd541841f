"""What the dashboard's pages show, read by the service's queries (``dyntrain.service.operations``)
and from the run folders they name.

Each function returns plain dicts for the templates (and for the JSON the charts poll); none
writes anything. The native API's own views (``engine.views``) and queries (environments with
their slots, a job's cost) are reused, so a page and ``GET /jobs/{id}`` never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from dyntrain.service.core.model import JobStatus, ValidationError, WorkerState
from dyntrain.service.core.records import Job
from dyntrain.service.engine import views
from dyntrain.service.operations import Operations
from dyntrain.service.web import runfiles
from dyntrain.service.web.speedup import speedup_chart

JOBS_PER_PAGE = 50
CHILDREN_PER_PAGE = 100
WAITING_STATES = (JobStatus.SUBMITTED, JobStatus.PENDING, JobStatus.RUNNABLE)
ACTIVE_STATES = (JobStatus.STARTING, JobStatus.RUNNING)


@dataclass(frozen=True)
class JobFilters:
    """The overview's job filters, as given in the page's query string."""

    status: tuple[str, ...] = ()
    queue: str = ""
    text: str = ""
    page: int = 0

    @classmethod
    def parse(cls, status: str, queue: str, text: str, page: int) -> JobFilters:
        statuses = tuple(s.strip().upper() for s in status.split(",") if s.strip())
        for s in statuses:
            if s not in JobStatus.__members__:
                raise ValidationError(f"unknown status {s!r}: one of "
                                      f"{', '.join(JobStatus.__members__)}")
        return cls(statuses, queue.strip(), text.strip()[:200], max(0, page))

    def query(self, **changes: Any) -> str:
        """This filter set as a query string, with ``changes`` applied."""
        values = {"status": ",".join(self.status), "queue": self.queue, "q": self.text,
                  "page": self.page or ""}
        values.update(changes)
        return urlencode({k: v for k, v in values.items() if v not in ("", None, 0)})


def environments(ops: Operations) -> list[dict[str, Any]]:
    """Each compute environment as ``GET /compute-environments`` shows it (slots now, in use)."""
    c = ops.environments.capacity()
    return [views.compute_environment(ce, c.available, c.in_use, c.traces, c.machine)
            for ce in ops.environments.list()]


def queues(ops: Operations, counts: dict[tuple[str, JobStatus], int]) -> list[dict[str, Any]]:
    out = []
    for q in ops.queues.list():
        view = views.job_queue(q)
        view["waiting"] = sum(counts.get((q.name, s), 0) for s in WAITING_STATES)
        view["runnable"] = counts.get((q.name, JobStatus.RUNNABLE), 0)
        view["running"] = sum(counts.get((q.name, s), 0) for s in ACTIVE_STATES)
        if q.spec.scheduling_policy is not None:
            view["fairshare"] = fair_shares(ops, q.name, q.spec.scheduling_policy)
        out.append(view)
    return sorted(out, key=lambda q: (-q["priority"], q["name"]))


def fair_shares(ops: Operations, queue: str, policy_name: str) -> dict[str, Any]:
    """A fair-share queue's policy and, for each share holding slots or named by the policy,
    its weight factor and the slots it holds now."""
    policy = ops.policies.get(policy_name).fairshare
    held = ops.queues.shares(queue)
    names = sorted({a.identifier for a in policy.shares} | set(held))
    return {"policy": policy_name, "shares": [
        {"share": name or "-", "weight_factor": policy.weight_factor(name.rstrip("*")),
         "slots": held.get(name, 0)} for name in names]}


def _array_counts(ops: Operations, parents: list[Job]) -> dict[str, dict[str, int]]:
    """Array parent id -> its children's count in every status (one GROUP BY for all)."""
    counts = ops.jobs.child_counts([j.id for j in parents if j.is_array_parent])
    return {job_id: {s.value: c.get(s, 0) for s in JobStatus} for job_id, c in counts.items()}


REPLICA_STALE_S = 5.0  # a replica whose last heartbeat is older is shown as not answering


def replicas(ops: Operations) -> dict[str, Any] | None:
    """Which replica leads, since when, and each replica's last heartbeat (None: a single
    service, no replicas)."""
    lease, found = ops.replicas()
    if lease is None and not found:
        return None
    return {
        "leader": lease.holder if lease is not None and lease.remaining > 0 else None,
        "last_leader": lease.holder if lease is not None else None,
        "epoch": lease.epoch if lease is not None else None,
        "since": lease.acquired_at if lease is not None else None,
        "replicas": [{"name": r.name, "url": r.url, "started_at": r.started_at, "age": r.age,
                      "healthy": r.age <= REPLICA_STALE_S,
                      "leader": lease is not None and lease.remaining > 0
                      and r.name == lease.holder} for r in found],
    }


def overview(ops: Operations, filters: JobFilters) -> dict[str, Any]:
    counts = ops.jobs.counts()
    jobs, total = ops.jobs.search(
        queue=filters.queue or None, status=filters.status, text=filters.text or None,
        limit=JOBS_PER_PAGE, offset=filters.page * JOBS_PER_PAGE)
    why = ops.jobs.wait_reasons()
    arrays = _array_counts(ops, jobs)
    return {
        "replicas": replicas(ops),
        "environments": environments(ops),
        "queues": queues(ops, counts),
        "jobs": [dict(views.job(j, why(j)), array=arrays.get(j.id))
                 for j in jobs],
        "jobs_total": total,
        "filters": filters,
        "pages": max(1, -(-total // JOBS_PER_PAGE)),
        "statuses": [s.value for s in JobStatus],
    }


# ------------------------------------------------------------------------------------ a job


@dataclass
class MembershipChange:
    """One membership event as the runtime recorded it, with its latencies in seconds."""

    kind: str
    workers: list[str]
    world_before: int | None
    world_after: int | None
    requested_at: float  # epoch seconds
    first_step_at: float
    detect_s: float | None
    reform_s: float | None
    latency_s: float | None
    steps_redone: int
    reason: str = ""
    generation: int | None = None
    start_step: int | None = None


def membership_change(at: float, p: dict[str, Any]) -> MembershipChange:
    """From a ``membership.*`` event: its times are relative to the coordinator's start, and
    the event was stored when the new world completed its first step (``at``)."""
    requested = p.get("requested_at")

    def since_request(key: str) -> float | None:
        value = p.get(key)
        return None if value is None or requested is None else round(value - requested, 4)

    latency = p.get("latency_s")
    kind = str(p.get("event", "?"))
    reason = str(p.get("reason") or "")
    if kind == "crash" and reason.startswith("no heartbeat"):
        kind = "hang"  # a worker that stopped answering, found by the heartbeat timeout
    requested_abs = at - latency if latency is not None else at
    return MembershipChange(
        kind=kind, workers=list(p.get("workers") or []), world_before=p.get("world_before"),
        world_after=p.get("world_after"), requested_at=requested_abs,
        first_step_at=at, detect_s=since_request("detected_at"),
        reform_s=since_request("reformed_at"), latency_s=latency,
        steps_redone=int(p.get("steps_redone") or 0), reason=reason,
        generation=p.get("generation"), start_step=p.get("start_step"))


def membership(ops: Operations, job_id: str) -> list[MembershipChange]:
    return [membership_change(e.at, e.payload)
            for e in ops.logs.job_events(job_id, "membership.")]


def world_timeline(job: Job, changes: list[MembershipChange], now: float
                   ) -> dict[str, list]:
    """World size against time: 0 until the first change, each change's world from the moment
    it was requested, and 0 again once the job stopped."""
    t: list[float] = []
    world: list[int] = []
    if job.started_at is not None:
        t.append(job.started_at)
        world.append(0)
    for c in changes:
        if c.world_before is not None and (not world or world[-1] != c.world_before):
            t.append(c.requested_at)
            world.append(c.world_before)
        t.append(c.first_step_at)
        world.append(c.world_after if c.world_after is not None else 0)
    end = job.stopped_at if job.stopped_at is not None else now
    if t:
        t.append(max(end, t[-1]))
        world.append(0 if job.stopped_at is not None else world[-1])
    order = sorted(range(len(t)), key=lambda i: t[i])
    return {"t": [t[i] for i in order], "world": [world[i] for i in order]}


def job_page(ops: Operations, job: Job, child_status: str = "", child_page: int = 0
             ) -> dict[str, Any]:
    why = ops.jobs.wait_reasons()
    view = views.job(job, why(job))
    workers = [views.worker(w) for w in ops.jobs.workers(job.id, active=False)]
    attempts = ops.jobs.attempts(job.id)
    out: dict[str, Any] = {
        "job": view, "workers": workers, "attempts": attempts,
        # those told to leave are on their way out: counted apart from the ones that train
        "active_workers": sum(1 for w in workers if w["state"] == WorkerState.RUNNING),
        "leaving_workers": sum(1 for w in workers if w["state"] == WorkerState.LEAVING),
        "cost": views.job_cost(job.id, ops.jobs.cost(job)),
        "parent": job.array_parent_id, "array": None, "elastic": job.elastic is not None,
        "changes": [], "checkpoints": [], "can_cancel": job.status in WAITING_STATES,
        "can_terminate": not job.status.is_terminal(),
    }
    if job.elastic is not None:
        out["changes"] = membership(ops, job.id)
        out["checkpoints"] = runfiles.checkpoints(ops.jobs.run_folder(job))
    if job.is_array_parent:
        statuses = [child_status] if child_status else None
        children, total = ops.jobs.search(
            parent=job.id, status=statuses, limit=CHILDREN_PER_PAGE,
            offset=child_page * CHILDREN_PER_PAGE)
        out["array"] = {
            "size": job.array_size, "counts": _array_counts(ops, [job])[job.id],
            "children": [views.job(c, why(c)) for c in children],
            "total": total, "status": child_status, "page": child_page,
            "pages": max(1, -(-total // CHILDREN_PER_PAGE)),
        }
    return out


def job_series(ops: Operations, job: Job, offset: int) -> dict[str, Any]:
    """What the job page's charts poll: new metrics rows after byte ``offset`` of
    metrics.jsonl, and the whole (small) world-size timeline with its membership changes."""
    rows, next_offset = runfiles.read_rows(ops.jobs.run_folder(job), offset)
    changes = membership(ops, job.id)
    return {
        "offset": next_offset, "rows": runfiles.series(rows),
        "timeline": world_timeline(job, changes, ops.clock()),
        "changes": [{"kind": c.kind, "requested_at": c.requested_at,
                     "first_step_at": c.first_step_at, "world_after": c.world_after,
                     "latency_s": c.latency_s, "start_step": c.start_step} for c in changes],
        "status": job.status.value,
        "speedup": speedup_chart(ops.jobs.run_folder(job), job.workers_range[1]),
    }
