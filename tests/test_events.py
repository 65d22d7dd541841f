"""--events specs parse into Events; choose_targets and EventSchedule decide who and when."""

from __future__ import annotations

import pytest

from dyntrain.errors import ConfigError
from dyntrain.launch.events import (
    Event,
    EventSchedule,
    choose_targets,
    parse_events,
    parse_workers,
)


def _summary(events: list[Event]) -> list[tuple]:
    return [(e.trigger, e.at, e.action, e.target) for e in events]


@pytest.mark.parametrize("spec", [None, "", "   ", "\t\n"])
def test_empty_spec_gives_no_events(spec: str | None) -> None:
    assert parse_events(spec) == []


def test_parse_docstring_example() -> None:
    events = parse_events("step=5:join=2,step=10:leave=1,step=15:kill=rank:0,t=30:join=1")
    assert _summary(events) == [
        ("step", 5.0, "join", "2"),
        ("step", 10.0, "leave", "1"),
        ("step", 15.0, "kill", "rank:0"),
        ("t", 30.0, "join", "1"),
    ]
    assert [e.text for e in events] == [
        "step=5:join=2",
        "step=10:leave=1",
        "step=15:kill=rank:0",
        "t=30:join=1",
    ]


def test_both_separators_and_spaces() -> None:
    spec = " step = 3 : join = 1 ; t=2.5:leave=all , step=7:kill=w2 ;"
    assert _summary(parse_events(spec)) == [
        ("step", 3.0, "join", "1"),
        ("t", 2.5, "leave", "all"),
        ("step", 7.0, "kill", "w2"),
    ]


def test_empty_items_are_skipped() -> None:
    assert len(parse_events("step=1:join=1,,;step=2:join=1;")) == 2


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("t=0.25:kill=1", ("t", 0.25, "kill", "1")),
        ("t=4:leave=3", ("t", 4.0, "leave", "3")),
        ("step=0:leave=rank:12", ("step", 0.0, "leave", "rank:12")),
        ("step=2:kill=all", ("step", 2.0, "kill", "all")),
        ("step=2:leave=worker-3.a_b", ("step", 2.0, "leave", "worker-3.a_b")),
        ("step=9:join=10", ("step", 9.0, "join", "10")),
    ],
)
def test_parse_single_valid(spec: str, expected: tuple) -> None:
    (event,) = parse_events(spec)
    assert (event.trigger, event.at, event.action, event.target) == expected
    assert isinstance(event.at, float)


@pytest.mark.parametrize(
    "bad",
    [
        "step=1.5:join=1",
        "step=3:join=0",
        "step=x:kill=1",
        "when=3:join=1",
        "step=3:explode=1",
        "step=3:kill=0",
        "step=3:leave=0",
        "step=3:join=all",
        "step=3:join=w2",
        "step=3:kill=rank:",
        "step=3:kill=rank:x",
        "step=3:kill=a/b",
        "step=3",
        "join=1",
        "t=-1:join=1",
        "step=3:join=",
    ],
)
def test_bad_items_rejected_naming_the_item(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_events(bad)
    assert bad in str(info.value)


def test_bad_item_named_among_good_ones() -> None:
    with pytest.raises(ConfigError) as info:
        parse_events("step=1:join=1,step=3:explode=1;t=2:kill=1")
    message = str(info.value)
    assert "step=3:explode=1" in message
    assert "step=1:join=1" not in message


def test_superscript_digit_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse_events("step=3:join=\u00b2")


def test_superscript_digit_rank_rejected_at_parse_time() -> None:
    with pytest.raises(ConfigError):
        parse_events("step=3:kill=rank:\u00b2")


# --------------------------------------------------------------------------- choose_targets

MEMBERS = ["w0", "w1", "w2", "w3"]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("all", ["w0", "w1", "w2", "w3"]),
        ("1", ["w3"]),
        ("2", ["w2", "w3"]),
        ("4", ["w0", "w1", "w2", "w3"]),
        ("9", ["w0", "w1", "w2", "w3"]),
        ("rank:0", ["w0"]),
        ("rank:3", ["w3"]),
        ("rank:4", []),
        ("w2", ["w2"]),
        ("w9", []),
    ],
)
def test_choose_targets(target: str, expected: list[str]) -> None:
    assert choose_targets(target, MEMBERS) == expected


def test_choose_targets_on_tuple_and_empty_members() -> None:
    assert choose_targets("2", ("a", "b", "c")) == ["b", "c"]
    assert choose_targets("all", ()) == []
    assert choose_targets("1", []) == []
    assert choose_targets("rank:0", []) == []


def test_choose_targets_returns_a_new_list() -> None:
    members = ["a", "b"]
    chosen = choose_targets("all", members)
    chosen.append("x")
    assert members == ["a", "b"]


# --------------------------------------------------------------------------- Event.due / schedule


def test_event_due() -> None:
    step_event, time_event = parse_events("step=3:join=1,t=2.5:kill=1")
    assert not step_event.due(2, 1000.0)
    assert step_event.due(3, 0.0)
    assert step_event.due(4, 0.0)
    assert not time_event.due(1000, 2.4)
    assert time_event.due(0, 2.5)
    assert time_event.due(0, 3.0)


def test_schedule_fires_in_order_once() -> None:
    schedule = EventSchedule(parse_events("step=2:join=1,step=2:leave=1,step=4:kill=rank:0"))
    assert schedule.pop_next(1, 0.0) is None
    first = schedule.pop_next(2, 0.0)
    second = schedule.pop_next(2, 0.0)
    assert (first.action, second.action) == ("join", "leave")
    assert schedule.pop_next(3, 0.0) is None
    third = schedule.pop_next(10, 0.0)
    assert third.action == "kill"
    assert schedule.pop_next(100, 1e9) is None
    assert schedule.pending == []


def test_later_due_event_never_overtakes_earlier_pending_one() -> None:
    # the second event is due by time long before the first is due by step
    events = parse_events("step=10:join=1,t=1:kill=1,step=2:leave=1")
    schedule = EventSchedule(events)
    for step in range(10):
        assert schedule.pop_next(step, 100.0) is None
        assert schedule.pending == events
    assert schedule.pop_next(10, 100.0) is events[0]
    assert schedule.pop_next(10, 100.0) is events[1]
    assert schedule.pop_next(10, 100.0) is events[2]
    assert schedule.pop_next(10, 100.0) is None


def test_pending_is_a_copy() -> None:
    schedule = EventSchedule(parse_events("step=1:join=1"))
    schedule.pending.clear()
    assert len(schedule.pending) == 1


def test_schedule_does_not_mutate_input() -> None:
    events = parse_events("step=1:join=1,step=2:join=1")
    schedule = EventSchedule(events)
    schedule.pop_next(5, 0.0)
    assert len(events) == 2


def test_a_resumed_schedule_skips_the_prefix_an_earlier_launch_fired() -> None:
    events = parse_events("step=30:kill=all,t=0:join=2,step=50:leave=1")
    schedule = EventSchedule(events)
    assert schedule.skip_fired(["step=30:kill=all", "t=0:join=2"]) == events[:2]
    assert schedule.pending == events[2:]
    # another schedule in the same folder: nothing matches, nothing is skipped
    other = EventSchedule(events)
    assert other.skip_fired(["step=20:kill=all"]) == [] and other.pending == events
    assert EventSchedule(events).skip_fired([]) == []


def test_can_add_workers_only_when_a_join_can_still_fire() -> None:
    schedule = EventSchedule(parse_events("step=1:leave=1,step=2:join=2,step=3:kill=1"))
    assert schedule.can_add_workers(step=5)
    assert not schedule.can_add_workers(step=1)  # the join waits for step 2, which needs workers
    schedule.pop_next(5, 0.0)
    assert schedule.can_add_workers(step=2)
    schedule.pop_next(5, 0.0)  # the join fires
    assert not schedule.can_add_workers(step=100)
    assert len(schedule.pending) == 1
    assert not EventSchedule([]).can_add_workers(0)
    assert not EventSchedule(parse_events("t=1:kill=all")).can_add_workers(0)
    # a time trigger needs no progress
    assert EventSchedule(parse_events("t=30:join=1")).can_add_workers(0)
    # events fire in order: a join behind an unreachable step trigger can never fire
    assert not EventSchedule(parse_events("step=9:kill=1,t=1:join=1")).can_add_workers(3)

@pytest.mark.parametrize("text, expected", [("3", (3, 3)), ("1:4", (1, 4)), ("2:2", (2, 2))])
def test_parse_workers_accepts_min_max_or_n(text, expected) -> None:
    assert parse_workers(text) == expected


@pytest.mark.parametrize("text", ["0:2", "3:1", "a:b", "1:2:3", "", "-1"])
def test_parse_workers_rejects_with_the_flag_named(text) -> None:
    with pytest.raises(ConfigError, match="--workers"):
        parse_workers(text)
    with pytest.raises(ConfigError, match="--size"):
        parse_workers(text, flag="--size")


def test_hang_is_an_action_with_a_target() -> None:
    (event,) = parse_events("step=4:hang=rank:1")
    assert (event.trigger, event.at, event.action, event.target) == ("step", 4.0, "hang", "rank:1")
    with pytest.raises(ConfigError, match="hang=0"):
        parse_events("step=4:hang=0")


def test_a_kill_that_reaches_no_worker_does_not_hold_up_the_next_event() -> None:
    """A member that is not a local process (started elsewhere) cannot be killed from here: the
    event says so, and the next event does not wait for that worker to be gone."""
    from types import SimpleNamespace

    from dyntrain.launch.runner import _fire, _settled

    said, requested = [], []
    coord = SimpleNamespace(
        current=SimpleNamespace(members=("w0", "w1")), note_request=requested.append,
        membership=SimpleNamespace(gone=set()), settled=lambda: True, phase=None)
    workers = SimpleNamespace(signal=lambda worker_id, action: worker_id == "w0")
    sink = SimpleNamespace(log=said.append)
    hit = _fire(parse_events("step=1:kill=rank:1")[0], coord, workers, sink)
    assert hit == [] and requested == ["w1"]
    assert said == ["event step=1:kill=rank:1: w1 is not a local process; not killed"]
    assert _settled(coord, ("kill", hit))
    assert _fire(parse_events("step=2:kill=rank:0")[0], coord, workers, sink) == ["w0"]
    assert not _settled(coord, ("kill", ["w0"]))  # until w0 is gone
