"""A refused placement holds its job until the executor has more room (pure, no processes)."""

from __future__ import annotations

from dyntrain.service.core.executor import make_resources
from dyntrain.service.core.model import Resources
from dyntrain.service.core.placement import (
    RETRY_SECONDS,
    Refusal,
    refusal,
    still_held,
    with_released,
)

NONE = make_resources(0.0, 0, 0)


def test_a_refusal_is_the_jobs_reason_while_it_waits():
    r = refusal("worker w needs cpus=1 gpus=0 memory=1 MiB; free: cpus=0", NONE)
    assert r == Refusal("waiting for room on the executor: worker w needs cpus=1 gpus=0 "
                        "memory=1 MiB; free: cpus=0", NONE)


def test_a_job_is_held_until_some_resource_grows_past_what_was_free_when_refused():
    a, b = Refusal("a", make_resources(0.5, 0, 100)), Refusal("b", make_resources(0.25, 0, 100))
    refusals = {"a": a, "b": b}
    assert still_held(refusals, make_resources(0.25, 0, 100), 0.0) == refusals  # nothing freed
    assert still_held(refusals, make_resources(0.0, 0, 50), 0.0) == refusals  # less room: held
    assert still_held(refusals, make_resources(0.5, 0, 100), 0.0) == {"a": a}  # cpus for b's
    assert still_held(refusals, make_resources(0.25, 1, 100), 0.0) == {}  # a gpu came free
    assert still_held(refusals, make_resources(0.25, 0, 101), 0.0) == {}  # more memory


def test_what_is_free_once_the_started_part_of_a_placement_is_stopped():
    free = with_released(make_resources(0.25, 1, 512), Resources(0.5, 1, 256), 2)
    assert (free.cpus, free.gpus, free.memory_mib) == (1.25, 3, 1024)


def test_a_refusal_that_left_no_record_expires_one_that_did_waits_for_room():
    """Refused whole (no record), a job is offered again RETRY_SECONDS later whatever is free;
    refused in part (an attempt recorded), only once more is free."""
    whole = refusal("no room", NONE, now=100.0)
    part = refusal("no room", NONE)
    assert (whole.expires, part.expires) == (100.0 + RETRY_SECONDS, None)
    refusals = {"whole": whole, "part": part}
    assert still_held(refusals, NONE, 100.0 + RETRY_SECONDS - 1) == refusals
    assert still_held(refusals, NONE, 100.0 + RETRY_SECONDS) == {"part": part}
    assert still_held(refusals, NONE, 1e12) == {"part": part}
