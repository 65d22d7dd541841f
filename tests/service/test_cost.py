"""Job cost accounting and the static on-demand comparison."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntrain.service.core.cost import (
    JobCost,
    StaticBaseline,
    UsageRow,
    format_cost,
    format_duration,
    job_cost,
)
from dyntrain.service.core.model import CapacityType, ValidationError

SPOT, OD, RES = CapacityType.SPOT, CapacityType.ON_DEMAND, CapacityType.RESERVED


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-12)


def test_hand_computed_example():
    usage = [UsageRow("spot", SPOT, 2 * 3600, 0.3), UsageRow("ondemand", OD, 1800, 1.0)]
    c = job_cost(usage, max_workers=3, wall_seconds=3600, on_demand_price_per_slot_hour=1.0)
    # 2 workers x 1 h x 0.3 + 1 worker x 0.5 h x 1.0 = 0.6 + 0.5
    assert c.total == approx(1.1)
    assert c.worker_seconds == 9000 and c.useful_worker_seconds == 9000
    assert c.cost_by_compute_environment == {"spot": approx(0.6), "ondemand": approx(0.5)}
    assert c.cost_by_capacity_type == {OD: approx(0.5), SPOT: approx(0.6)}
    assert list(c.cost_by_capacity_type) == [OD, SPOT]  # in CapacityType's order
    assert c.worker_seconds_by_compute_environment == {"spot": 7200, "ondemand": 1800}
    assert c.worker_seconds_by_capacity_type == {OD: 1800, SPOT: 7200}
    assert c.wasted_worker_seconds == 0 and c.wasted_cost == 0
    # static: 9000 worker-s over 3 workers = 3000 s; 3000 s x 3 x 1.0 / 3600 = 2.5
    assert c.static_on_demand == StaticBaseline(3, 1.0, approx(3000), approx(2.5))
    assert c.saving_percent == approx(56.0)  # (2.5 - 1.1) / 2.5
    assert c.wall_seconds == 3600
    assert c.time_overhead_percent == approx(20.0)  # 3600 s vs 3000 s


def test_wasted_work_is_paid_for_but_not_in_the_baseline():
    usage = [
        UsageRow("spot", SPOT, 4 * 3600, 0.3),
        UsageRow("spot", SPOT, 1200, 0.3, wasted=True),  # recomputed after a crash
        UsageRow("reserved", "RESERVED", 1800, 0.5),
    ]
    c = job_cost(usage, max_workers=4, wall_seconds=4000, on_demand_price_per_slot_hour=1.0)
    assert c.total == approx(1.2 + 0.1 + 0.25)
    assert c.wasted_worker_seconds == 1200 and c.wasted_cost == approx(0.1)
    assert c.cost_by_compute_environment == {"spot": approx(1.3), "reserved": approx(0.25)}
    assert c.cost_by_capacity_type == {RES: approx(0.25), SPOT: approx(1.3)}
    assert c.worker_seconds == 14400 + 1200 + 1800
    assert c.useful_worker_seconds == 14400 + 1800
    # useful 16200 worker-s over 4 workers: 4050 s, 4.5 slot-hours at 1.0
    assert c.static_on_demand.wall_seconds == approx(4050)
    assert c.static_on_demand.cost == approx(4.5)
    assert c.saving_percent == approx((4.5 - 1.55) / 4.5 * 100)


def test_zero_usage():
    c = job_cost([], max_workers=2, wall_seconds=0, on_demand_price_per_slot_hour=1.0)
    assert c.total == 0 and c.worker_seconds == 0 and c.wasted_cost == 0
    assert c.cost_by_compute_environment == {} and c.cost_by_capacity_type == {}
    assert c.static_on_demand == StaticBaseline(2, 1.0, 0.0, 0.0)
    assert c.saving_percent is None and c.time_overhead_percent is None
    lines = format_cost(c)
    assert any("n/a" in line for line in lines)


def test_negative_saving():
    # on-demand at a premium price, plus waste: dearer than the static baseline
    usage = [UsageRow("od", OD, 7200, 1.5), UsageRow("od", OD, 3600, 1.5, wasted=True)]
    c = job_cost(usage, max_workers=2, wall_seconds=5000, on_demand_price_per_slot_hour=1.0)
    assert c.total == approx(4.5)
    assert c.static_on_demand.cost == approx(2.0) and c.static_on_demand.wall_seconds == 3600
    assert c.saving_percent == approx(-125.0)


def test_free_baseline_with_paid_usage_has_no_saving():
    c = job_cost([UsageRow("s", SPOT, 100, 0.3)], max_workers=1, wall_seconds=100,
                 on_demand_price_per_slot_hour=0.0)
    assert c.static_on_demand.cost == 0 and c.saving_percent is None


def test_validation():
    with pytest.raises(ValidationError, match="worker_seconds must be a finite number >= 0"):
        UsageRow("a", SPOT, -1, 0.3)
    with pytest.raises(ValidationError, match="price_per_slot_hour must be a finite number"):
        UsageRow("a", SPOT, 1, float("nan"))
    with pytest.raises(ValidationError, match="unknown capacity type 'CHEAP'"):
        UsageRow("a", "CHEAP", 1, 0.3)
    with pytest.raises(ValidationError, match="max_workers must be a whole number >= 1"):
        job_cost([], max_workers=0, wall_seconds=1, on_demand_price_per_slot_hour=1)
    with pytest.raises(ValidationError, match="wall_seconds must be"):
        job_cost([], max_workers=1, wall_seconds=-1, on_demand_price_per_slot_hour=1)
    with pytest.raises(ValidationError, match="on_demand_price_per_slot_hour must be"):
        job_cost([], max_workers=1, wall_seconds=1, on_demand_price_per_slot_hour=-1)


def test_format_cost_rounds_to_cents():
    usage = [UsageRow("spot-a", SPOT, 2 * 3600, 0.3), UsageRow("ondemand", OD, 1800, 1.0),
             UsageRow("spot-a", SPOT, 120, 0.3, wasted=True)]
    c = job_cost(usage, max_workers=3, wall_seconds=3725, on_demand_price_per_slot_hour=1.0)
    lines = format_cost(c)
    text = "\n".join(lines)
    assert all(isinstance(line, str) and "\n" not in line for line in lines)
    assert "spot-a" in text and "ON_DEMAND" in text and "SPOT" in text
    total = next(line for line in lines if line.startswith("total"))
    assert total.split()[-1] == "1.11" and "2:32:00" in total  # 0.6 + 0.5 + 0.01
    wasted = next(line for line in lines if "wasted" in line)
    assert wasted.split()[-1] == "0.01" and "0:02:00" in wasted
    assert "perfect scaling" in text
    saving = next(line for line in lines if line.startswith("saving"))
    assert saving.split()[-2:] == [f"{c.saving_percent:.1f}", "%"]
    assert "1:02:05" in text  # elastic wall time
    assert len({len(line) for line in lines if line.startswith(("  spot", "total"))}) == 1


def test_format_duration():
    assert format_duration(0) == "0:00:00"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(3 * 3600 + 62) == "3:01:02"


usage_rows = st.builds(
    UsageRow,
    compute_environment=st.sampled_from(["a", "b", "c"]),
    capacity_type=st.sampled_from(list(CapacityType)),
    worker_seconds=st.floats(0, 1e6, allow_nan=False),
    price_per_slot_hour=st.floats(0, 10, allow_nan=False),
    wasted=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(usage=st.lists(usage_rows, max_size=12), max_workers=st.integers(1, 16),
       price=st.floats(0, 5, allow_nan=False))
def test_total_equals_sum_of_breakdowns(usage, max_workers, price):
    c: JobCost = job_cost(usage, max_workers=max_workers, wall_seconds=100,
                          on_demand_price_per_slot_hour=price)
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)  # noqa: E731
    assert close(math.fsum(c.cost_by_compute_environment.values()), c.total)
    assert close(math.fsum(c.cost_by_capacity_type.values()), c.total)
    assert close(math.fsum(c.worker_seconds_by_compute_environment.values()), c.worker_seconds)
    assert close(math.fsum(c.worker_seconds_by_capacity_type.values()), c.worker_seconds)
    assert c.wasted_cost <= c.total + 1e-9
    assert 0 <= c.useful_worker_seconds <= c.worker_seconds + 1e-6
    assert close(c.static_on_demand.cost, c.useful_worker_seconds * price / 3600)
