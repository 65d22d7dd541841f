"""The coordinator as a steppable state machine: a real TCPStore, a fake clock, no processes.

Fake workers write exactly what ``channel.WorkerChannel`` writes (inbox messages, the roster, a
heartbeat counter); the tests drive ``tick()`` by hand and read back what the coordinator wrote.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest
import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.admission import CanaryDigest
from dyntrain.elastic.membership.coordinator import Coordinator
from dyntrain.elastic.membership.members import CoordinatorConfig
from dyntrain.elastic.membership.phases import Phase

T0 = 1000.0
# what every fake worker says it computes with, and its canary: all the same
SETTINGS = {"torch": "2.13.0", "threads": 1, "cpu_capability": "AVX2"}
CANARY = CanaryDigest("d0", "c0")


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.metrics_rows: list[dict] = []
        self.logs: list[str] = []
        self.results: list[dict] = []
        self.numerics_records: list = []

    def event(self, record: dict) -> None:
        self.events.append(record)

    def metrics(self, record: dict) -> None:
        self.metrics_rows.append(dict(record))

    def log(self, line: str) -> None:
        self.logs.append(line)

    def result(self, record: dict) -> None:
        self.results.append(record)

    def numerics(self, record) -> None:
        self.numerics_records.append(record)


class FakeWorker:
    """Writes to the store what WorkerChannel writes, and nothing else."""

    def __init__(self, store: dist.Store, worker: str) -> None:
        self.store, self.id = store, worker
        self.seq = 0
        self.beating = True

    def send(self, msg: p.Message) -> None:
        self.send_raw(p.encode(self.id, msg))

    def send_raw(self, text: str) -> None:
        self.store.set(p.inbox_key(self.id, self.seq), text)
        self.seq += 1
        self.store.set(p.inbox_count_key(self.id), str(self.seq))

    def hello(self, fingerprint: str = "fp", config: dict | None = None) -> None:
        self.send(p.Hello(fingerprint, config or {"global_batch": 8}, host="hostA", pid=4242,
                          numerics=SETTINGS, canary=CANARY))
        self.store.append(p.ROSTER, self.id + " ")
        self.store.add(p.ROSTER_COUNT, 1)

    def beat(self) -> None:
        self.store.add(p.heartbeat_key(self.id), 1)

    def ready(self, gen: int, step: int | None, reason: str = "boundary") -> None:
        """``reason``: a ``ReadyReason``, or ``error: <what failed>``."""
        said, _, error = reason.partition(": ")
        self.send(p.Ready(gen, step, p.ReadyReason(said), error=error))

    def left(self, gen: int, step: int | None) -> None:
        self.send(p.Left(gen, step))

    def metrics(self, gen: int, step: int, **extra) -> None:
        self.send(p.Metrics(({"gen": gen, "step": step, "epoch": 0, "world_size": 0,
                              "total_steps": 100, "loss": 0.5, "samples_per_s": 10.0,
                              **extra},)))


class Job:
    """One coordinator over a fresh store, with fake workers and a hand-driven clock."""

    def __init__(self, store: dist.Store, *, min_workers: int = 1, max_workers: int = 8,
                 expected_initial: int = 1, settle_seconds: float = 2.0,
                 failure_timeout: float = 10.0, stall_gap: float | None = math.inf,
                 checkpoint: tuple[int, str] | None = None) -> None:
        self.store = store
        self.clock = FakeClock()
        self.sink = RecordingSink()
        self.checkpoint = checkpoint
        self.find_calls = 0
        self.config = CoordinatorConfig(min_workers, max_workers, expected_initial,
                                        settle_seconds, failure_timeout,
                                        # the harness ticks seconds apart: by default no gap
                                        # counts as the coordinator's own stall
                                        stall_gap)
        self.coord = Coordinator(store, self.config, self.sink, self._find, clock=self.clock)
        self.w: dict[str, FakeWorker] = {}

    def _find(self) -> tuple[int, str] | None:
        self.find_calls += 1
        return self.checkpoint

    def hello(self, *ids: str, fingerprint: str = "fp") -> None:
        for wid in ids:
            self.w[wid] = FakeWorker(self.store, wid)
            self.w[wid].hello(fingerprint)

    def tick(self, dt: float = 0.0) -> Phase:
        """Beating workers beat, then the coordinator polls ``dt`` seconds after its last poll."""
        return self._poll(dt)

    def freeze(self, dt: float) -> Phase:
        """The coordinator does not run for ``dt`` seconds (its host is frozen), then polls."""
        self.clock.now += dt
        return self.coord.tick()

    def _poll(self, dt: float) -> Phase:
        self.clock.now += dt
        for worker in self.w.values():
            if worker.beating:
                worker.beat()
        return self.coord.tick()

    @property
    def phase(self) -> Phase:
        return self.coord.phase

    def latest(self) -> int:
        return int(self.store.get(p.GEN_LATEST))

    def gen(self, number: int | None = None) -> p.Generation:
        number = self.latest() if number is None else number
        return p.Generation.from_json(self.store.get(p.gen_key(number)))

    def has(self, key: str) -> bool:
        return self.store.check([key])

    def ctl(self, number: int, wid: str) -> str | None:
        key = p.ctl_key(number, wid)
        return self.store.get(key).decode() if self.has(key) else None

    def job_state(self) -> str:
        return self.store.get(p.JOB_STATE).decode()

    def kinds(self) -> list[str]:
        return [e["event"] for e in self.sink.events]

    def start(self, *ids: str, step: int = 0) -> p.Generation:
        """Form a fresh generation 0 of ``ids`` and let it run to ``step`` (metrics 1..step)."""
        self.hello(*ids)
        assert self.tick() is Phase.RUNNING
        gen = self.gen(0)
        assert gen.members == ids
        leader = self.w[ids[0]]
        for s in range(1, step + 1):
            leader.metrics(0, s)
        self.tick()
        return gen


@pytest.fixture
def store():
    # the bound on the master's own connection holds on a loaded 2-core machine (seen: 5 s
    # was not enough at load average 25)
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=60))


@pytest.fixture
def job(store):
    return Job(store)


# ---- initial formation ------------------------------------------------------------------------


def test_initial_formation_waits_for_expected_initial_hellos(store):
    job = Job(store, min_workers=2, expected_initial=3)
    assert job.latest() == -1 and job.job_state() == "running"
    job.hello("a", "b")
    assert job.tick() is Phase.WAITING
    assert job.tick(1.0) is Phase.WAITING  # quiet for 1 s < settle_seconds
    assert job.latest() == -1 and not job.has(p.gen_key(0))
    job.hello("c")
    assert job.tick() is Phase.RUNNING
    assert job.latest() == 0
    gen = job.gen(0)
    assert gen.members == ("a", "b", "c") and gen.start_step == 0
    assert gen.fresh and gen.source == "a" and gen.receivers == ("b", "c")
    assert gen.checkpoint is None
    assert [job.ctl(0, w) for w in "abc"] == ["run"] * 3
    assert job.find_calls == 1
    # the start is reported once the new world completed a step, not before
    assert job.sink.events == [] and not job.coord.settled()
    job.clock.now += 2.5
    job.w["a"].metrics(0, 1)
    job.tick()
    (start,) = job.sink.events
    assert start["event"] == "start" and start["workers"] == ["a", "b", "c"]
    assert start["world_before"] == 0 and start["world_after"] == 3
    assert start["generation"] == 0 and start["steps_redone"] == 0
    assert start["latency_s"] == pytest.approx(2.5)
    assert job.coord.settled()


def test_initial_formation_after_settle_seconds_of_quiet(store):
    job = Job(store, min_workers=2, expected_initial=4, settle_seconds=2.0)
    job.hello("a")
    assert job.tick(5.0) is Phase.WAITING  # alone: below min_workers however long it waits
    job.hello("b")
    assert job.tick() is Phase.WAITING
    assert job.tick(1.5) is Phase.WAITING
    job.hello("c")  # a new hello restarts the quiet period
    assert job.tick(1.0) is Phase.WAITING
    assert job.tick(1.5) is Phase.WAITING
    assert job.latest() == -1
    assert job.tick(0.5) is Phase.RUNNING  # 2 s after the last hello
    gen = job.gen(0)
    assert gen.members == ("a", "b", "c") and gen.fresh and gen.source == "a"


def test_generation_zero_resumes_from_checkpoint(store):
    job = Job(store, expected_initial=2, checkpoint=(40, "/ckpt/step-40.pt"))
    job.hello("a", "b")
    assert job.tick() is Phase.RUNNING
    gen = job.gen(0)
    assert gen.members == ("a", "b") and gen.checkpoint == "/ckpt/step-40.pt"
    assert gen.start_step == 40 and not gen.fresh and gen.source is None and gen.receivers == ()
    job.w["a"].metrics(0, 41)
    job.tick()
    assert job.sink.metrics_rows[-1]["recomputed"] is False
    (resume,) = job.sink.events
    assert resume["event"] == "resume" and resume["workers"] == ["a", "b"]
    assert resume["start_step"] == 40 and resume["steps_redone"] == 0


def test_worker_with_different_fingerprint_is_rejected(store):
    job = Job(store, expected_initial=2)
    job.hello("a")
    job.hello("b", fingerprint="other")
    assert job.tick() is Phase.WAITING  # the rejected hello does not count towards 2
    reply = store.get(p.reply_key("b")).decode()
    assert reply.startswith("reject:")
    assert not job.has(p.reply_key("a"))
    assert "b" in job.coord.membership.gone and "b" not in job.coord.live_workers()
    assert job.tick(2.0) is Phase.RUNNING  # min 1 worker, quiet for settle_seconds
    assert job.gen(0).members == ("a",)
    # still never a member, even when another worker joins later
    job.hello("c")
    job.tick()
    job.w["a"].ready(0, 0)
    job.tick()
    assert job.gen(1).members == ("a", "c")
    assert not job.has(p.ctl_key(0, "b")) and not job.has(p.ctl_key(1, "b"))


# ---- joins ------------------------------------------------------------------------------------


def test_join_while_running_reforms_and_reports_after_first_step(job):
    job.start("a", "b", step=5)
    assert job.kinds() == ["start"]
    job.clock.now += 1.0
    job.hello("c")
    assert job.tick() is Phase.REFORMING
    assert job.ctl(0, "a") == "reform" and job.ctl(0, "b") == "reform"
    assert job.ctl(0, "c") is None and job.latest() == 0
    assert not job.coord.settled()
    job.w["a"].ready(0, 5)
    assert job.tick(0.5) is Phase.REFORMING and job.latest() == 0  # b has not reported yet
    job.w["b"].ready(0, 5)
    assert job.tick(0.5) is Phase.RUNNING
    gen = job.gen(1)
    assert gen.members == ("a", "b", "c") and gen.start_step == 5
    assert gen.source == "a" and gen.receivers == ("c",) and not gen.fresh
    assert [job.ctl(1, w) for w in "abc"] == ["run"] * 3
    # a late metrics row of the old generation does not complete the join
    job.w["a"].metrics(0, 5)
    job.tick()
    assert job.kinds() == ["start"] and not job.coord.settled()
    job.clock.now += 2.0
    job.w["a"].metrics(1, 6)
    job.tick()
    assert job.kinds() == ["start", "join"]
    join = job.sink.events[-1]
    assert join["workers"] == ["c"] and join["world_before"] == 2 and join["world_after"] == 3
    assert join["generation"] == 1 and join["start_step"] == 5 and join["steps_redone"] == 0
    assert join["requested_at"] == pytest.approx(1.0)  # c's hello, relative to the start
    assert join["first_step_at"] == pytest.approx(4.0)
    assert join["latency_s"] == pytest.approx(3.0) and join["latency_s"] >= 0
    assert job.sink.metrics_rows[-1]["recomputed"] is False
    assert job.coord.settled()


def test_a_requested_join_counts_from_the_request_not_the_workers_hello(job):
    """A worker started for a join (an event, capacity that appeared) is slow to say hello (its
    script imports, loads data): the join's latency is what the user waited, from the request;
    ``detected_at`` is when the worker was ready."""
    job.start("a", "b", step=5)
    job.coord.expect_joiners(["c"], within=60.0, requested_at=job.clock.now)
    job.clock.now += 8.0  # the new worker's start-up
    job.hello("c")
    job.tick()
    job.w["a"].ready(0, 5)
    job.w["b"].ready(0, 5)
    job.tick(0.5)
    job.clock.now += 0.5
    job.w["a"].metrics(1, 6)
    job.tick()
    join = job.sink.events[-1]
    assert join["event"] == "join" and join["workers"] == ["c"]
    assert join["detected_at"] - join["requested_at"] == pytest.approx(8.0)
    assert join["latency_s"] == pytest.approx(join["first_step_at"] - join["requested_at"])
    assert join["latency_s"] > 8.0 and join["first_step_at"] - join["detected_at"] < 2.0
    # the request is spent: a crash of c later counts from its own detection
    job.clock.now += 1.0
    assert "c" not in job.coord.membership.requested


def test_a_worker_that_waited_on_standby_joins_counted_from_when_room_opened(store):
    """A worker ready long before the job had room (it waited on standby) takes a leaver's
    place: its join counts from the leave's request, not from its own hello minutes before."""
    job = Job(store, max_workers=2)
    job.start("a", "b", step=5)
    job.hello("c")  # the world is full: c waits
    assert job.tick() is Phase.RUNNING and job.coord.membership.joining == ["c"]
    job.clock.now += 60.0
    job.coord.note_request("b")
    job.w["b"].left(0, 6)
    job.tick()
    job.w["a"].ready(0, 6)
    job.tick(0.5)
    assert job.gen(1).members == ("a", "c")
    job.clock.now += 0.5
    job.w["a"].metrics(1, 7)
    job.tick()
    join = next(e for e in job.sink.events if e["event"] == "join")
    assert join["latency_s"] < 5.0, (join, job.sink.events)  # not the 60 s c waited


def test_join_waits_while_world_is_at_max_workers(store):
    job = Job(store, max_workers=2)
    job.start("a", "b", step=1)
    job.hello("c")
    assert job.tick() is Phase.RUNNING
    assert job.ctl(0, "a") == "run" and job.coord.membership.joining == ["c"]


def test_expect_joiners_holds_the_reform_until_all_said_hello(job):
    job.start("a", step=2)
    job.coord.expect_joiners(["c", "d"], within=5.0)
    job.hello("c")
    assert job.tick(1.0) is Phase.RUNNING
    assert job.ctl(0, "a") == "run"
    job.hello("d")
    assert job.tick(1.0) is Phase.REFORMING
    assert job.ctl(0, "a") == "reform"
    job.w["a"].ready(0, 2)
    job.tick()
    assert job.latest() == 1  # one re-form for both
    assert job.gen(1).members == ("a", "c", "d") and job.gen(1).receivers == ("c", "d")
    job.w["a"].metrics(1, 3)
    job.tick()
    assert job.kinds() == ["start", "join"] and job.sink.events[-1]["workers"] == ["c", "d"]


def test_expect_joiners_gives_up_at_the_deadline(job):
    job.start("a", step=2)
    job.coord.expect_joiners(["c", "d"], within=5.0)
    job.hello("c")
    assert job.tick(1.0) is Phase.RUNNING
    assert job.tick(3.9) is Phase.RUNNING  # 4.9 s of 5
    assert job.ctl(0, "a") == "run"
    assert job.tick(0.2) is Phase.REFORMING
    job.w["a"].ready(0, 2)
    job.tick()
    assert job.gen(1).members == ("a", "c")
    # the straggler arriving later is admitted by a re-form of its own
    job.hello("d")
    assert job.tick() is Phase.REFORMING
    assert job.ctl(1, "a") == "reform" and job.ctl(1, "c") == "reform"
    job.w["a"].ready(1, 2)
    job.w["c"].ready(1, 2)
    job.tick()
    assert job.gen(2).members == ("a", "c", "d")


# ---- leaves, drains, crashes ------------------------------------------------------------------


def test_graceful_leave_forms_generation_without_the_leaver(job):
    job.start("a", "b", "c", step=4)
    job.coord.note_request("b")
    job.clock.now += 1.0
    job.w["b"].left(0, 4)
    assert job.tick() is Phase.REFORMING
    assert "b" in job.coord.membership.gone
    job.w["a"].ready(0, 4)
    job.w["c"].ready(0, 4)
    assert job.tick() is Phase.RUNNING
    gen = job.gen(1)
    assert gen.members == ("a", "c") and gen.start_step == 4
    assert gen.source == "a" and gen.receivers == ()
    assert job.ctl(1, "b") is None
    assert job.kinds() == ["start"]
    job.clock.now += 1.0
    job.w["a"].metrics(1, 5)
    job.tick()
    leave = job.sink.events[-1]
    assert leave["event"] == "leave" and leave["workers"] == ["b"]
    assert leave["world_before"] == 3 and leave["world_after"] == 2
    assert leave["step"] == 4 and leave["steps_redone"] == 0
    assert leave["latency_s"] == pytest.approx(2.0)  # from note_request to the first step


def test_two_leaves_taken_in_by_one_re_formation_each_say_their_own_world(job):
    """b and c are told to leave 0.5 s apart and both leave after step 4: one re-formation
    4 -> 2, reported as two changes in the order asked for, 4 -> 3 and 3 -> 2."""
    job.start("a", "b", "c", "d", step=4)
    job.coord.note_request("b")
    job.clock.now += 0.5
    job.coord.note_request("c")
    job.clock.now += 1.0
    job.w["b"].left(0, 4)
    job.w["c"].left(0, 4)
    assert job.tick() is Phase.REFORMING
    job.w["a"].ready(0, 4)
    job.w["d"].ready(0, 4)
    assert job.tick() is Phase.RUNNING
    assert job.gen(1).members == ("a", "d")
    job.clock.now += 1.0
    job.w["a"].metrics(1, 5)
    job.tick()
    leaves = [e for e in job.sink.events if e["event"] == "leave"]
    assert [(e["workers"], e["world_before"], e["world_after"]) for e in leaves] == [
        (["b"], 4, 3), (["c"], 3, 2)]
    assert [e["generation"] for e in leaves] == [1, 1]
    assert [e["latency_s"] for e in leaves] == [pytest.approx(2.5), pytest.approx(2.0)]


def test_a_member_that_leaves_before_it_joined_its_generation_aborts_it(job):
    """The whole world is told to leave (a terminate), but the notices straddle a step: a and b
    leave after step 4, c and d report the boundary, generation 1 is formed of c and d. d,
    waiting for it, acts on its notice first and leaves without joining: c must not wait for d
    in the group's creation until the grace period's SIGKILL."""
    job.start("a", "b", "c", "d", step=4)
    job.w["a"].left(0, 4)
    job.w["b"].left(0, 4)
    job.w["c"].ready(0, 4)
    job.w["d"].ready(0, 4)
    assert job.tick() is Phase.RUNNING
    assert job.gen(1).members == ("c", "d")
    job.w["d"].left(0, 4)  # the generation it waited in (it never took part in 1)
    assert job.tick() is Phase.REFORMING
    assert job.ctl(1, "c") == "abort"
    assert job.ctl(1, "d") == "run"  # gone: nothing more to tell it
    job.w["c"].left(1, 4)  # c, aborted, acts on its own notice
    assert job.tick() is Phase.WAITING and job.latest() == 1


def test_a_member_leaving_at_the_boundary_does_not_abort_the_others(job):
    job.start("a", "b", "c", step=4)
    job.w["b"].left(0, 4)  # its leave flag went through the step's all-reduce: all know
    assert job.tick() is Phase.REFORMING
    assert job.ctl(0, "a") == "run" and job.ctl(0, "c") == "run"


def test_request_drain_sets_drain_for_that_member_only(job):
    job.start("a", "b", "c", step=3)
    job.coord.request_drain("b")
    assert [job.ctl(0, w) for w in "abc"] == ["run", "drain", "run"]
    assert job.tick() is Phase.RUNNING
    job.coord.request_drain("zz")  # not a member: nothing happens
    assert not job.has(p.ctl_key(0, "zz"))
    job.w["b"].left(0, 4)
    job.w["a"].ready(0, 4)
    job.w["c"].ready(0, 4)
    job.tick()
    assert job.gen(1).members == ("a", "c")
    job.w["a"].metrics(1, 5)
    job.tick()
    assert job.kinds() == ["start", "leave"] and job.sink.events[-1]["workers"] == ["b"]


def test_crash_aborts_and_restarts_from_most_advanced_survivor(job):
    job.start("a", "b", "c", step=8)  # the leader reported step 8 before it died
    job.coord.note_request("a")
    job.clock.now += 0.5
    job.coord.mark_dead("a", "exit code -9")
    assert job.phase is Phase.REFORMING
    assert job.ctl(0, "b") == "abort" and job.ctl(0, "c") == "abort"
    job.w["b"].ready(0, 6, reason="abort")
    assert job.tick() is Phase.REFORMING  # c unaccounted
    job.w["c"].ready(0, 7, reason="abort")
    assert job.tick() is Phase.RUNNING
    gen = job.gen(1)
    assert gen.members == ("b", "c") and gen.start_step == 7
    assert gen.source == "c" and gen.receivers == ("b",)
    assert job.ctl(1, "a") is None
    job.w["b"].metrics(1, 8)
    job.tick()
    assert job.sink.metrics_rows[-1]["recomputed"] is True
    assert job.kinds() == ["start", "crash"]
    crash = job.sink.events[-1]
    assert crash["workers"] == ["a"] and crash["reason"] == "exit code -9"
    assert crash["world_before"] == 3 and crash["world_after"] == 2
    assert crash["start_step"] == 7 and crash["steps_redone"] == 8 - 7
    assert crash["latency_s"] == pytest.approx(0.5)
    job.w["b"].metrics(1, 9)
    job.tick()
    assert job.sink.metrics_rows[-1]["recomputed"] is False
    job.coord.mark_dead("a", "again")  # already gone: no second crash
    assert job.phase is Phase.RUNNING


def test_error_ready_aborts_and_later_mark_dead_is_folded_into_it(job):
    job.start("a", "b", "c", step=3)
    job.w["b"].ready(0, 3, reason="error: connection reset by peer")
    assert job.tick() is Phase.REFORMING
    assert [job.ctl(0, w) for w in "abc"] == ["abort"] * 3
    job.w["a"].ready(0, 3, reason="abort")
    assert job.tick() is Phase.REFORMING  # c has said nothing and is not known dead yet
    assert job.latest() == 0
    job.coord.mark_dead("c", "exit code -9")
    assert job.tick() is Phase.RUNNING
    assert job.gen(1).members == ("a", "b") and job.gen(1).start_step == 3
    job.w["a"].metrics(1, 4)
    job.tick()
    crashes = [e for e in job.sink.events if e["event"] == "crash"]
    assert len(crashes) == 1
    assert crashes[0]["workers"] == ["c"] and crashes[0]["reason"] == "exit code -9"
    assert crashes[0]["world_before"] == 3 and crashes[0]["world_after"] == 2


def test_heartbeat_timeout_marks_only_the_silent_member_dead(store):
    job = Job(store, failure_timeout=10.0)
    job.start("a", "b", step=2)
    job.w["b"].beating = False
    assert job.tick(5.0) is Phase.RUNNING
    assert job.tick(5.0) is Phase.RUNNING  # exactly failure_timeout: not yet
    assert job.coord.live_workers() == ["a", "b"]
    assert job.tick(0.5) is Phase.REFORMING
    assert "b" in job.coord.membership.gone and "a" not in job.coord.membership.gone
    assert job.coord.live_workers() == ["a"]
    assert job.ctl(0, "a") == "abort"
    assert any("b" in line and "heartbeat" in line for line in job.sink.logs)
    job.w["a"].ready(0, 2, reason="abort")
    job.tick()
    assert job.gen(1).members == ("a",)
    for _ in range(5):  # a keeps beating: it is never timed out
        job.tick(8.0)
    assert job.phase is Phase.RUNNING and job.coord.live_workers() == ["a"]


def test_a_silence_longer_than_half_the_timeout_is_logged_as_a_near_miss(store):
    job = Job(store, failure_timeout=4.0)
    job.start("a", "b", step=2)
    job.w["b"].beating = False
    for _ in range(25):  # a beats every 0.1 s, b stays silent for 2.5 s
        job.tick(0.1)
    job.w["b"].beating = True
    assert job.tick(0.1) is Phase.RUNNING
    assert [line for line in job.sink.logs if "silent" in line] == [
        "worker b was silent for 2.5 s (lost after 4 s)"]


def test_a_leader_declared_dead_is_fenced_and_what_it_sends_later_is_refused(store):
    """The leader is cut off (no heartbeat), the other member goes on alone; when the leader
    comes back with what it did meanwhile (a step, a checkpoint, the end of the job), none of
    it counts: it is told it is dead, and its messages are refused even where the coordinator
    reads every inbox (``drain``)."""
    job = Job(store, failure_timeout=10.0)
    job.start("a", "b", step=4)
    job.w["a"].beating = False
    assert job.tick(10.5) is Phase.REFORMING
    assert job.store.get(p.reply_key("a")).decode() == "dead:no heartbeat for 10 s"
    assert job.ctl(0, "a") == "abort" and job.ctl(0, "b") == "abort"
    job.w["b"].ready(0, 4, reason="abort")
    assert job.tick() is Phase.RUNNING and job.gen(1).members == ("b",)
    job.w["b"].metrics(1, 5)
    job.tick()
    # the old leader comes back and reports as if its generation still ran
    job.w["a"].beating = True
    job.w["a"].metrics(0, 5, samples_per_s=1.0)
    job.w["a"].send(p.Checkpoint(0, 5, "/run/checkpoints/ckpt-5"))
    job.w["a"].send(p.Done(0, 5))
    job.w["a"].send(p.Result(0, {"accuracy": 0.0}))
    job.w["a"].ready(0, 5, reason="abort")
    assert job.tick() is Phase.RUNNING
    job.coord.drain()
    assert job.phase is Phase.RUNNING and job.job_state() == "running"
    assert [r["step"] for r in job.sink.metrics_rows] == [1, 2, 3, 4, 5]
    assert job.sink.metrics_rows[-1]["samples_per_s"] == 10.0  # b's row, not a's
    assert job.sink.results == [] and job.coord.job.last_checkpoint is None
    assert "a" not in job.coord.membership.ready and job.coord.live_workers() == ["b"]
    assert any("refused 'result' from a: it was declared dead" in line for line in job.sink.logs)


def test_messages_for_a_generation_that_is_over_are_refused(job):
    job.start("a", "b", step=3)
    job.coord.mark_dead("b", "exit code -9")
    job.w["a"].ready(0, 3, reason="abort")
    assert job.tick() is Phase.RUNNING and job.latest() == 1
    job.w["a"].metrics(0, 4)  # tagged with the abandoned generation
    job.w["a"].send(p.Checkpoint(0, 4, "/ckpt/4"))
    job.w["a"].send(p.Done(0, 4))
    assert job.tick() is Phase.RUNNING
    assert [r["step"] for r in job.sink.metrics_rows] == [1, 2, 3]
    assert job.coord.job.last_checkpoint is None
    assert any("refused 'done' from a: it is for generation 0, the current one is 1" in line
               for line in job.sink.logs)
    job.w["a"].metrics(1, 4)
    job.w["a"].send(p.Checkpoint(1, 4, "/ckpt/4"))
    job.w["a"].send(p.Done(1, 4))
    assert job.tick() is Phase.DONE
    assert job.sink.metrics_rows[-1]["step"] == 4
    assert job.coord.job.last_checkpoint == (4, "/ckpt/4")


def test_below_min_waits_and_a_new_hello_forms_again(store):
    job = Job(store, min_workers=2)
    job.start("a", "b", step=3)
    job.coord.mark_dead("b", "exit code 1")
    job.w["a"].ready(0, 3, reason="abort")
    assert job.tick() is Phase.WAITING
    assert any("waiting for workers" in line for line in job.sink.logs)
    assert job.latest() == 0 and not job.coord.settled()
    assert job.tick(1.0) is Phase.WAITING
    job.hello("c")
    assert job.tick() is Phase.RUNNING
    gen = job.gen(1)
    assert gen.members == ("a", "c") and gen.start_step == 3
    assert gen.source == "a" and gen.receivers == ("c",)


@pytest.mark.parametrize("checkpoint", [(6, "/ckpt/step-6.pt"), None])
def test_all_members_dead_then_a_joiner_starts_over(store, checkpoint):
    job = Job(store)
    job.start("a", "b", step=8)
    job.checkpoint = checkpoint  # written during generation 0
    job.coord.mark_dead("a", "exit code -9")
    job.coord.mark_dead("b", "exit code -9")
    assert job.tick() is Phase.WAITING
    assert job.latest() == 0
    job.hello("d")
    assert job.tick() is Phase.RUNNING
    gen = job.gen(1)
    assert gen.members == ("d",)
    if checkpoint:
        assert gen.checkpoint == "/ckpt/step-6.pt" and gen.start_step == 6 and not gen.fresh
        kind, redone = "resume", 2
    else:
        assert gen.fresh and gen.start_step == 0 and gen.source == "d" and gen.receivers == ()
        kind, redone = "start", 8
    job.w["d"].metrics(1, gen.start_step + 1)
    job.tick()
    assert job.sink.metrics_rows[-1]["recomputed"] is True
    assert sorted(job.kinds()) == sorted(["start", "crash", kind])  # one failure, one event
    crashes = [e for e in job.sink.events if e["event"] == "crash"]
    assert sorted(w for e in crashes for w in e["workers"]) == ["a", "b"]
    # the crash took the world from 2 to 0, and d's start (or resume) from 0 to 1
    assert all(e["steps_redone"] == redone and (e["world_before"], e["world_after"]) == (2, 0)
               for e in crashes)
    last = job.sink.events[-1]
    assert last["event"] == kind and last["workers"] == ["d"]
    assert (last["world_before"], last["world_after"]) == (0, 1)


def test_a_message_the_protocol_does_not_know_is_refused_and_the_job_goes_on(job):
    job.start("a", "b", step=2)
    job.w["a"].send_raw(json.dumps({"kind": "hullo", "worker": "a"}))
    job.w["a"].send_raw(json.dumps({"kind": "done", "worker": "a", "gen": 0}))
    job.w["a"].send_raw(json.dumps({"kind": "done", "worker": "b", "gen": 0, "step": 3}))
    job.w["a"].metrics(0, 3)
    job.w["b"].send_raw("{not json")
    assert job.tick() is Phase.RUNNING and job.job_state() == "running"
    assert job.sink.metrics_rows[-1]["step"] == 3  # what came after was read
    assert [line for line in job.sink.logs if line.startswith("refused")] == [
        "refused a message from a: unknown message kind 'hullo'",
        "refused a message from a: malformed 'done' message: step: missing",
        "refused a message from a: a 'done' message naming worker 'b' in the inbox of 'a'",
        "refused a message from b: not JSON: '{not json'"]


# ---- the end of the job -----------------------------------------------------------------------


def test_done_message_finishes_the_job(job):
    job.start("a", "b", step=9)
    job.w["a"].metrics(0, 10)
    job.w["a"].send(p.Done(0, 10))
    job.w["a"].send(p.Result(0, {"accuracy": 0.97}))
    assert job.tick() is Phase.DONE
    assert job.job_state() == "done" and job.phase.is_terminal()
    assert job.sink.results == []  # messages after "done" wait for drain()
    assert job.tick() is Phase.DONE
    job.coord.drain()
    assert job.sink.results == [{"accuracy": 0.97}]
    assert not job.coord.settled()


def test_an_exception_in_one_worker_is_that_workers_crash(job):
    job.start("a", "b", step=2)
    job.w["b"].send(p.Error("ValueError: bad batch"))
    assert job.tick() is Phase.REFORMING
    assert job.coord.job.last_error == "b: ValueError: bad batch"
    assert "b" in job.coord.membership.dead
    assert job.ctl(0, "a") == "abort"
    assert job.store.get("reply/b").decode() == "dead:raised ValueError: bad batch"
    job.w["a"].ready(0, 2, reason="abort")
    job.tick()
    assert job.latest() == 1 and job.gen(1).members == ("a",)


def test_settled_only_when_running_and_every_change_completed_a_step(job):
    assert not job.coord.settled()
    job.hello("a")
    job.tick()
    assert job.phase is Phase.RUNNING and not job.coord.settled()
    job.w["a"].metrics(0, 1)
    job.tick()
    assert job.coord.settled()
    job.hello("b")
    job.tick()
    assert not job.coord.settled()
    job.w["a"].ready(0, 1)
    job.tick()
    assert job.phase is Phase.RUNNING and not job.coord.settled()
    job.w["a"].metrics(1, 2)
    job.tick()
    assert job.coord.settled()


# ---- suspected bugs ---------------------------------------------------------------------------


def test_drain_survives_a_join_arriving_before_the_boundary(job):
    job.start("a", "b", step=3)
    job.coord.request_drain("b")
    job.hello("c")
    job.tick()
    assert job.ctl(0, "a") == "reform"
    assert job.ctl(0, "b") == "drain"


def test_join_is_reported_even_if_a_crash_precedes_its_first_step(job):
    job.start("a", "b", step=3)
    job.hello("c")
    job.tick()
    job.w["a"].ready(0, 3)
    job.w["b"].ready(0, 3)
    job.tick()
    assert job.gen(1).members == ("a", "b", "c")
    job.coord.mark_dead("b", "exit code -9")  # before generation 1 completed a step
    job.w["a"].ready(1, 3, reason="abort")
    job.w["c"].ready(1, 3, reason="abort")
    job.tick()
    assert job.gen(2).members == ("a", "c")
    job.w["a"].metrics(2, 4)
    job.tick()
    assert "join" in job.kinds()


def test_find_checkpoint_is_not_polled_while_nobody_can_form(store):
    job = Job(store)
    job.start("a", step=8)
    job.checkpoint = (6, "/ckpt/step-6.pt")
    job.coord.mark_dead("a", "exit code -9")
    job.tick()
    assert job.phase is Phase.WAITING
    calls = job.find_calls
    for _ in range(20):
        job.tick(0.01)
    assert job.find_calls == calls


def test_join_after_waiting_reports_world_it_joined(store):
    job = Job(store, min_workers=2)
    job.start("a", "b", step=3)
    job.coord.mark_dead("b", "exit code 1")
    job.w["a"].ready(0, 3, reason="abort")
    job.tick()
    job.hello("c")
    job.tick()
    job.w["a"].metrics(1, 4)
    job.tick()
    join = next(e for e in job.sink.events if e["event"] == "join")
    assert join["world_before"] == 1 and join["world_after"] == 2


def test_a_worker_frozen_together_with_the_coordinator_is_not_declared_dead(store):
    """The coordinator's host freezes (a stopped VM) with a worker on it: when both run again,
    the coordinator polls before the worker's next beat. The time the coordinator did not run
    is not the worker's silence (bench/multihost.py schedule 1803 lost a live worker so)."""
    job = Job(store, failure_timeout=3.0, stall_gap=None)
    job.start("a", step=2)
    for _ in range(10):
        job.tick(0.1)
    job.w["a"].beating = False
    assert job.freeze(9.0) is Phase.RUNNING
    assert any("did not run for 9.0 s" in line for line in job.sink.logs)
    job.w["a"].beating = True
    assert job.tick(0.1) is Phase.RUNNING and job.coord.live_workers() == ["a"]


def test_a_worker_that_stays_silent_after_the_coordinator_resumes_is_still_found(store):
    job = Job(store, failure_timeout=3.0, stall_gap=None)
    job.start("a", "b", step=2)
    job.tick(0.1)
    job.w["b"].beating = False
    job.tick(1.0)  # 1 s of b's silence seen before the freeze
    assert job.freeze(9.0) is Phase.RUNNING
    assert job.tick(1.5) is Phase.RUNNING  # 2.5 s of the 3 s seen
    assert job.tick(1.0) is Phase.REFORMING
    assert job.coord.live_workers() == ["a"]
