"""Fencing: an abandoned generation's collectives can no longer write anything anyone reads.

Three real processes over real gloo sockets (``scripts/fence_member.py``): generation 0 is
{0, 1, 2}; member 2 stands still (as a frozen process, or one behind a network partition, would)
while 0 and 1 have started an exact ring sum and an all-reduce; they give generation 0 up, close
its group and go on as generation 1. Then member 2 comes back and does its part of generation 0.
Nothing of it may land: generation 1's sums stay exact, generation 0's buffers stay as they were
when its group was closed, and member 2's late collectives fail (the survivors' sockets are
gone).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from conftest import ROOT, SCRIPTS
from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.step.stepper import ChunkStepper
from dyntrain.elastic.worker.channel import Fenced, WorkerChannel
from dyntrain.elastic.worker.rejoin import next_worker_id
from test_stepper import dataset, loss_fn, make_worker

CPU = torch.device("cpu")


def test_a_late_member_of_an_abandoned_generation_reaches_nothing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master = dist.TCPStore("127.0.0.1", port, 3, True, timeout=timedelta(seconds=60),
                           wait_for_workers=False)
    procs = [subprocess.Popen([sys.executable, str(SCRIPTS / "fence_member.py"), str(rank),
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for rank in range(3)]
    try:
        found = [proc.communicate(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
        del master
    said = [f"member {rank}: exit {proc.returncode}, {out.strip()[-300:]}, {err[-1500:]}"
            for rank, (proc, (out, err)) in enumerate(zip(procs, found, strict=True))]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(said)
    got = [json.loads(out.splitlines()[-1]) for out, _ in found]
    for rank in (0, 1):
        assert got[rank]["exact"] == [True] * 20, got
        assert got[rank]["untouched"] == ["out", "meta"], f"a late write landed on {rank}"
        assert got[rank]["abandoned"] == "failed", got  # severed: not pending until a timeout
    assert got[2] == {"ring": "failed", "allreduce": "failed"}, got


def test_each_generation_sums_into_buffers_of_its_own():
    """The stepper's gradient buffers belong to the group of the step: what the previous,
    closed, generation's collectives write during the next generation's step changes nothing."""
    config = TrainConfig(global_batch=40, chunk_size=5)
    reference, fenced = make_worker(), make_worker()
    expected = ChunkStepper(config, reference, dataset(), loss_fn, CPU)
    stepper = ChunkStepper(config, fenced, dataset(), loss_fn, CPU)
    chunks = range(config.num_chunks)
    previous: dict[str, torch.Tensor] = {}
    for step in range(6):
        expected.apply(expected.compute(step, chunks))
        group = Group(None, 0, 1, CPU)  # one generation per step
        red = stepper.start(step, chunks, group)
        for tensor in previous.values():  # a late completion of the closed generation
            tensor.fill_(float("nan"))
        stepper.finish(red, False, False, lambda: False)
        previous = dict(group.buffers)
        assert previous, "the step took no buffers from its generation"
        group.close(abandoned=True)
    for a, b in zip(reference.model.state_dict().values(), fenced.model.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)


def test_a_worker_asks_the_coordinator_before_it_writes_and_learns_it_was_declared_dead():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))

    def put(key: str, value: str) -> None:
        # a set is not answered: a check on the same connection returns once it is applied,
        # so that the channel's next read (another connection) sees it
        store.set(key, value)
        assert store.check([key])

    put(p.JOB_STATE, "running")
    put(p.GEN_LATEST, "-1")
    ch = WorkerChannel(f"127.0.0.1:{store.port}", "w1")
    try:
        assert ch.confirm(3) is None  # not (yet) a member there: cannot say
        put(p.ctl_key(3, "w1"), p.Control.RUN)
        assert ch.confirm(3) is True and ch.confirm(None) is True
        put(p.ctl_key(3, "w1"), p.Control.ABORT)
        assert ch.confirm(3) is False
        put(p.reply_key("w1"), p.Reply(p.ReplyKind.DEAD, "no heartbeat for 10 s").encode())
        assert ch.confirm(None) is False
        with pytest.raises(Fenced, match=r"declared dead \(no heartbeat for 10 s\)"):
            ch.wait_generation(-1, lambda: False)
    finally:
        ch.close()


def test_a_worker_declared_dead_starts_over_under_a_new_id_or_says_why_not():
    assert [next_worker_id(w) for w in ("w3", "w3.r1", "ip-10-0-0-7.r9", "a.r")] == [
        "w3.r1", "w3.r2", "ip-10-0-0-7.r10", "a.r.r1"]
    code = ("from dyntrain.elastic.worker.rejoin import start_over; "
            "start_over('w3', 'declared dead (no heartbeat for 2 s)')")
    env = {k: v for k, v in os.environ.items() if k != p.ENV_WORKER_ARGV}
    alone = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60)
    assert alone.returncode == 1
    assert alone.stderr.strip().splitlines() == [
        "dyntrain: worker w3 was declared dead (no heartbeat for 2 s) while it was cut off; "
        "the generation it was in was abandoned and nothing it did since counts; start it "
        "again to re-join as a new worker"]
    again = [sys.executable, "-c", "import os; print(os.getpid(), os.environ["
             f"'{p.ENV_WORKER_ID}'])"]
    proc = subprocess.run([sys.executable, "-c", f"import os; print(os.getpid()); {code}"],
                          env={**env, p.ENV_WORKER_ARGV: json.dumps(again)},
                          capture_output=True, text=True, timeout=60)
    first, second = proc.stdout.splitlines()
    assert proc.returncode == 0 and second == f"{first} w3.r1"  # the same process, new id
    assert "starting over as the new worker w3.r1" in proc.stderr


def test_a_slow_close_says_so_with_every_threads_stack(capfd):
    """A teardown stuck past its bound names what it waits for and where every thread is (the
    300 s re-shard stall had no trace); one that ends in time says nothing."""
    import threading

    from dyntrain.elastic.collective.comm import watch_slow

    stuck = threading.Event()

    def waiting_in_gloo() -> None:
        stuck.wait(30)

    thread = threading.Thread(target=waiting_in_gloo, name="pretend-gloo-work")
    thread.start()
    try:
        watch = watch_slow(lambda: "rank 1: closing a process group (dropping it)", 0.05)
        watch.join(10)  # the timer thread ends once it has reported
        err = capfd.readouterr().err
        said = "dyntrain: rank 1: closing a process group (dropping it) has taken over 0.05 s"
        assert said in err
        assert "in waiting_in_gloo" in err  # the stuck thread's own frame is in the dump
    finally:
        stuck.set()
        thread.join()
    quick = watch_slow(lambda: "never said", 5)
    quick.cancel()
    quick.join(10)
    assert "never said" not in capfd.readouterr().err


def test_an_abandoned_group_whose_destructor_waits_does_not_hold_up_the_next_generation():
    """A group's destructor that waits (gloo joining a thread stuck in an operation severing
    did not fail) runs on a thread of its own: close returns at once, the process waits for it
    only before it exits (``wait_for_drops``)."""
    import threading
    import time

    import torch

    from dyntrain.elastic.collective.comm import Group, wait_for_drops

    released, destroyed = threading.Event(), threading.Event()

    class StuckGroup:  # what close uses of a process group, and a destructor that waits
        def name(self) -> str:
            return "stuck"

        def abort(self) -> None:
            pass

        def __del__(self) -> None:
            released.wait(60)
            destroyed.set()

    group = Group(StuckGroup(), 0, 2, torch.device("cpu"))
    began = time.monotonic()
    group.close(abandoned=True)
    assert time.monotonic() - began < 1.0 and group.pg is None
    assert not destroyed.is_set() and not wait_for_drops(timeout=0.05)  # still dropping
    released.set()
    assert wait_for_drops(timeout=30) and destroyed.is_set()
