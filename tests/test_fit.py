"""What fits one machine: local workers of ``dyntrain run`` and a local compute environment."""

import json
import time
from io import StringIO

from dyntrain.elastic.runs.storage import open_store
from dyntrain.launch import runner
from dyntrain.launch.events import parse_events
from dyntrain.launch.fit import (
    FORKED_WORKER_MIB,
    WORKER_MIB,
    Machine,
    cores_note,
    join_fit,
    memory_refusal,
    nproc_refusal,
    peak_local_workers,
    peak_note,
)
from dyntrain.launch.sink import RunSink
from dyntrain.service.core.fit import machine_note, slot_refusal, slots_that_fit
from dyntrain.service.core.model import ComputeEnvironmentSpec, Resources


def test_nproc_up_to_max_starts_and_above_it_is_refused():
    assert nproc_refusal(2, 2) is None and nproc_refusal(0, 1) is None
    assert nproc_refusal(500, 2) == ("--nproc 500 is more than --workers MAX 2: at most 2 "
                                     "workers train at once; start at most 2, or raise MAX")


def test_local_workers_are_counted_alive_at_once_not_every_one_ever_started():
    events = parse_events("step=5:join=2,step=9:kill=1,t=30:join=1")
    assert peak_local_workers(2, events) == 4  # 2 -> 4 -> 3 -> 4
    assert peak_local_workers(3, []) == 3
    # a wave of kills then a wave of joins back: never more than the first 64
    waves = parse_events("step=8:kill=32,step=16:join=32,step=24:leave=rank:0,step=30:join=1")
    assert peak_local_workers(64, waves) == 64
    assert peak_local_workers(4, parse_events("step=1:kill=all,step=2:join=3")) == 4
    assert peak_local_workers(1, parse_events("step=1:kill=9,step=2:join=3")) == 3


def test_memory_refuses_first_workers_that_do_not_fit_and_says_how_many_do():
    machine = Machine(cores=2, available_mib=10 * WORKER_MIB + 1)
    assert memory_refusal(10, machine, forked=False) is None
    said = memory_refusal(11, machine, forked=False)
    assert said.startswith(f"11 local workers (--nproc and --standby) need at least "
                           f"{11 * WORKER_MIB} MiB")
    assert said.endswith(f"this machine has {10 * WORKER_MIB + 1} MiB available: at most 10 fit")
    assert memory_refusal(10_000, Machine(cores=2, available_mib=None), False) is None  # unknown


def test_forked_workers_count_what_they_add_beyond_the_fork_servers_pages():
    # the fork server once, then each forked worker's own pages
    machine = Machine(cores=2, available_mib=WORKER_MIB + 40 * FORKED_WORKER_MIB)
    assert memory_refusal(40, machine, forked=True) is None
    assert memory_refusal(40, machine, forked=False) is not None  # 40 fresh ones would not fit
    said = memory_refusal(41, machine, forked=True)
    assert f"about {FORKED_WORKER_MIB} MiB each beyond the fork server's {WORKER_MIB} MiB" in said
    assert said.endswith("at most 40 fit")
    # the joins of --events are not refused: said, and each join starts what fits when it fires
    joins = parse_events("step=5:join=20")
    assert peak_note(40, 40, machine, forked=True) is None
    assert peak_note(40, peak_local_workers(40, joins), machine, forked=True) == (
        "--events may bring up to 60 local workers at once; about 40 fit the memory available "
        "now: a join starts those that fit when it fires")


def test_a_join_starts_those_that_fit():
    assert join_fit(8, None, forked=True) == 8  # unknown: all
    assert join_fit(8, 3 * FORKED_WORKER_MIB + 1, forked=True) == 3
    assert join_fit(8, 3 * FORKED_WORKER_MIB + 1, forked=False) == 0
    assert join_fit(2, 10**6, forked=False) == 2


class _World:
    world_size = 5


class _Coordinator:
    """What firing a join uses of the coordinator."""

    def __init__(self) -> None:
        self.started_at, self.current, self.expected = time.time() - 3.0, _World(), None

    def clock(self) -> float:
        return time.time()

    def expect_joiners(self, workers, within, requested_at) -> None:
        self.expected = list(workers)


class _Workers:
    forks = True

    def __init__(self) -> None:
        self.started = 0

    def start(self) -> str:
        self.started += 1
        return f"w{self.started + 4}"


def test_a_join_that_finds_too_little_memory_starts_those_that_fit_and_says_so(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(runner, "memory_available_mib", lambda: 3 * FORKED_WORKER_MIB + 5)
    sink = RunSink(open_store(tmp_path / "run", "--out"), "?", StringIO(), quiet=True, every=1)
    coord, workers = _Coordinator(), _Workers()
    event = parse_events("step=8:join=8")[0]
    assert runner._fire(event, coord, workers, sink) == ["w5", "w6", "w7"]
    assert coord.expected == ["w5", "w6", "w7"]
    sink.close()
    row = json.loads((tmp_path / "run" / "events.jsonl").read_text().splitlines()[-1])
    assert row["event"] == "unstarted" and (row["asked"], row["started"]) == (8, 3)
    assert row["world_before"] == row["world_after"] == 5 and row["requested_at"] >= 3.0
    assert row["reason"] == (f"memory for 3 of 8 workers: {3 * FORKED_WORKER_MIB + 5} MiB "
                             f"available, about {FORKED_WORKER_MIB} MiB each (forked); "
                             "5 not started")
    # said in one line even with --quiet
    assert sink.stream.getvalue().count("\n") == 1
    assert "event step=8:join=8: memory for 3 of 8 workers" in sink.stream.getvalue()


def test_more_threads_than_cores_is_said_not_refused():
    assert cores_note(2, 1, 2) is None
    assert cores_note(4, 1, 2) == ("4 local worker(s) x 1 thread(s) share 2 core(s): slower, "
                                   "the same bits")
    assert cores_note(2, 2, 3) is not None


def test_a_local_compute_environment_against_its_machine():
    machine = Resources(cpus=2, gpus=0, memory_mib=4096)
    quarter = Resources(cpus=0.5, gpus=0, memory_mib=512)
    assert slots_that_fit(quarter, machine) == 4
    assert slots_that_fit(Resources(cpus=0.1, gpus=0, memory_mib=2048), machine) == 2
    assert slots_that_fit(Resources(cpus=0.1, gpus=1, memory_mib=64), machine) == 0
    # a vanishingly small slot (the cpus divide to infinity) is limited by its memory only
    assert slots_that_fit(Resources(cpus=5e-324, gpus=0, memory_mib=1024), machine) == 4
    fits = ComputeEnvironmentSpec("ok", slot=quarter, max_slots=4, desired_slots=4)
    assert slot_refusal(fits, machine) is None and machine_note(fits, machine) is None
    wide = ComputeEnvironmentSpec("wide", slot=quarter, max_slots=10)
    assert slot_refusal(wide, machine) is None
    assert machine_note(wide, machine) == ("this machine (cpus=2 gpus=0 memory=4096 MiB) holds 4 "
                                           "of its 10 slots at once; slots beyond 4 are never "
                                           "filled")
    huge = ComputeEnvironmentSpec("huge", slot=Resources(cpus=4, gpus=0, memory_mib=64))
    assert slot_refusal(huge, machine) == (
        "compute environment huge: one slot (cpus=4 gpus=0 memory=64 MiB) is larger than this "
        "machine (cpus=2 gpus=0 memory=4096 MiB, the local executor): no worker of it could "
        "start")
