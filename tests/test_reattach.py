"""Re-attaching to a restarted coordinator.

The rebuilt coordinator is stepped by hand over a real TCPStore with fake workers (as in
``test_coordinator``); the worker's side is a real ``WorkerChannel`` whose TCPStore server is
shut down and started again (same port, another job on that port, a new port found through the
run folder's ``coordinator.json``). The whole path with real processes and a SIGKILLed
``dyntrain server`` is ``tests/service/test_service_crash.py``.
"""

from __future__ import annotations

import gc
import json
import threading
from dataclasses import replace
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.membership.coordinator import REATTACH_WAIT
from dyntrain.elastic.membership.phases import Phase
from dyntrain.elastic.protocol import ENV_REATTACH
from dyntrain.elastic.runs.coordinator_file import write_coordinator_file
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.elastic.worker import channel
from dyntrain.elastic.worker.channel import CoordinatorGone, WorkerChannel
from dyntrain.testing.wait import wait_until
from test_coordinator import CANARY, SETTINGS, FakeWorker, Job

GEN3 = p.Generation(3, ("a", "b", "c"), 12, source="a")


@pytest.fixture
def store():
    """The restarted coordinator's store."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=60))


def reattach(w: FakeWorker, state: str, gen: p.Generation | None, step: int | None) -> None:
    """What WorkerChannel sends first to a restarted coordinator, then its roster entry."""
    w.send(p.Reattach(p.Hello("fp", {"global_batch": 8}, host="hostA", pid=7,
                              numerics=SETTINGS, canary=CANARY),
                      p.Position(p.WorkerState(state), gen, step)))
    w.store.append(p.ROSTER, w.id + " ")
    w.store.add(p.ROSTER_COUNT, 1)


def restarted(store: dist.Store, workers: str, highest_step: int) -> Job:
    job = Job(store)
    job.coord.expect_reattach(list(workers), highest_step)
    job.w = {wid: FakeWorker(store, wid) for wid in workers}
    return job


def test_members_that_trained_on_keep_their_generation(store):
    job = restarted(store, "abc", highest_step=20)
    reattach(job.w["a"], "running", GEN3, 25)
    job.w["a"].send(p.Metrics(tuple({"gen": 3, "step": s, "time": job.clock.now - 1}
                                    for s in range(18, 26)), replay=True))
    reattach(job.w["b"], "running", GEN3, 25)
    assert job.tick() is Phase.REFORMING and job.coord.awaits("c")
    assert job.ctl(3, "a") == "run"  # it trains on meanwhile
    assert [r["step"] for r in job.sink.metrics_rows] == [21, 22, 23, 24, 25]
    assert not any(r["recomputed"] for r in job.sink.metrics_rows)
    job.hello("x")  # a new worker waits until the old ones are accounted for
    reattach(job.w["c"], "running", GEN3, 25)
    assert job.tick(0.5) is Phase.REFORMING  # x's arrival ends the generation at a boundary
    assert job.latest() == -1 and job.ctl(3, "a") == "reform"  # nothing formed before that
    job.w["a"].metrics(3, 26, time=job.clock.now)
    job.tick()
    (event,) = job.sink.events
    assert event["event"] == "reattach" and event["workers"] == ["a", "b", "c"]
    assert event["generation"] == 3 and event["start_step"] == 25
    assert event["steps_redone"] == 0 and event["origin"] == "members"
    assert event["latency_s"] == pytest.approx(0.5)


def test_a_member_lost_meanwhile_ends_the_generation_and_the_furthest_state_goes_on(store):
    job = restarted(store, "abc", highest_step=20)
    reattach(job.w["a"], "waiting", GEN3, 24)  # c died under the collective of step 25
    reattach(job.w["b"], "waiting", GEN3, 25)  # b completed it, a did not
    job.w["a"].send(p.Metrics(tuple({"gen": 3, "step": s, "time": 0} for s in (23, 24)),
                              replay=True))
    assert job.tick(5.0) is Phase.REFORMING and job.latest() == -1
    job.w["c"].beating = False
    assert job.tick(5.5) is Phase.RUNNING  # c: no heartbeat for 10 s since the restart
    gen = job.gen(4)
    assert gen.members == ("a", "b") and gen.start_step == 25
    assert gen.source == "b" and gen.receivers == ("a",) and gen.checkpoint is None
    assert job.find_calls == 0  # no checkpoint was even looked for
    job.w["a"].metrics(4, 26, time=job.clock.now)
    job.tick()
    events = {e["event"]: e for e in job.sink.events}
    assert set(events) == {"crash", "reattach"}
    assert events["crash"]["workers"] == ["c"]
    assert events["reattach"]["steps_redone"] == 0 and events["reattach"]["generation"] == 4


def test_workers_of_the_previous_coordinator_get_time_to_re_attach(store):
    job = Job(store, failure_timeout=3.0)
    job.coord.expect_reattach(["a"], 10)
    job.tick(REATTACH_WAIT - 1)  # longer than the failure timeout: a still has time
    assert job.coord.awaits("a") and "a" not in job.coord.membership.gone
    job.tick(1.5)
    assert "a" in job.coord.membership.gone
    assert any(f"a lost: no heartbeat for {REATTACH_WAIT:g} s" in line for line in job.sink.logs)


def test_a_job_that_finished_meanwhile_is_done(store):
    job = restarted(store, "ab", highest_step=60)
    job.coord.mark_dead("b", "exit code 0")  # b ended while nobody watched
    reattach(job.w["a"], "done", GEN3, 66)
    assert job.tick() is Phase.DONE and job.job_state() == "done"


# ---- the worker's channel over a real store that goes away and comes back -------------------


def serve(tmp_path, job: str, port: int = 0) -> dist.TCPStore:
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    server.set(p.JOB_INFO, json.dumps({"out_dir": str(tmp_path), "job": job}))
    return server


def inbox(store: dist.Store, worker: str) -> list[p.Message]:
    key = p.inbox_count_key(worker)
    count = int(store.get(key)) if store.check([key]) else 0
    return [p.decode(store.get(p.inbox_key(worker, i)), worker) for i in range(count)]


def test_channel_trains_on_and_reattaches_to_its_own_job_only(tmp_path, monkeypatch):
    server = serve(tmp_path, "job-1")
    port = server.port
    position = [p.Position(p.WorkerState.RUNNING, GEN3, 3)]
    ch = WorkerChannel(f"127.0.0.1:{port}", "a", reattach_seconds=60, heartbeat_interval=0.05,
                       position=lambda: position[0])
    ch.hello("fp", {"global_batch": 8}, SETTINGS, CANARY)
    ch.watch(3)
    for step in (1, 2, 3):
        ch.send(p.Metrics(({"gen": 3, "step": step},)))
    ch.flush()
    del server
    gc.collect()  # the coordinator's host dies
    wait_until(lambda: ch.lost, what="the loss to be noticed")
    assert ch.ctl(3) == "run"  # no coordinator to say otherwise: the generation trains on
    ch.send(p.Metrics(({"gen": 3, "step": 4},)))
    position[0] = replace(position[0], step=4)
    probed: list[str] = []  # the stores the worker connected to while it looked for its job

    def connect_store(address: str, timeout: float) -> dist.Store:
        store = real_connect(address, timeout)
        probed.append(address)
        return store

    real_connect = channel.connect_store
    monkeypatch.setattr(channel, "connect_store", connect_store)
    stranger = serve(tmp_path, "job-2", port)  # someone else's store got the port
    # twice: the first look may have begun before the stranger served; the second came after
    # the first had read the stranger's job and turned away
    wait_until(lambda: probed.count(f"127.0.0.1:{port}"), "the worker to look at the stranger's "
               "store twice", 30, until=lambda looks: looks >= 2)
    assert not stranger.check([p.inbox_count_key("a")]) and ch.lost
    again = serve(tmp_path, "job-1")  # the restarted host, on another port: its file says so
    write_coordinator_file(tmp_path, f"127.0.0.1:{again.port}", "job-1")
    msgs = wait_until(lambda: (m := inbox(again, "a")) and len(m) >= 3 and m, what="re-attach")
    first, replay, backlog = msgs[:3]
    assert first.kind == "reattach" and first.hello.fingerprint == "fp"
    assert first.position.state == "running" and first.position.step == 4
    assert first.position.generation == GEN3
    assert replay.replay and [r["step"] for r in replay.rows] == [1, 2, 3]
    assert [r["step"] for r in backlog.rows] == [4]
    assert again.get(p.ROSTER).decode().split() == ["a"]
    assert ch.reattached == 1 and ch.lost is None
    again.set(p.ctl_key(3, "a"), p.Control.REFORM)
    wait_until(lambda: ch.ctl(3) == p.Control.REFORM, what="the new coordinator's word")
    ch.close()


def test_channel_gives_up_after_the_bound_with_a_one_line_reason(tmp_path):
    server = serve(tmp_path, "job-1")
    address = f"127.0.0.1:{server.port}"
    ch = WorkerChannel(address, "a", reattach_seconds=0.5, heartbeat_interval=0.05)
    del server
    gc.collect()
    wait_until(lambda: ch.gave_up, what="the worker to give up")
    with pytest.raises(CoordinatorGone) as err:
        ch.ctl(0)
    message = str(err.value)
    assert "\n" not in message and address in message
    assert "did not come back within 0.5 s" in message
    with pytest.raises(CoordinatorGone):
        ch.wait_generation(-1, lambda: False)


def test_a_worker_without_its_coordinator_exits_with_the_reason(tmp_path, monkeypatch):
    server = serve(tmp_path, "job-1")
    monkeypatch.setenv(ENV_REATTACH, "0.5")
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    model = torch.nn.Linear(2, 1)
    trainer = ElasticTrainer(
        TrainConfig(global_batch=4, chunk_size=2), model, torch.optim.SGD(model.parameters()),
        data, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
        coordinator=f"127.0.0.1:{server.port}", worker_id="a")
    host = [server]
    del server

    def die_once_it_waits() -> None:  # the worker said hello and waits to be admitted
        wait_until(lambda: host[0].check([p.ROSTER]), what="the hello")
        host.clear()
        gc.collect()

    threading.Thread(target=die_once_it_waits, daemon=True).start()
    with pytest.raises(SystemExit) as exit_:
        trainer.fit()  # in the main thread: it installs a SIGTERM handler
    reason = exit_.value.code
    assert isinstance(reason, str) and "\n" not in reason
    assert reason.startswith("dyntrain: worker a: lost the coordinator at 127.0.0.1:")
    assert "did not come back within 0.5 s" in reason


def test_a_coordinator_lost_between_the_hello_and_the_roster_is_said_as_such(tmp_path):
    """The window fc9 hit: the coordinator went away after the hello message and before the
    worker entered the roster; the worker said the store's traceback instead of the reason."""
    server = serve(tmp_path, "job-1")
    address = f"127.0.0.1:{server.port}"
    ch = WorkerChannel(address, "a", reattach_seconds=0.5, heartbeat_interval=0.05)
    host = [server]
    del server

    class GoneAtTheRoster:  # the worker's store, whose server ends just before the roster entry
        def __init__(self, store) -> None:
            self.store = store

        def __getattr__(self, name):
            return getattr(self.store, name)

        def append(self, key, value):
            host.clear()
            gc.collect()  # the store's server ends with its last reference
            return self.store.append(key, value)

    ch.store = GoneAtTheRoster(ch.store)
    with pytest.raises(CoordinatorGone) as err:
        ch.hello("f", {}, SETTINGS, CANARY)
    message = str(err.value)
    assert "\n" not in message and f"lost the coordinator at {address}" in message
    assert "did not come back within 0.5 s" in message
    ch.close()
