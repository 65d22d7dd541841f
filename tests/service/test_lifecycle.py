"""Pure job-state transitions: dependencies, attempts, array parents, dependency cycles."""

from __future__ import annotations

import graphlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntrain.service.core.lifecycle import (
    AttemptOutcome,
    DependentJob,
    Ending,
    EndKind,
    Transition,
    after_attempt,
    after_ending,
    array_parent_status,
    check_acyclic,
    child_id,
    detect_cycle,
    resolve_dependencies,
)
from dyntrain.service.core.model import (
    Dependency,
    DependencyType,
    JobStatus,
    RetryAction,
    RetryRule,
    RetryStrategy,
    ValidationError,
)

S, F, R = JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.RUNNING
RUNNABLE, PENDING = JobStatus.RUNNABLE, JobStatus.PENDING
STANDARD, N_TO_N, SEQUENTIAL = (DependencyType.STANDARD, DependencyType.N_TO_N,
                                DependencyType.SEQUENTIAL)


def job(*deps, index=None):
    return DependentJob("me", tuple(Dependency(j, t) for j, t in deps), index)


# --- dependencies ------------------------------------------------------------------------

def test_no_dependencies_is_runnable():
    assert resolve_dependencies(job(), {}) == Transition(RUNNABLE, "no dependencies")


@pytest.mark.parametrize("status, expected", [
    (S, Transition(RUNNABLE, "dependencies succeeded")),
    (R, Transition(PENDING, "waiting for dependency a (RUNNING)")),
    (JobStatus.SUBMITTED, Transition(PENDING, "waiting for dependency a (SUBMITTED)")),
    (F, Transition(JobStatus.FAILED, "dependency a failed")),
])
def test_standard_dependency_on_a_plain_job(status, expected):
    assert resolve_dependencies(job(("a", STANDARD)), {"a": status}) == expected


def test_statuses_may_be_given_as_plain_strings():
    assert resolve_dependencies(job(("a", STANDARD)), {"a": "SUCCEEDED"}).status is RUNNABLE
    assert resolve_dependencies(job(("arr", STANDARD)), {"arr": ["SUCCEEDED", "FAILED"]}) == (
        Transition(F, "dependency arr:1 failed"))


def test_standard_dependency_on_an_array_waits_for_every_child():
    me = job(("arr", STANDARD))
    assert resolve_dependencies(me, {"arr": [S, S, S]}).status is RUNNABLE
    assert resolve_dependencies(me, {"arr": [S, R, S]}) == Transition(
        PENDING, "waiting for dependency arr:1 (RUNNING)")


def test_a_failed_child_fails_the_dependent_job_at_once():
    assert resolve_dependencies(job(("arr", STANDARD)), {"arr": [R, S, F]}) == Transition(
        F, "dependency arr:2 failed")


def test_any_failed_dependency_wins_over_pending_ones_listed_before_it():
    me = job(("a", STANDARD), ("b", STANDARD))
    assert resolve_dependencies(me, {"a": R, "b": F}) == Transition(F, "dependency b failed")
    assert resolve_dependencies(me, {"a": R, "b": S}).reason == "waiting for dependency a (RUNNING)"


def test_a_missing_dependency_fails_the_job():
    assert resolve_dependencies(job(("ghost", STANDARD)), {}) == Transition(
        F, "dependency ghost does not exist")


def test_n_to_n_child_waits_for_the_same_child_of_the_other_array():
    other = {"other": [S, S, R]}
    assert resolve_dependencies(job(("other", N_TO_N), index=1), other).status is RUNNABLE
    assert resolve_dependencies(job(("other", N_TO_N), index=2), other) == Transition(
        PENDING, "waiting for dependency other:2 (RUNNING)")
    assert resolve_dependencies(job(("other", N_TO_N), index=0), {"other": [F, S, S]}) == (
        Transition(F, "dependency other:0 failed"))
    assert resolve_dependencies(job(("other", N_TO_N), index=1), {"other": [F, S, S]}).status is (
        RUNNABLE)


def test_sequential_child_waits_for_the_previous_child_of_its_own_array():
    assert resolve_dependencies(job(("arr", SEQUENTIAL), index=0), {"arr": [R, PENDING]}).status \
        is RUNNABLE
    assert resolve_dependencies(job(("arr", SEQUENTIAL), index=2), {"arr": [S, R, PENDING]}) == (
        Transition(PENDING, "waiting for dependency arr:1 (RUNNING)"))
    assert resolve_dependencies(job(("arr", SEQUENTIAL), index=2), {"arr": [S, S, PENDING]}) \
        .status is RUNNABLE
    assert resolve_dependencies(job(("arr", SEQUENTIAL), index=2), {"arr": [S, F, PENDING]}) == (
        Transition(F, "dependency arr:1 failed"))


def test_array_child_combines_standard_and_n_to_n_dependencies():
    me = job(("setup", STANDARD), ("prep", N_TO_N), index=1)
    assert resolve_dependencies(me, {"setup": S, "prep": [R, S]}).status is RUNNABLE
    assert resolve_dependencies(me, {"setup": R, "prep": [R, S]}).status is PENDING
    assert resolve_dependencies(me, {"setup": S, "prep": [R, F]}).status is F


@pytest.mark.parametrize("me, statuses", [
    (job(("other", N_TO_N)), {"other": [S, S]}),  # not an array child
    (job(("other", N_TO_N), index=3), {"other": [S, S]}),  # other array too small
    (job(("other", N_TO_N), index=0), {"other": S}),  # other is not an array
])
def test_n_to_n_needs_two_arrays_of_the_same_size(me, statuses):
    with pytest.raises(ValidationError, match="N_TO_N"):
        resolve_dependencies(me, statuses)


def test_child_ids_follow_aws_batch():
    assert child_id("abc", 7) == "abc:7"


# --- attempts ---------------------------------------------------------------------------------

THREE = RetryStrategy(attempts=3)


def test_exit_zero_succeeds_and_counts_an_attempt():
    assert after_attempt("j", 0, "", False, THREE, 1) == AttemptOutcome(S, "exit code 0", True, 2)


def test_failures_retry_until_the_attempts_are_used_up():
    first = after_attempt("j", 3, "", False, THREE, 0)
    assert first == AttemptOutcome(RUNNABLE, "retrying after exit code 3 (attempt 1 of 3)", True, 1)
    last = after_attempt("j", 3, "", False, THREE, 2)
    assert last == AttemptOutcome(F, "exit code 3 (attempt 3 of 3)", True, 3)


def test_preemption_never_consumes_an_attempt():
    used = 2  # one attempt left
    for _ in range(20):
        out = after_attempt("j", 0, "spot capacity reclaimed", True, THREE, used)
        assert out == AttemptOutcome(RUNNABLE, "preempted: spot capacity reclaimed", False, used)
    assert after_attempt("j", None, "", True, RetryStrategy(attempts=1), 1).status is RUNNABLE
    assert after_attempt("j", 1, "", False, THREE, used).status is F  # a real failure still ends it


def test_preemption_without_a_reason_still_says_why():
    assert after_attempt("j", None, "", True, THREE, 0).reason == "preempted: capacity taken back"


def test_retry_rules_match_exit_code_and_reason_first_match_wins():
    rules = RetryStrategy(attempts=5, evaluate_on_exit=(
        RetryRule(RetryAction.EXIT, on_exit_code="2"),
        RetryRule(RetryAction.RETRY, on_reason="OutOfMemory*"),
        RetryRule(RetryAction.EXIT, on_exit_code="*"),
    ))
    assert after_attempt("j", 2, "", False, rules, 0) == AttemptOutcome(
        F, "exit code 2 (attempt 1 of 5; a retry rule says EXIT)", True, 1)
    assert after_attempt("j", 137, "OutOfMemory: worker 3", False, rules, 0).status is RUNNABLE
    assert after_attempt("j", 1, "segfault", False, rules, 0).status is F


def test_timeout_is_a_failure_with_its_own_reason():
    assert after_attempt("j", None, "", False, THREE, 0, timed_out_after=60) == AttemptOutcome(
        RUNNABLE, "retrying after timeout after 60s (attempt 1 of 3)", True, 1)
    no_retry_on_timeout = RetryStrategy(attempts=3, evaluate_on_exit=(
        RetryRule(RetryAction.EXIT, on_reason="timeout*"),))
    out = after_attempt("j", 0, "", False, no_retry_on_timeout, 0, timed_out_after=1.5)
    assert out == AttemptOutcome(F, "timeout after 1.5s (attempt 1 of 3; a retry rule says EXIT)",
                                 True, 1)


def test_an_attempt_without_exit_code_or_reason_says_so():
    assert after_attempt("j", None, "", False, RetryStrategy(), 0).reason == (
        "ended without an exit code (attempt 1 of 1)")


def test_negative_attempts_used_is_rejected():
    with pytest.raises(ValueError, match="attempts_used"):
        after_attempt("j", 1, "", False, THREE, -1)


def test_a_terminated_attempt_counts_and_fails_the_job_whatever_its_exit_code():
    ending = Ending(EndKind.TERMINATED, 0, "terminated by user", error_line="error: X")
    assert after_ending("j", ending, THREE, 0) == AttemptOutcome(F, "terminated by user", True, 1)
    assert ending.counts_as_retry and not ending.preempted


def test_a_failed_attempt_quotes_its_first_workers_error_line_and_a_success_does_not():
    failed = Ending(EndKind.EXITED, 1, "", error_line="w0 error: ValueError: bad")
    assert after_ending("j", failed, THREE, 0).reason == (
        "retrying after exit code 1 (attempt 1 of 3); w0 error: ValueError: bad")
    timed = Ending(EndKind.TIMED_OUT, None, "", timeout_seconds=5, error_line="error: slow")
    assert after_ending("j", timed, THREE, 2).reason == (
        "timeout after 5s (attempt 3 of 3); error: slow")
    ok = Ending(EndKind.EXITED, 0, "", error_line="error: noise")
    assert after_ending("j", ok, THREE, 0).reason == "exit code 0"
    preempted = Ending(EndKind.PREEMPTED, 1, "", error_line="error: noise")
    assert after_ending("j", preempted, THREE, 0) == AttemptOutcome(
        RUNNABLE, "preempted: capacity taken back", False, 0)
    assert not preempted.counts_as_retry


# --- array parents ----------------------------------------------------------------------------

@pytest.mark.parametrize("children, parent", [
    ([S, S, S], S),
    ([S, F, S], F),
    ([S, F, R], R),  # a failure waits for the rest to finish
    ([RUNNABLE, JobStatus.STARTING], R),
    ([S, RUNNABLE], R),
    ([PENDING, RUNNABLE], RUNNABLE),
    ([PENDING, PENDING], PENDING),
    ([JobStatus.SUBMITTED], JobStatus.SUBMITTED),
])
def test_array_parent_status(children, parent):
    assert array_parent_status(children) is parent


def test_array_parent_needs_children():
    with pytest.raises(ValueError):
        array_parent_status([])


# --- cycles -----------------------------------------------------------------------------------

def test_acyclic_graphs_have_no_cycle():
    assert detect_cycle({}) is None
    assert detect_cycle({"d": ["b", "c"], "b": ["a"], "c": ["a"], "a": []}) is None
    assert detect_cycle({"x": ["outside"]}) is None


def test_cycle_path_is_returned_closed():
    assert detect_cycle({"a": ["b"], "b": ["a"]}) == ["a", "b", "a"]
    assert detect_cycle({"a": ["a"]}) == ["a", "a"]
    assert detect_cycle({"x": ["c"], "c": ["d"], "d": ["e"], "e": ["c"]}) == ["c", "d", "e", "c"]


def test_long_chains_do_not_hit_the_recursion_limit():
    chain = {f"n{i}": [f"n{i + 1}"] for i in range(20_000)}
    assert detect_cycle(chain) is None
    chain["n20000"] = ["n0"]
    assert len(detect_cycle(chain)) == 20_002


def test_check_acyclic_names_the_cycle():
    check_acyclic({"a": ["b"]})
    with pytest.raises(ValidationError, match="dependency cycle: a -> b -> c -> a"):
        check_acyclic({"a": ["b"], "b": ["c"], "c": ["a"]})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdefgh"), st.lists(st.sampled_from("abcdefgh"),
                                                              max_size=3), max_size=8))
def test_detect_cycle_agrees_with_graphlib(edges):
    cycle = detect_cycle(edges)
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
        acyclic = True
    except graphlib.CycleError:
        acyclic = False
    assert (cycle is None) == acyclic
    if cycle is not None:
        assert cycle[0] == cycle[-1] and len(set(cycle[:-1])) == len(cycle) - 1
        assert all(b in edges[a] for a, b in zip(cycle, cycle[1:], strict=False))


def test_an_attempt_the_executor_could_not_place_waits_and_counts_as_nothing():
    reason = "waiting for room on the executor: worker w needs cpus=1; free: cpus=0"
    ending = Ending(EndKind.UNPLACED, 0, reason)
    assert not ending.counts_as_retry and not ending.preempted
    out = after_ending("j", ending, RetryStrategy(attempts=1), attempts_used=0)
    assert out == AttemptOutcome(JobStatus.RUNNABLE, reason, False, 0)
