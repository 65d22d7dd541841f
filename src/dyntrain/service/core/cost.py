"""What a job cost, where, and what the same work would have cost on a static on-demand run.

Pure. The input is a list of ``UsageRow``: worker-seconds a job held in one compute environment
of one capacity type at one price per slot-hour, flagged ``wasted`` when the work done in them
was thrown away by a crash and had to be recomputed. Every row was paid for, so wasted rows count
in the total and in every breakdown, and are also reported on their own.

The comparison, ``static_on_demand``: the same *useful* work (the non-wasted worker-seconds) on
a static allocation of the job's ``max_workers`` on-demand slots, at perfect scaling::

    time = useful_worker_seconds / max_workers
    cost = time * max_workers * on_demand_price_per_slot_hour / 3600

This is an optimistic baseline for the static run: it assumes perfect scaling, no crash, no
waiting for capacity and no start-up cost. A positive ``saving_percent`` is therefore a
conservative estimate of what the elastic run saved; a negative one means it cost more.

Money stays a float in every field; it is rounded to cents only by ``format_cost``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from dyntrain.service.core.model import CapacityType, ValidationError

SECONDS_PER_HOUR = 3600.0


def _non_negative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValidationError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class UsageRow:
    compute_environment: str
    capacity_type: CapacityType
    worker_seconds: float
    price_per_slot_hour: float
    wasted: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "capacity_type", CapacityType(self.capacity_type))
        except ValueError:
            raise ValidationError(f"usage row: unknown capacity type "
                                  f"{self.capacity_type!r}") from None
        _non_negative("usage row: worker_seconds", self.worker_seconds)
        _non_negative("usage row: price_per_slot_hour", self.price_per_slot_hour)

    @property
    def cost(self) -> float:
        return self.worker_seconds * self.price_per_slot_hour / SECONDS_PER_HOUR


@dataclass(frozen=True)
class StaticBaseline:
    """The same useful work on ``workers`` static on-demand slots at perfect scaling."""

    workers: int
    price_per_slot_hour: float
    wall_seconds: float
    cost: float


@dataclass(frozen=True)
class JobCost:
    total: float
    worker_seconds: float
    cost_by_compute_environment: dict[str, float]
    cost_by_capacity_type: dict[CapacityType, float]
    worker_seconds_by_compute_environment: dict[str, float]
    worker_seconds_by_capacity_type: dict[CapacityType, float]
    wasted_worker_seconds: float
    wasted_cost: float
    wall_seconds: float  # the elastic job's own wall time
    static_on_demand: StaticBaseline
    saving_percent: float | None  # None when the baseline costs nothing (nothing to compare)

    @property
    def useful_worker_seconds(self) -> float:
        return self.worker_seconds - self.wasted_worker_seconds

    @property
    def time_overhead_percent(self) -> float | None:
        """How much longer the elastic run took than the static baseline (None: baseline 0 s)."""
        base = self.static_on_demand.wall_seconds
        return None if base <= 0 else (self.wall_seconds - base) / base * 100.0


def _group(rows: list[UsageRow], key, value) -> dict:
    parts: dict = {}
    for row in rows:
        parts.setdefault(key(row), []).append(value(row))
    return {k: math.fsum(v) for k, v in parts.items()}


def job_cost(usage: Iterable[UsageRow], *, max_workers: int, wall_seconds: float,
             on_demand_price_per_slot_hour: float) -> JobCost:
    """Sum ``usage`` up and compare it with the static on-demand baseline (module doc)."""
    rows = list(usage)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ValidationError(f"max_workers must be a whole number >= 1, got {max_workers!r}")
    wall = _non_negative("wall_seconds", wall_seconds)
    od_price = _non_negative("on_demand_price_per_slot_hour", on_demand_price_per_slot_hour)

    total = math.fsum(r.cost for r in rows)
    worker_seconds = math.fsum(r.worker_seconds for r in rows)
    wasted = [r for r in rows if r.wasted]
    useful = math.fsum(r.worker_seconds for r in rows if not r.wasted)
    type_order = list(CapacityType)

    def by_type(value) -> dict[CapacityType, float]:
        parts = _group(rows, lambda r: r.capacity_type, value)
        return {t: parts[t] for t in sorted(parts, key=type_order.index)}

    static_time = useful / max_workers
    static_cost = static_time * max_workers * od_price / SECONDS_PER_HOUR
    return JobCost(
        total=total,
        worker_seconds=worker_seconds,
        cost_by_compute_environment=_group(rows, lambda r: r.compute_environment,
                                           lambda r: r.cost),
        cost_by_capacity_type=by_type(lambda r: r.cost),
        worker_seconds_by_compute_environment=_group(rows, lambda r: r.compute_environment,
                                                     lambda r: r.worker_seconds),
        worker_seconds_by_capacity_type=by_type(lambda r: r.worker_seconds),
        wasted_worker_seconds=math.fsum(r.worker_seconds for r in wasted),
        wasted_cost=math.fsum(r.cost for r in wasted),
        wall_seconds=wall,
        static_on_demand=StaticBaseline(max_workers, od_price, static_time, static_cost),
        saving_percent=None if static_cost <= 0 else (static_cost - total) / static_cost * 100,
    )


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` (rounded to the second)."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _money(value: float) -> str:
    return f"{value:.2f}"


def format_cost(cost: JobCost) -> list[str]:
    """Lines of a terminal table: breakdowns, waste, the static baseline and the saving."""
    w = 36
    lines = [f"{'':<{w}} {'worker time':>12} {'cost':>10}"]

    def row(label: str, secs: float, money: float) -> str:
        return f"{label:<{w}} {format_duration(secs):>12} {_money(money):>10}"

    lines.append("by compute environment")
    for name, money in cost.cost_by_compute_environment.items():
        lines.append(row(f"  {name}", cost.worker_seconds_by_compute_environment[name], money))
    lines.append("by capacity type")
    for ctype, money in cost.cost_by_capacity_type.items():
        lines.append(row(f"  {ctype.value}", cost.worker_seconds_by_capacity_type[ctype], money))
    lines.append(row("total", cost.worker_seconds, cost.total))
    lines.append(row("  of which wasted (recomputed)", cost.wasted_worker_seconds,
                     cost.wasted_cost))
    base = cost.static_on_demand
    lines.append(row(f"static on-demand, {base.workers} x {_money(base.price_per_slot_hour)}"
                     "/slot-h", base.wall_seconds * base.workers, base.cost))
    lines.append("  (optimistic: perfect scaling)")
    lines.append(f"{'wall time: elastic / static':<{w}} {format_duration(cost.wall_seconds):>12} "
                 f"{format_duration(base.wall_seconds):>10}")
    saving = "n/a" if cost.saving_percent is None else f"{cost.saving_percent:.1f} %"
    lines.append(f"{'saving vs static on-demand':<{w}} {'':>12} {saving:>10}")
    return lines
