"""``dyntrain.testing.wait.wait_until``: the one way the tests and the benchmarks wait."""

import time

import pytest

from dyntrain.testing.wait import wait_until


def counter():
    calls = []

    def probe() -> int:
        calls.append(1)
        return len(calls)

    return probe, calls


def test_it_returns_the_first_value_waited_for():
    probe, calls = counter()
    assert wait_until(lambda: probe() >= 3 and "there", "three polls", 10, 0.001) == "there"
    assert len(calls) == 3
    probe, calls = counter()
    assert wait_until(probe, "the fourth poll", 10, 0.001, until=lambda n: n == 4) == 4


def test_a_timeout_names_what_it_waited_for_and_the_last_value():
    probe, calls = counter()
    with pytest.raises(TimeoutError) as info:
        wait_until(probe, "the answer", 0.05, 0.001, until=lambda n: n < 0)
    assert str(info.value) == f"timed out after 0.05 s waiting for the answer; last seen: " \
                              f"{len(calls)}"
    with pytest.raises(TimeoutError, match=r"last seen: \.\.\.x{600}$"):
        wait_until(lambda: "x" * 5000, "a short text", 0.01, until=lambda text: len(text) < 10)


def test_unless_gives_up_at_once_saying_why():
    probe, calls = counter()
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        wait_until(lambda: None, "the server to answer", 60,
                   unless=lambda: probe() >= 2 and "it exited with 3")
    assert str(info.value) == ("gave up (it exited with 3) waiting for the server to answer; "
                               "last seen: None")
    assert len(calls) == 2 and time.monotonic() - started < 30


def test_polls_grow_from_poll_to_max_poll():
    stamps = []
    with pytest.raises(TimeoutError):
        wait_until(lambda: stamps.append(time.monotonic()), "nothing", 0.6, 0.01, 0.05)
    assert stamps[1] - stamps[0] >= 0.01  # never closer than ``poll``
    assert len(stamps) < 0.6 / 0.01  # and not every 10 ms: the pauses grew
