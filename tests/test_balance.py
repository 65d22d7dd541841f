"""Mixed-speed planning: pure functions and the per-generation balancer, no processes."""

import pytest

from dyntrain.elastic.step.balance import ChunkBalancer
from dyntrain.elastic.step.chunks import balance_counts, blocks, step_seconds


def test_a_twice_slower_rank_gets_a_third_of_the_chunks():
    assert balance_counts(12, [0.01, 0.02]) == [8, 4]
    assert balance_counts(12, [0.02, 0.01]) == [4, 8]
    # minimax: no other split of 7 chunks finishes earlier
    counts = balance_counts(7, [1.0, 2.0, 3.0])
    assert sum(counts) == 7
    best = min(step_seconds([a, b, 7 - a - b], [1.0, 2.0, 3.0])
               for a in range(8) for b in range(8 - a))
    assert step_seconds(counts, [1.0, 2.0, 3.0]) == best


def test_unknown_times_count_as_average_and_none_known_is_even():
    assert balance_counts(8, [0.0, 0.0]) == [4, 4]
    assert balance_counts(9, [0.0, 1.0, 1.0]) == [3, 3, 3]
    assert blocks([2, 0, 3]) == [range(0, 2), range(2, 2), range(2, 5)]


def test_balancer_plans_two_steps_ahead_and_ignores_small_gains():
    b = ChunkBalancer(12, 2, start_step=10)
    assert b.plan(10) == b.plan(11) == [range(0, 6), range(6, 12)]
    assert b.slots == 2
    b.observe(10, [0.010, 0.0105])  # 5% apart: not worth moving chunks
    assert b.counts(12) == [6, 6]
    b.observe(11, [0.010, 0.020])  # twice slower: a third for rank 1, from step 13
    assert b.counts(12) == [6, 6] and b.counts(13) == [8, 4]
    assert b.replans == 1
    with pytest.raises(KeyError):
        b.counts(10)  # gone once done


def test_disabled_balancer_keeps_the_even_split_and_sends_nothing():
    b = ChunkBalancer(12, 2, start_step=0, enabled=False)
    b.observe(0, [])
    assert b.counts(2) == [6, 6] and b.slots == 0


def test_own_time_is_smoothed_and_steps_without_chunks_keep_it():
    b = ChunkBalancer(4, 2, start_step=0, smoothing=0.5)
    assert b.measured(0.4, 4) == pytest.approx(0.1)
    assert b.measured(0.6, 2) == pytest.approx(0.2)  # 0.5 * 0.3 + 0.5 * 0.1
    assert b.measured(5.0, 0) == pytest.approx(0.2)
