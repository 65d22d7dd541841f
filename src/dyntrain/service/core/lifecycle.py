"""Pure job-state transitions: dependencies, attempts, array parents and dependency cycles.

Nothing here reads a clock, a store or a process. Each function takes what the controller observed
and returns the next status with a one-line reason, in AWS Batch's terms:

- Dependencies (``resolve_dependencies``). STANDARD waits for the whole job; for an array job that
  is every child. N_TO_N makes child i wait for child i of the other array (same size). SEQUENTIAL
  names the job's own array and makes child i wait for child i-1 (child 0 waits for nothing). A job
  is RUNNABLE when every dependency SUCCEEDED, FAILED as soon as one FAILED (it can then never
  run; for an array that is the first failed child), and PENDING otherwise.
- Attempts (``after_ending``). How an attempt ended is one value, an ``Ending``: a user's
  terminate fails the job (the attempt counts); a preemption or capacity loss never counts
  against the retry strategy: the job goes back to RUNNABLE; neither does an attempt whose
  workers the executor could not all place (it waits RUNNABLE for room, not a preemption).
  Exit code 0 is success. Anything else (a timeout included, with reason "timeout after Ns")
  counts one attempt, and ``RetryStrategy.should_retry`` decides between RUNNABLE (retry) and
  FAILED; a failed attempt's reason quotes its first failing worker's error line.
  ``after_attempt`` is the same rule taken from loose values.
- Array parents (``array_parent_status``) summarize their children.
- ``detect_cycle`` finds a dependency cycle for the error message that rejects it.

Array children are named ``<parent id>:<index>`` (``child_id``), as AWS Batch names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from dyntrain.service.core.model import (
    Dependency,
    DependencyType,
    JobStatus,
    RetryStrategy,
    ValidationError,
)

# A job's status, or for an array job its children's statuses by index.
UpstreamStatus = JobStatus | Sequence[JobStatus]


def child_id(parent: str, index: int) -> str:
    """The id of child ``index`` of array job ``parent``."""
    return f"{parent}:{index}"


def child_dependencies(parent: str, dependencies: Iterable[Dependency]) -> tuple[Dependency, ...]:
    """What an array child waits for: its parent's dependencies, SEQUENTIAL ones naming the
    parent (they may name it as ``""``)."""
    return tuple(Dependency(parent if d.job_id in ("", parent) else d.job_id, d.type)
                 for d in dependencies)


def upstream_ids(dependencies: Iterable[Dependency], array_index: int | None) -> list[str]:
    """The jobs whose status a job with these dependencies (and array index) waits on: a whole
    job (an array job: its children as one), or the one child N_TO_N and SEQUENTIAL name."""
    out = []
    for d in dependencies:
        if d.type is DependencyType.STANDARD:
            out.append(d.job_id)
        elif array_index is not None:
            index = array_index if d.type is DependencyType.N_TO_N else array_index - 1
            if index >= 0:
                out.append(child_id(d.job_id, index))
    return out


@dataclass(frozen=True)
class DependentJob:
    """What dependency resolution needs to know about a job that may have to wait."""

    id: str
    dependencies: tuple[Dependency, ...] = ()
    array_index: int | None = None  # set for a child of an array job

    def __post_init__(self) -> None:
        object.__setattr__(self, "dependencies", tuple(self.dependencies))


@dataclass(frozen=True)
class Transition:
    """The next status of a job and why."""

    status: JobStatus
    reason: str


class EndKind(Enum):
    """What decided how an attempt ended, strongest last: a terminate beats a preemption, which
    beats a restart, which beats a timeout, which beats the workers' exit code."""

    EXITED = "exited"  # its workers' exit code: 0 succeeded, anything else failed
    TIMED_OUT = "timed out"  # it ran past the job's timeout: a failed attempt
    RESTARTED = "restarted"  # a torchrun gang stopped to start again at a new size: not counted
    UNPLACED = "unplaced"  # the executor had no room for all its workers: waits, not counted
    PREEMPTED = "preempted"  # capacity taken back or suspended: not counted, queued again
    TERMINATED = "terminated"  # a user stopped it: it counts, and the job fails


@dataclass(frozen=True)
class Ending:
    """How one attempt ended; the job's next status follows from it alone (``after_ending``).

    Args:
        kind: what decided it.
        exit_code: the deciding worker's exit code (negative: killed by that signal; None:
            unknown or no worker ran).
        reason: why, in words: the reason its workers were stopped, else the deciding exit's,
            else a terminate's own.
        timeout_seconds: the job's timeout, for ``EndKind.TIMED_OUT``.
        error_line: the first failing worker's error line, which the reason of a failed
            attempt quotes.
    """

    kind: EndKind
    exit_code: int | None = None
    reason: str = ""
    timeout_seconds: float | None = None
    error_line: str | None = None

    @property
    def preempted(self) -> bool:
        return self.kind is EndKind.PREEMPTED

    @property
    def counts_as_retry(self) -> bool:
        """Whether it counts against the job's retry strategy (a preemption or a restart
        never does)."""
        return self.kind not in (EndKind.PREEMPTED, EndKind.RESTARTED, EndKind.UNPLACED)


@dataclass(frozen=True)
class AttemptOutcome:
    """What follows an attempt: the next status, why, and the retry accounting."""

    status: JobStatus  # SUCCEEDED, RUNNABLE (retry or re-queue after preemption) or FAILED
    reason: str
    counted: bool  # whether this attempt counted against the retry strategy
    attempts_used: int  # counted attempts, this one included when it counted


def resolve_dependencies(job: DependentJob,
                         deps_status: Mapping[str, UpstreamStatus]) -> Transition:
    """PENDING, RUNNABLE or FAILED, from the statuses of the jobs ``job`` depends on."""
    waiting = None
    for dep in job.dependencies:
        for name, status in _upstream(job, dep, deps_status):
            if status is None:
                return Transition(JobStatus.FAILED, f"dependency {name} does not exist")
            if status is JobStatus.FAILED:
                return Transition(JobStatus.FAILED, f"dependency {name} failed")
            if status is not JobStatus.SUCCEEDED and waiting is None:
                waiting = f"waiting for dependency {name} ({status.value})"
    if waiting is not None:
        return Transition(JobStatus.PENDING, waiting)
    return Transition(JobStatus.RUNNABLE,
                      "dependencies succeeded" if job.dependencies else "no dependencies")


def _upstream(job: DependentJob, dep: Dependency, deps_status: Mapping[str, UpstreamStatus]
              ) -> Iterator[tuple[str, JobStatus | None]]:
    """(name, status) of each job that ``dep`` makes ``job`` wait for; None: no such job."""
    found = deps_status.get(dep.job_id)
    if dep.type is DependencyType.STANDARD:
        if found is None or isinstance(found, str):
            yield dep.job_id, None if found is None else JobStatus(found)
        else:
            for i, status in enumerate(found):
                yield child_id(dep.job_id, i), JobStatus(status)
        return
    if job.array_index is None:
        raise ValidationError(f"job {job.id}: a {dep.type.value} dependency needs an array child")
    index = job.array_index if dep.type is DependencyType.N_TO_N else job.array_index - 1
    if index < 0:  # child 0 of a SEQUENTIAL array
        return
    if found is None:
        yield child_id(dep.job_id, index), None
        return
    if isinstance(found, str) or index >= len(found):
        raise ValidationError(f"job {job.id}: {dep.type.value} dependency on {dep.job_id} needs "
                              f"an array job with a child {index}")
    yield child_id(dep.job_id, index), JobStatus(found[index])


def after_attempt(job: str, exit_code: int | None, reason: str, preempted: bool,
                  retry_strategy: RetryStrategy, attempts_used: int, *,
                  timed_out_after: float | None = None) -> AttemptOutcome:
    """The job's next status after one attempt ended, from loose values (``after_ending``).

    ``preempted``: the attempt ended because capacity was taken away or the scheduler preempted
    it; it wins over the exit code, since a worker told to leave exits 0 without having
    finished. ``timed_out_after``: seconds after which the attempt was stopped for exceeding
    the job's timeout.
    """
    kind = (EndKind.PREEMPTED if preempted else
            EndKind.EXITED if timed_out_after is None else EndKind.TIMED_OUT)
    return after_ending(job, Ending(kind, exit_code, reason, timed_out_after), retry_strategy,
                        attempts_used)


def after_ending(job: str, ending: Ending, retry_strategy: RetryStrategy,
                 attempts_used: int) -> AttemptOutcome:
    """The job's next status after one attempt ended as ``ending``.

    ``attempts_used``: counted attempts before this one.
    """
    if attempts_used < 0:
        raise ValueError(f"job {job}: attempts_used must be >= 0, got {attempts_used}")
    if ending.kind is EndKind.TERMINATED:  # the attempt ran: it counts, and it ends the job
        return AttemptOutcome(JobStatus.FAILED, ending.reason, True, attempts_used + 1)
    if ending.kind is EndKind.RESTARTED:  # queued again: the next pass sizes its new gang
        return AttemptOutcome(JobStatus.RUNNABLE, ending.reason or "restart", False,
                              attempts_used)
    if ending.kind is EndKind.UNPLACED:  # waits for room; neither an attempt nor a preemption
        return AttemptOutcome(JobStatus.RUNNABLE, ending.reason or "waiting for room", False,
                              attempts_used)
    if ending.preempted:
        return AttemptOutcome(JobStatus.RUNNABLE,
                              f"preempted: {ending.reason or 'capacity taken back'}", False,
                              attempts_used)
    used, reason = attempts_used + 1, ending.reason
    if ending.kind is EndKind.TIMED_OUT:
        reason = f"timeout after {ending.timeout_seconds:g}s"
    elif ending.exit_code == 0:
        return AttemptOutcome(JobStatus.SUCCEEDED, "exit code 0", True, used)
    elif not reason:
        reason = (f"exit code {ending.exit_code}" if ending.exit_code is not None
                  else "ended without an exit code")
    of = f"attempt {used} of {retry_strategy.attempts}"
    quoted = f"; {ending.error_line}" if ending.error_line else ""
    if retry_strategy.should_retry(used, ending.exit_code, reason):
        return AttemptOutcome(JobStatus.RUNNABLE, f"retrying after {reason} ({of}){quoted}",
                              True, used)
    why = "" if used >= retry_strategy.attempts else "; a retry rule says EXIT"
    return AttemptOutcome(JobStatus.FAILED, f"{reason} ({of}{why}){quoted}", True, used)


def array_parent_status(children: Iterable[JobStatus]) -> JobStatus:
    """An array job's status from its children's.

    All terminal: SUCCEEDED if every child succeeded, else FAILED. Otherwise RUNNING once any child
    is active or done, else the most advanced waiting status (RUNNABLE, PENDING, SUBMITTED).
    """
    statuses = {JobStatus(status) for status in children}
    if not statuses:
        raise ValueError("an array job has at least one child")
    if all(status.is_terminal() for status in statuses):
        return JobStatus.SUCCEEDED if statuses == {JobStatus.SUCCEEDED} else JobStatus.FAILED
    if any(status.is_terminal() or status.is_active() for status in statuses):
        return JobStatus.RUNNING
    for status in (JobStatus.RUNNABLE, JobStatus.PENDING):
        if status in statuses:
            return status
    return JobStatus.SUBMITTED


def detect_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A dependency cycle as a path ``[a, b, ..., a]``, or None; ``edges``: job -> its deps.

    Depth-first from each job in name order, following dependencies in the order given, without
    recursion (graphs of thousands of jobs stay within Python's stack).
    """
    graph = {node: list(deps) for node, deps in edges.items()}
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path, on_path = [root], {root: 0}
        stack = [iter(graph[root])]
        while stack:
            for nxt in stack[-1]:
                if nxt in on_path:
                    return path[on_path[nxt]:] + [nxt]
                if nxt not in done:
                    on_path[nxt] = len(path)
                    path.append(nxt)
                    stack.append(iter(graph.get(nxt, ())))
                    break
            else:
                stack.pop()
                node = path.pop()
                del on_path[node]
                done.add(node)
    return None


def check_acyclic(edges: Mapping[str, Iterable[str]]) -> None:
    """Raise ``ValidationError`` naming the cycle when the dependency graph has one."""
    cycle = detect_cycle(edges)
    if cycle is not None:
        raise ValidationError(f"dependency cycle: {' -> '.join(cycle)}")
