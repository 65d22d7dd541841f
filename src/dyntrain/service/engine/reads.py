"""What the front ends read from a running service beyond one record, shared so that the REST API
and the dashboard never disagree: each compute environment with the slots it offers now, and a
job's cost against its static on-demand baseline."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dyntrain.service.core.cost import JobCost, UsageRow, job_cost
from dyntrain.service.core.model import MAX_ARRAY_SIZE, CapacityType, Resources
from dyntrain.service.core.records import ComputeEnvironment, Job
from dyntrain.service.engine import views
from dyntrain.service.engine.service import Service

DEFAULT_ON_DEMAND_PRICE = 1.0  # the cost baseline's price when no ON_DEMAND environment exists


def environment_views(service: Service, envs: list[ComputeEnvironment]) -> list[dict[str, Any]]:
    """With the slots each offers now (traces included) and how many active workers use."""
    with service.lock:
        available = service.controller.available_slots(service.store.clock())
    in_use = Counter(w.compute_environment for w in service.store.list_workers(active=True))
    traces = service.store.capacity_traces()
    machine = local_machine(service)
    return [views.compute_environment(ce, available, in_use, traces, machine) for ce in envs]


def local_machine(service: Service) -> Resources | None:
    """The machine every slot is carved from, when the executor is the local one."""
    return service.executor.capacity() if service.executor.name == "local" else None


def cost_of(service: Service, job: Job) -> JobCost:
    """The job's cost and its static on-demand baseline.

    The baseline runs ``max workers`` slots (1 for a plain job; times the array size for an
    array job, whose children's usage is summed) at the highest price among ON_DEMAND
    environments, or at 1.0 per slot-hour when there is none. The wall time runs from the
    job's start to its stop (or to now while it runs).
    """
    ids = [job.id]
    if job.is_array_parent:
        ids += [c.id for c in service.store.list_jobs(parent=job.id, limit=MAX_ARRAY_SIZE)]
    rows = [UsageRow(u.compute_environment, u.capacity_type, u.worker_seconds,
                     u.price_per_slot_hour, u.wasted)
            for jid in ids for u in service.store.job_usage(jid)]
    max_workers = (job.max_workers or 1) * (job.array_size if job.is_array_parent else 1)
    now = service.store.clock()
    wall = 0.0 if job.started_at is None else max(
        0.0, (job.stopped_at or now) - job.started_at)
    prices = [ce.spec.price_per_slot_hour for ce in service.store.list_compute_environments()
              if ce.spec.capacity_type is CapacityType.ON_DEMAND]
    price = max(prices) if prices else DEFAULT_ON_DEMAND_PRICE
    return job_cost(rows, max_workers=max_workers, wall_seconds=wall,
                    on_demand_price_per_slot_hour=price)
