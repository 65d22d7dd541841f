"""The coordinator's pure parts without a store or a process: the membership's named sets and
the decisions over them, heartbeats, and the change log that becomes ``events.jsonl``."""

from __future__ import annotations

import pytest

from dyntrain.elastic import protocol as p
from dyntrain.elastic.membership.changes import Change, ChangeLog
from dyntrain.elastic.membership.members import (
    CoordinatorConfig,
    Membership,
    WorkerInfo,
    decide_forming,
)
from dyntrain.elastic.runs.rows import EventKind

GEN0 = p.Generation(0, ("a", "b"), 0, source="a", receivers=("b",), fresh=True)


def membership(*known: str, current: p.Generation | None = GEN0) -> Membership:
    m = Membership(current=current)
    for worker in known:
        m.list_worker(worker, 0.0)
    return m


def no_checkpoint() -> None:
    raise AssertionError("a checkpoint was looked for")


def test_named_sets_move_a_worker_from_joining_to_gone_or_fenced():
    m = membership("a", "b", "c", "d")
    m.joining.append("c")
    m.ready["d"] = 4
    m.leave("c")
    m.fence("d")
    assert m.joining == [] and m.ready == {}
    assert m.gone == {"c", "d"} and m.dead == {"d"}
    assert m.live() == ["a", "b"] and m.watched() == ["a", "b"]
    assert not m.list_worker("a", 1.0)  # already listed: no new heartbeat counter
    m.await_reattach(["e"], 5.0)
    assert m.live() == ["a", "b", "e"] and m.watched() == ["a", "b"]  # e has no keys here
    assert m.list_worker("e", 6.0) and m.watched() == ["a", "b", "e"]


def test_a_report_of_an_older_generation_only_readies_a_waiting_worker():
    m = membership("a", "b")
    assert not m.reported("a", p.Ready(gen=7, step=3))
    assert m.ready == {"a": 3}
    m.joining.append("c")
    assert not m.reported("c", p.Ready(gen=7, step=None))
    assert "c" not in m.ready
    m.still_running.add("b")
    assert m.reported("b", p.Ready(gen=0, step=4))
    assert m.ready == {"a": 3, "b": 4} and m.still_running == set()
    assert m.accounted()


def test_joiners_are_admitted_once_every_announced_one_said_hello_or_time_is_up():
    cfg = CoordinatorConfig(min_workers=1, max_workers=3)
    m = membership("a", "b")
    assert not m.admission_due(cfg.max_workers, 0.0)  # nobody waits
    m.joining.append("c")
    m.expected, m.expect_deadline = {"c", "d"}, 10.0
    m.hello_at["c"] = 1.0
    assert not m.admission_due(cfg.max_workers, 9.9)  # d is still on its way
    assert m.admission_due(cfg.max_workers, 10.0)
    m.hello_at["d"] = 2.0
    assert m.admission_due(cfg.max_workers, 2.0)
    assert not m.admission_due(2, 2.0)  # no room: the world is at max_workers


def test_forming_the_first_generation_waits_for_enough_workers_or_quiet():
    cfg = CoordinatorConfig(min_workers=2, max_workers=4, expected_initial=3,
                            settle_seconds=2.0)
    m = membership("a", "b", current=None)
    m.joining, m.last_hello = ["a", "b"], 10.0
    assert decide_forming(m, cfg, 11.0, no_checkpoint).generation is None
    forming = decide_forming(m, cfg, 12.0, lambda: None)
    assert forming.generation == p.Generation(0, ("a", "b"), 0, source="a", receivers=("b",),
                                              fresh=True)


def test_forming_releases_a_drained_worker_and_says_when_too_few_are_left():
    cfg = CoordinatorConfig(min_workers=2, max_workers=4)
    m = membership("a", "b")
    m.ready = {"a": 5, "b": 5}
    m.draining = {"b"}
    forming = decide_forming(m, cfg, 0.0, no_checkpoint)
    assert forming.release == ["b"] and forming.generation is None and forming.short == 1


def test_forming_resumes_from_a_checkpoint_only_when_nobody_holds_state():
    cfg = CoordinatorConfig(min_workers=1, max_workers=4)
    m = membership("a", "b")
    m.ready = {"a": None, "b": 6}
    assert decide_forming(m, cfg, 0.0, no_checkpoint).generation.source == "b"
    m.ready = {"a": None}
    m.gone = {"b"}
    gen = decide_forming(m, cfg, 0.0, lambda: (4, "ckpt-4")).generation
    assert (gen.number, gen.members, gen.checkpoint, gen.start_step) == (1, ("a",), "ckpt-4", 4)


def test_nothing_forms_while_announced_workers_are_on_their_way_and_nobody_runs():
    cfg = CoordinatorConfig(min_workers=1, max_workers=4)
    m = membership("a", current=None)
    m.joining = ["a"]
    m.expected, m.expect_deadline = {"a", "b"}, 5.0
    m.hello_at["a"] = 0.0
    assert decide_forming(m, cfg, 4.0, no_checkpoint).generation is None
    assert decide_forming(m, cfg, 5.0, lambda: None).generation.members == ("a",)


def test_install_makes_the_generation_current_and_names_who_joined_with_it():
    m = membership("a", "b", "c")
    m.joining, m.ready, m.hello_at = ["c"], {"a": 3, "b": 3}, {"a": 0.0, "b": 0.0, "c": 2.0}
    gen1 = p.Generation(1, ("a", "b", "c"), 3, source="a", receivers=("c",))
    assert m.install(gen1) == ["c"]
    assert m.current is gen1 and m.joining == [] and m.ready == {}


def test_a_re_attached_worker_trains_on_or_waits():
    m = membership("a", "b", current=None)
    m.adopt(GEN0, 0.0)
    assert m.rejoined("a", p.Position(p.WorkerState.RUNNING, GEN0, 9))
    assert not m.survived()  # b has not re-attached yet
    assert not m.rejoined("b", p.Position(p.WorkerState.WAITING, GEN0, 8))
    assert m.ready == {"b": 8} and not m.survived()
    m.still_running.add("b")
    assert m.survived()


def test_a_heartbeat_is_overdue_past_the_timeout_and_a_near_miss_is_told():
    info = WorkerInfo(heartbeat_seen=0.0)
    assert info.beat(0, 0.0, timeout=4.0) is None  # the first reading
    assert info.beat(0, 1.5, timeout=4.0) is None
    assert info.beat(0, 2.5, timeout=4.0) is None
    assert info.beat(1, 2.6, timeout=4.0) == 2.5  # silent for 2.5 s > half the timeout
    assert info.overdue(6.6, 4.0, reattach_wait=10.0) is None  # exactly the timeout: not yet
    assert info.overdue(6.7, 4.0, reattach_wait=10.0) == 4.0
    before_restart = WorkerInfo(heartbeat_seen=0.0, listed=False)
    assert before_restart.overdue(9.0, 4.0, reattach_wait=10.0) is None
    assert before_restart.overdue(10.5, 4.0, reattach_wait=10.0) == 10.0


def test_one_failure_is_one_crash_and_a_removed_joiner_is_no_join():
    log = ChangeLog()
    log.add(Change(EventKind.JOIN, ["c"], 1.0, 1.0, 2))
    log.crash("a", requested=3.0, now=4.0, world=3, reason="exit code -9")
    log.crash("b", requested=2.0, now=4.5, world=3, reason="no heartbeat for 3 s")
    crash = next(c for c in log.pending if c.kind is EventKind.CRASH)
    assert crash.workers == ["a", "b"] and crash.requested_at == 2.0
    assert crash.fields["reason"] == "no heartbeat for 3 s"
    log.removed("c", now=5.0, world=1, why="unreachable")
    assert [c.kind for c in log.pending] == [EventKind.CRASH, EventKind.REMOVED]
    gen = p.Generation(1, ("d",), 7, source="d")
    log.published(gen, now=6.0, redone=2, origin="members")
    assert log.pending == [] and not log.settled()
    due = log.stepped(8.0, {"state_sync_s": 0.25, "group_connect_s": 0.125})
    assert [c.kind for c in due] == [EventKind.CRASH, EventKind.REMOVED]
    assert log.awaiting == [] and log.settled()
    record = due[0].record(started_at=1.0)
    assert record == {"event": "crash", "workers": ["a", "b"], "world_before": 3,
                      "requested_at": 1.0, "detected_at": 3.0,
                      "reason": "no heartbeat for 3 s", "generation": 1, "world_after": 1,
                      "start_step": 7, "steps_redone": 2, "origin": "members",
                      "state_sync_s": 0.25, "group_connect_s": 0.125, "reformed_at": 5.0,
                      "first_step_at": 7.0, "latency_s": 6.0}


def test_a_re_attached_generation_is_reported_at_its_first_step_after_the_rebuild():
    log = ChangeLog()
    log.went_on(Change(EventKind.REATTACH, ["a"], 0.0, 1.0, 2), GEN0, now=5.0)
    assert log.stepped(4.0, {}) == []  # a row from while the coordinator was away
    (change,) = log.stepped(5.5, {})
    assert change.fields["first_step_at"] == 5.5 and change.fields["steps_redone"] == 0


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_change_kind_is_an_event_name(kind):
    assert kind.value == kind.name.lower()
