"""How a running attempt ends: its claims and its workers' exits become one ``Ending``."""

from __future__ import annotations

from dyntrain.service.core.executor import WorkerExit
from dyntrain.service.core.lifecycle import Ending, EndKind
from dyntrain.service.core.model import WorkerState
from dyntrain.service.core.records import WorkerRecord
from dyntrain.service.engine.attempts import Attempt, AttemptTable, CoordinatorEnd


def attempt(**fields) -> Attempt:
    return Attempt("job", 1, 100.0, **fields)


def test_without_a_claim_the_last_exit_decides_with_the_stop_reason_first():
    a = attempt(last_exit=WorkerExit("w1", 3, None, "exited with code 3"))
    assert a.ending() == Ending(EndKind.EXITED, 3, "exited with code 3")
    a.stop("the main node exited")
    a.stop("a later reason is not kept")
    assert a.ending() == Ending(EndKind.EXITED, 3, "the main node exited")
    a.first_error = "error: ValueError"
    assert a.ending().error_line == "error: ValueError"


def test_a_main_nodes_exit_decides_a_multinode_attempt_and_names_its_own_reason():
    a = attempt(main_exit=WorkerExit("w0", 0, None, "exited with code 0"),
                last_exit=WorkerExit("w1", None, 15, "killed by SIGTERM"))
    a.stop("the main node exited")
    assert a.ending() == Ending(EndKind.EXITED, 0, "exited with code 0")


def test_the_strongest_claim_wins_and_a_terminate_keeps_its_own_reason():
    a = attempt(last_exit=WorkerExit("w0", 0, None, "exited with code 0"))
    a.claim(Ending(EndKind.TIMED_OUT, timeout_seconds=5))
    a.stop("timeout after 5s")
    assert a.ending() == Ending(EndKind.TIMED_OUT, 0, "timeout after 5s", 5)
    a.claim(Ending(EndKind.PREEMPTED))
    assert a.ending().kind is EndKind.PREEMPTED and a.ending().reason == "timeout after 5s"
    a.claim(Ending(EndKind.TERMINATED, reason="terminated by user"))
    assert a.terminated == "terminated by user"
    assert a.ending() == Ending(EndKind.TERMINATED, 0, "terminated by user")


def test_an_elastic_attempt_follows_its_coordinator():
    lost = WorkerExit("w1", None, None, "lost: node gone", lost=True)
    a = attempt(last_exit=lost)
    a.claim(Ending(EndKind.PREEMPTED))
    # training finished: a worker lost on the way asks no retry, and the job succeeded
    assert a.ending(CoordinatorEnd(done=True)) == Ending(EndKind.EXITED, 0, "lost: node gone")
    # not finished: a failure even when the last worker exited 0 (or was lost)
    b = attempt(last_exit=WorkerExit("w0", 0, None, "exited with code 0"))
    b.stop("every worker is gone")
    assert b.ending(CoordinatorEnd(done=False)) == Ending(EndKind.EXITED, 1,
                                                          "every worker is gone")
    failed = CoordinatorEnd(done=False, failed=True, failure="the run folder cannot be read")
    assert b.ending(failed).reason == "the run folder cannot be read"
    # a terminated job's code is its workers' own
    b.claim(Ending(EndKind.TERMINATED, reason="terminated by user"))
    assert b.ending(CoordinatorEnd(done=False)).exit_code == 0


def test_the_table_knows_which_attempt_a_worker_belongs_to():
    table = AttemptTable()
    a = attempt()
    a.workers["w0"] = WorkerRecord("w0", "job", 1, "local", "ON_DEMAND", 0.0, None,
                                   WorkerState.RUNNING, 100.0)
    table.add(a)
    table.own("w1", "job")
    assert table.of_worker("w0") is a and table.of_worker("w1") is a
    table.disown("w0")
    assert table.of_worker("w0") is None and "job" in table and table["job"] is a
    table.remove("job")
    assert table.of_worker("w1") is None and len(table) == 0
