"""The speed-up model: fitted from measured throughputs, and tracked on-line from metrics rows."""

from __future__ import annotations

import math

import pytest

from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.speedup import (
    JobProfile,
    SpeedupModel,
    SpeedupTracker,
    ThroughputPoint,
    fit_speedup,
    profile_from_rows,
)


def points_of(model: SpeedupModel, sizes) -> list[ThroughputPoint]:
    return [ThroughputPoint(w, model.throughput(w)) for w in sizes]


def test_the_model_adds_serial_parallel_and_per_worker_parts():
    model = SpeedupModel(serial=1.0, parallel=8.0, comm=0.5)
    assert model.seconds_per_sample(1) == 9.0
    assert model.seconds_per_sample(4) == 1.0 + 2.0 + 1.5
    assert model.throughput(4) == pytest.approx(1 / 4.5)
    assert model.speedup(4) == pytest.approx(9.0 / 4.5)
    assert model.efficiency(4) == pytest.approx(0.5)
    assert model.marginal(0) == pytest.approx(1.0)
    assert model.throughput(0) == 0.0


def test_with_a_chunk_count_the_slowest_worker_sets_the_pace():
    # 8 chunks: 3 workers split them 3/3/2, so 3 is no faster per step than 4 would be at 2...
    model = SpeedupModel(parallel=8.0, chunks=8)
    assert model.seconds_per_sample(3) == pytest.approx(3.0)
    assert model.seconds_per_sample(4) == pytest.approx(2.0)
    assert model.seconds_per_sample(5) == model.seconds_per_sample(7) == pytest.approx(2.0)
    assert model.speedup(8) == pytest.approx(8.0)
    assert model.speedup(16) == pytest.approx(8.0)  # more workers than chunks add nothing
    assert model.marginal(8) == pytest.approx(0.0)


def test_best_size_is_where_throughput_peaks():
    model = SpeedupModel(serial=0.0, parallel=1.0, comm=0.01)
    # 1/w + 0.01 (w - 1) is smallest at w = 10
    assert model.best_size(64) == 10
    assert model.best_size(4) == 4


@pytest.mark.parametrize("chunks", [None, 16])
def test_the_fit_recovers_a_three_part_model_from_its_own_points(chunks):
    truth = SpeedupModel(serial=0.002, parallel=0.03, comm=0.0007, chunks=chunks)
    fitted = fit_speedup(points_of(truth, [1, 2, 4, 8, 16]), chunks)
    for w in range(1, 33):
        assert fitted.throughput(w) == pytest.approx(truth.throughput(w), rel=1e-6)


def test_one_point_means_perfect_scaling_and_two_mean_amdahl():
    one = fit_speedup([ThroughputPoint(2, 100.0)])
    assert (one.serial, one.comm) == (0.0, 0.0)
    assert one.throughput(8) == pytest.approx(400.0)
    truth = SpeedupModel(serial=0.01, parallel=0.09)
    two = fit_speedup(points_of(truth, [1, 4]))
    assert two.comm == 0.0
    assert two.serial == pytest.approx(0.01)
    assert two.throughput(16) == pytest.approx(truth.throughput(16))


def test_the_fit_never_gives_negative_parts_and_weighs_relative_errors():
    # super-linear noise (faster at 2 than twice 1) must not give a negative serial part
    fitted = fit_speedup([ThroughputPoint(1, 100.0), ThroughputPoint(2, 210.0),
                          ThroughputPoint(4, 380.0)])
    assert min(fitted.serial, fitted.parallel, fitted.comm) >= 0.0
    for w, rate in ((1, 100.0), (2, 210.0), (4, 380.0)):
        assert fitted.throughput(w) == pytest.approx(rate, rel=0.08)


def test_efficiency_figures_give_amdahl_through_them():
    # seed 4: 747 images/s per V100 alone, 92 % efficiency at 64 GPUs
    model = SpeedupModel.from_efficiency(747.0, 64, 0.92)
    assert model.throughput(1) == pytest.approx(747.0)
    assert model.efficiency(64) == pytest.approx(0.92)
    assert model.throughput(64) == pytest.approx(0.92 * 64 * 747)
    assert model.efficiency(32) > 0.95
    assert SpeedupModel.from_efficiency(100.0, 4, 1.0).efficiency(4) == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"serial": -1.0}, "serial must be a finite number >= 0"),
    ({"parallel": math.nan}, "parallel must be a finite number >= 0"),
    ({"serial": 0.0, "parallel": 0.0}, r"serial \+ parallel must be > 0"),
    ({"chunks": 0}, "chunks must be a whole number >= 1"),
])
def test_a_bad_model_is_refused(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        SpeedupModel(**kwargs)


def test_bad_points_and_inputs_are_refused():
    with pytest.raises(ValidationError, match="at least one measured throughput"):
        fit_speedup([])
    with pytest.raises(ValidationError, match="world size must be a whole number >= 1"):
        ThroughputPoint(0, 1.0)
    with pytest.raises(ValidationError, match="samples/s at world size 2 must be"):
        ThroughputPoint(2, -5.0)
    with pytest.raises(ValidationError, match="efficiency must be in"):
        SpeedupModel.from_efficiency(1.0, 8, 1.5)
    with pytest.raises(ValidationError, match="unknown field"):
        SpeedupModel.from_dict({"parallel": 1.0, "speed": 2})


def test_the_model_round_trips_through_a_dict():
    model = SpeedupModel(0.1, 0.2, 0.3, 4)
    assert SpeedupModel.from_dict(model.to_dict()) == model


# --- the on-line tracker -------------------------------------------------------------------------

def rows_at(world: int, first_step: int, steps: int, rate: float, batch: int = 64,
            t0: float = 0.0, total: int = 1000) -> list[dict]:
    """metrics.jsonl rows of ``steps`` steps at ``rate`` samples/s, a step every batch/rate s."""
    return [{"step": first_step + i, "world_size": world, "samples_per_s": rate,
             "total_steps": total, "time": t0 + (i + 1) * batch / rate, "loss": 1.0}
            for i in range(steps)]


def test_the_tracker_gives_one_point_per_world_size_without_each_worlds_first_step():
    tracker = SpeedupTracker()
    assert tracker.profile() is None
    tracker.observe_step(rows_at(1, 1, 1, 100.0)[0])
    assert tracker.profile() is None  # one step: nothing to time yet
    rows = rows_at(1, 1, 10, 100.0) + rows_at(2, 11, 10, 180.0, t0=10.0)
    rows[10] = {**rows[10], "samples_per_s": 5.0}  # the first step at world 2 re-formed: slow
    tracker = SpeedupTracker()
    for row in rows:
        tracker.observe_step(row)
    profile = tracker.profile()
    assert [(p.world_size, p.samples_per_s, p.weight) for p in profile.points] == [
        (1, 100.0, 9.0), (2, 180.0, 9.0)]
    assert profile.model.throughput(2) == pytest.approx(180.0)
    assert profile.remaining_samples == pytest.approx((1000 - 20) * 64)
    assert profile.remaining_seconds(2) == pytest.approx((1000 - 20) * 64 / 180.0)


def test_a_slow_step_now_and_then_does_not_move_the_point():
    tracker = SpeedupTracker()
    rows = rows_at(4, 1, 21, 400.0)
    rows[7] = {**rows[7], "samples_per_s": 40.0}
    rows[15] = {**rows[15], "samples_per_s": 45.0}
    for row in rows:
        tracker.observe_step(row)
    assert tracker.points()[0].samples_per_s == 400.0


def test_a_gap_in_the_steps_starts_a_new_world():
    tracker = SpeedupTracker()
    for row in rows_at(2, 1, 5, 200.0) + rows_at(2, 3, 5, 20.0, t0=5.0):  # steps redone
        tracker.observe_step(row)
    assert tracker.points()[0].weight == 4 + 4


def test_the_reformation_cost_is_latency_plus_redone_steps():
    tracker = SpeedupTracker()
    for row in rows_at(2, 1, 10, 200.0, batch=100):  # a step takes 0.5 s at world 2
        tracker.observe_step(row)
    tracker.observe_change({"event": "start", "latency_s": 30.0})  # not a re-formation
    assert tracker.profile().reform_s is None
    tracker.observe_change({"event": "leave", "latency_s": 0.2, "steps_redone": 0,
                            "world_before": 2})
    tracker.observe_change({"event": "crash", "latency_s": 1.0, "steps_redone": 2,
                            "world_before": 2})
    tracker.observe_change({"event": "join", "latency_s": 0.4, "world_before": 2})
    assert tracker.profile().reform_s == pytest.approx(0.4)  # median of 0.2, 2.0, 0.4


def test_rows_without_the_fields_are_ignored():
    tracker = SpeedupTracker()
    for row in [{"step": 1}, {"world_size": "x", "samples_per_s": 1, "step": 2},
                {"step": 3, "world_size": 1, "samples_per_s": 0.0}]:
        tracker.observe_step(row)
    tracker.observe_change({"event": "leave"})
    assert tracker.profile() is None


def test_a_profile_from_a_runs_rows_and_events():
    rows = rows_at(1, 1, 6, 100.0) + rows_at(3, 7, 6, 250.0, t0=6.4)
    profile = profile_from_rows(rows, [{"event": "join", "latency_s": 0.3, "world_before": 1}])
    assert isinstance(profile, JobProfile)
    assert [p.world_size for p in profile.points] == [1, 3]
    assert profile.reform_s == pytest.approx(0.3)
    assert profile.to_dict()["points"][1][:2] == [3, 250.0]
