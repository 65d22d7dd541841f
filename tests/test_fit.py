"""What fits one machine: local workers of ``dyntrain run`` and a local compute environment."""

from dyntrain.launch.events import parse_events
from dyntrain.launch.fit import (
    WORKER_MIB,
    Machine,
    cores_note,
    local_workers,
    memory_refusal,
    nproc_refusal,
)
from dyntrain.service.core.fit import machine_note, slot_refusal, slots_that_fit
from dyntrain.service.core.model import ComputeEnvironmentSpec, Resources


def test_nproc_up_to_max_starts_and_above_it_is_refused():
    assert nproc_refusal(2, 2) is None and nproc_refusal(0, 1) is None
    assert nproc_refusal(500, 2) == ("--nproc 500 is more than --workers MAX 2: at most 2 "
                                     "workers train at once; start at most 2, or raise MAX")


def test_local_workers_count_the_joins_of_the_events():
    events = parse_events("step=5:join=2,step=9:kill=1,t=30:join=1")
    assert local_workers(2, events) == 5
    assert local_workers(3, []) == 3


def test_memory_refuses_what_does_not_fit_and_says_how_many_do():
    machine = Machine(cores=2, available_mib=10 * WORKER_MIB + 1)
    assert memory_refusal(10, machine) is None
    said = memory_refusal(11, machine)
    assert said.startswith(f"11 local workers (--nproc) need at least {11 * WORKER_MIB} MiB")
    assert said.endswith(f"this machine has {10 * WORKER_MIB + 1} MiB available: at most 10 fit")
    assert "(--nproc and the joins of --events)" in memory_refusal(11, machine, joined=True)
    assert memory_refusal(10_000, Machine(cores=2, available_mib=None)) is None  # unknown


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
