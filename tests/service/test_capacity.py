"""Capacity traces, capacity diffs and the reserved pool."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntrain.service.core.capacity import (
    CapacityChange,
    CapacityTrace,
    ReservedPool,
    TracePoint,
    TraceRow,
    diff_capacity,
    load_reserved_pool,
    load_trace,
    parse_reserved_pool,
    parse_trace,
    trace_from_points,
)
from dyntrain.service.core.model import CapacityType, ValidationError

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
# a spot trace
offset_s,slots,price

0,2,0.30
20,4,0.35   # grows
60,1,0.40
90,3,0.32
"""


# --- parsing ---------------------------------------------------------------------------------

def test_parse_good_trace():
    t = parse_trace(GOOD, "good.csv")
    assert t.rows == (TraceRow(0, 2, 0.30), TraceRow(20, 4, 0.35), TraceRow(60, 1, 0.40),
                      TraceRow(90, 3, 0.32))
    assert t.duration == 90
    assert t.has_price and t.max_slots == 4
    assert t.source == "good.csv" and not t.loop


def test_parse_without_price_and_loose_format():
    t = parse_trace("  Offset_s , Slots \n5,1\n5.5 , 2.0\n\n# end\n")
    assert t.rows == (TraceRow(5, 1), TraceRow(5.5, 2))
    assert not t.has_price
    assert t.at(6) == TracePoint(2, None)


def test_equal_offsets_last_row_wins():
    t = parse_trace("offset_s,slots\n0,1\n10,2\n10,3\n")
    assert t.at(10).slots == 3 and t.at(9.99).slots == 1
    assert t.next_change_after(0) == 10


@pytest.mark.parametrize(("text", "message"), [
    ("", "t.csv: empty trace: no header and no rows"),
    ("# only a comment\n\n", "t.csv: empty trace: no header and no rows"),
    ("offset_s,slots,price\n# nothing\n", "t.csv: empty trace: a header but no rows"),
    ("time,slots\n0,1\n", "t.csv:1: bad header 'time,slots': expected 'offset_s,slots' or "
                          "'offset_s,slots,price'"),
    ("0,2\n", "t.csv:1: bad header '0,2'"),
    ("offset_s,slots,price,zone\n", "t.csv:1: bad header"),
    ("offset_s,slots\n0,1\nabc,2\n", "t.csv:3: offset_s 'abc' is not a number"),
    ("offset_s,slots\n0,x\n", "t.csv:2: slots 'x' is not a number"),
    ("offset_s,slots,price\n0,1,cheap\n", "t.csv:2: price 'cheap' is not a number"),
    ("offset_s,slots\n0,\n", "t.csv:2: slots '' is not a number"),
    ("offset_s,slots\n-1,1\n", "t.csv:2: offset_s must be >= 0, got -1"),
    ("offset_s,slots\n0,-2\n", "t.csv:2: slots must be >= 0, got -2"),
    ("offset_s,slots,price\n0,1,-0.5\n", "t.csv:2: price must be >= 0, got -0.5"),
    ("offset_s,slots\n0,1.5\n", "t.csv:2: slots must be a whole number, got 1.5"),
    ("offset_s,slots\nnan,1\n", "t.csv:2: offset_s 'nan' is not a finite number"),
    ("offset_s,slots\ninf,1\n", "t.csv:2: offset_s 'inf' is not a finite number"),
    ("offset_s,slots\n\n10,1\n# c\n5,2\n",
     "t.csv:5: offset_s 5 goes backwards (the previous row is at 10)"),
    ("offset_s,slots,price\n0,1\n", "t.csv:2: expected 3 values (offset_s,slots,price), got 2"),
    ("offset_s,slots\n0,1,0.3\n", "t.csv:2: expected 2 values (offset_s,slots), got 3"),
])
def test_parse_errors(text, message):
    with pytest.raises(ValidationError) as e:
        parse_trace(text, "t.csv")
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_load_trace(tmp_path):
    p = tmp_path / "spot.csv"
    p.write_text(GOOD)
    assert load_trace(p) == parse_trace(GOOD, str(p))
    assert load_trace(p, loop=True).loop
    p.write_text("offset_s,slots\n0,1\n3,-1\n")
    with pytest.raises(ValidationError, match=rf"^{p}:3: slots must be >= 0"):
        load_trace(p)
    with pytest.raises(ValidationError, match="cannot read capacity trace .*missing.csv"):
        load_trace(tmp_path / "missing.csv")


def test_constructed_trace_is_validated():
    with pytest.raises(ValidationError, match="empty trace"):
        CapacityTrace(())
    with pytest.raises(ValidationError, match="row 2: offset_s 1 goes backwards"):
        trace_from_points([(5, 1), (1, 2)])
    with pytest.raises(ValidationError, match="row 1: slots must be a whole number >= 0"):
        trace_from_points([(0, 1.5)])
    with pytest.raises(ValidationError, match="either every row has a price or none"):
        trace_from_points([(0, 1, 0.3), (5, 2)])


def test_demo_trace_matches_its_story():
    t = load_trace(ROOT / "examples" / "traces" / "spot_demo.csv")
    assert t.max_slots == 4 and 100 <= t.duration <= 150
    assert t.at(0).slots == 2
    assert t.at(30).slots == 4
    assert t.at(65).slots == 1
    assert t.at(100).slots == 3
    assert all(0.30 <= r.price <= 0.40 for r in t.rows)


# --- step lookup -----------------------------------------------------------------------------

def test_at_step_function_and_boundaries():
    t = parse_trace(GOOD)
    assert t.at(0) == TracePoint(2, 0.30)
    assert t.at(19.999) == TracePoint(2, 0.30)
    assert t.at(20) == TracePoint(4, 0.35)  # the row's own offset already counts
    assert t.at(59.9).slots == 4
    assert t.at(60).slots == 1
    assert t.at(90).slots == 3
    assert t.at(10_000).slots == 3  # the last row holds forever without loop
    assert t.slots_at(25) == 4


def test_before_first_row_uses_first_row():
    t = trace_from_points([(10, 3, 0.5), (20, 1, 0.6)])
    assert t.at(0) == TracePoint(3, 0.5)
    assert t.at(-5) == TracePoint(3, 0.5)
    assert t.next_change_after(0) == 20  # nothing changes at the first row


def test_loop_repeats_with_period_duration():
    t = parse_trace(GOOD, loop=True)
    assert t.at(89.9).slots == 1
    assert t.at(90) == TracePoint(2, 0.30)  # wraps to the start: the last row ends the period
    assert t.at(110).slots == 4  # 110 - 90 = 20
    assert t.at(90 * 3 + 60).slots == 1
    assert t.at(90 * 7 + 19).slots == 2


def test_loop_single_row_and_zero_duration():
    for t in (trace_from_points([(0, 2)], loop=True), trace_from_points([(5, 2)], loop=True)):
        assert t.at(0).slots == 2 and t.at(1e6).slots == 2
        assert t.next_change_after(0) is None


# --- next change -----------------------------------------------------------------------------

def test_next_change_after():
    t = parse_trace(GOOD)
    assert t.next_change_after(-1) == 20
    assert t.next_change_after(0) == 20
    assert t.next_change_after(19.5) == 20
    assert t.next_change_after(20) == 60  # strictly after
    assert t.next_change_after(60) == 90
    assert t.next_change_after(90) is None
    assert t.next_change_after(1e9) is None


def test_next_change_skips_rows_that_change_nothing():
    t = trace_from_points([(0, 2), (10, 2), (20, 3), (30, 3)])
    assert t.next_change_after(0) == 20
    assert t.next_change_after(20) is None
    priced = trace_from_points([(0, 2, 0.3), (10, 2, 0.4)])
    assert priced.next_change_after(0) == 10  # a price change is a change


def test_next_change_with_loop():
    t = parse_trace(GOOD, loop=True)
    assert t.next_change_after(0) == 20
    assert t.next_change_after(60) == 90  # the wrap back to the first row
    assert t.next_change_after(90) == 110
    assert t.next_change_after(95) == 110
    assert t.next_change_after(150) == 180
    assert t.next_change_after(180) == 200
    # the period ends as it starts: no change at the wrap (the last row only marks the end)
    same = trace_from_points([(0, 2), (10, 3), (15, 2), (20, 9)], loop=True)
    assert same.next_change_after(15) == 30
    assert same.changes_until(45) == [(0.0, TracePoint(2)), (10.0, TracePoint(3)),
                                      (15.0, TracePoint(2)), (30.0, TracePoint(3)),
                                      (35.0, TracePoint(2))]


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4)), min_size=1, max_size=8),
    loop=st.booleans(),
    t=st.integers(0, 200),
)
def test_next_change_is_the_first_change(steps, loop, t):
    """At integer offsets, ``at`` is constant until ``next_change_after`` and differs there."""
    offsets, off = [], 0
    for gap, _ in steps:
        off += gap
        offsets.append(off)
    trace = trace_from_points([(o, s) for o, (_, s) in zip(offsets, steps, strict=True)], loop=loop)
    nxt = trace.next_change_after(t)
    horizon = t + 2 * (trace.duration + 1)
    here = trace.at(t)
    for u in range(t + 1, int(horizon) + 1):
        if nxt is not None and u >= nxt:
            break
        assert trace.at(u) == here
        assert trace.at(u - 0.5) == here
    if nxt is not None:
        assert nxt > t and nxt == int(nxt)
        assert trace.at(nxt) != here


# --- capacity diff ---------------------------------------------------------------------------

def test_diff_capacity():
    grow = diff_capacity(2, 4)
    assert (grow.added, grow.removed, grow.delta) == (2, 0, 2) and grow
    shrink = diff_capacity(4, 1)
    assert (shrink.added, shrink.removed, shrink.delta) == (0, 3, -3)
    same = diff_capacity(3, 3)
    assert (same.added, same.removed) == (0, 0) and not same
    assert diff_capacity(0, 0) == CapacityChange(0, 0)
    for bad in ((-1, 2), (1, -2), (1.5, 2), (True, 1)):
        with pytest.raises(ValidationError, match="must be a whole number >= 0"):
            diff_capacity(*bad)


def test_diff_along_the_trace():
    t = parse_trace(GOOD)
    times = [p for p, _ in t.changes_until(100)]
    removed = [diff_capacity(t.slots_at(a), t.slots_at(b)).removed
               for a, b in zip(times, times[1:], strict=False)]
    assert times == [0, 20, 60, 90] and removed == [0, 3, 0]


# --- reserved pool ---------------------------------------------------------------------------

def test_reserved_pool_from_claims():
    claims = trace_from_points([(0, 1), (30, 4), (60, 0)])
    pool = ReservedPool.from_claims(4, claims)
    assert pool.capacity_type is CapacityType.RESERVED
    assert [pool.claimed(t) for t in (0, 29, 30, 59, 60, 1000)] == [1, 1, 4, 4, 0, 0]
    assert [pool.lendable(t) for t in (0, 30, 60)] == [3, 0, 4]
    assert pool.at(45) == TracePoint(0, None)
    assert pool.next_change_after(0) == 30 and pool.next_change_after(60) is None
    with pytest.raises(ValidationError, match="claims 5 slots at 30 s but the pool has only 4"):
        ReservedPool.from_claims(4, trace_from_points([(0, 1), (30, 5)]))


def test_reserved_pool_from_lendable_trace(tmp_path):
    text = "offset_s,slots,price\n0,2,0.6\n10,6,0.6\n50,0,0.6\n"
    pool = parse_reserved_pool(text, "pool.csv", total_slots=8)
    assert pool.total_slots == 8
    assert [pool.lendable(t) for t in (0, 10, 50)] == [2, 6, 0]
    assert [pool.claimed(t) for t in (0, 10, 50)] == [6, 2, 8]
    assert pool.at(12).price == 0.6
    assert parse_reserved_pool(text).total_slots == 6  # defaults to the trace's maximum
    with pytest.raises(ValidationError, match="pool.csv: 6 slots to lend at 10 s but the pool "
                                              "has only 4"):
        parse_reserved_pool(text, "pool.csv", total_slots=4)
    p = tmp_path / "pool.csv"
    p.write_text(text)
    looped = load_reserved_pool(p, total_slots=8, loop=True)
    assert looped.lendable(55) == 2 and looped.lendable(60) == 6  # 55 - 50 = 5: first row
    with pytest.raises(ValidationError, match="total_slots must be a whole number >= 0"):
        ReservedPool(-1, parse_trace(text))
