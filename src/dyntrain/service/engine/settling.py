"""How the controller settles worker exits and the attempts they end, one transaction a step."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dyntrain.elastic.membership.phases import Phase
from dyntrain.service.core.executor import Executor, WorkerExit
from dyntrain.service.core.lifecycle import Ending, EndKind, after_ending
from dyntrain.service.core.model import JobStatus, WorkerState
from dyntrain.service.core.plan import JobView
from dyntrain.service.core.records import Job
from dyntrain.service.core.torchrun import ExitAction, after_worker_exit
from dyntrain.service.engine.attempts import (
    Attempt,
    AttemptTable,
    CoordinatorEnd,
    terminating,
    worker_index,
)
from dyntrain.service.engine.jobindex import job_view
from dyntrain.service.engine.logtail import LogPump
from dyntrain.service.engine.runfolders import RunFolders
from dyntrain.service.engine.stopping import Stopper
from dyntrain.service.engine.worker_log import read_error_line, read_result
from dyntrain.service.store import Store
from dyntrain.service.store.scheduling import AttemptEnd, UsageRow, WorkerExitRow


@dataclass
class Settlement:
    """One step's exits and attempt ends, written together, and the status changes they made
    (``moves``: the job as the index knows it, its new status, its view when RUNNABLE again)."""

    exits: list[WorkerExitRow] = field(default_factory=list)
    usage: list[UsageRow] = field(default_factory=list)
    ends: list[AttemptEnd] = field(default_factory=list)
    moves: list[tuple[Job, JobStatus, JobView | None]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """A worker of a running attempt exited or an attempt ended: the scheduler has news."""
        return bool(self.exits or self.ends)


class Settler:
    """Settles a step's worker exits, ticks the running attempts (an elastic job's coordinator)
    and ends those with no worker left, deciding each one's ``Ending``.

    Args:
        store: where exits, worker time and attempt ends are written.
        executor: told when the exits it reported are stored.
        attempts: the running attempts; an ended one leaves it.
        logs: stops following an exited worker's log once drained.
        folders: the jobs' run folders (logs quoted in a failure, ``result.json``).
        stopper: stops an attempt whose main node exited or whose coordinator gave up.
    """

    def __init__(self, *, store: Store, executor: Executor, attempts: AttemptTable,
                 logs: LogPump, folders: RunFolders, stopper: Stopper) -> None:
        self.store, self.executor, self.attempts, self.logs = store, executor, attempts, logs
        self.folders, self.stopper = folders, stopper

    def settle(self, exits: list[WorkerExit], now: float) -> Settlement:
        """Record the exits, tick the attempts, and end those with no worker left: one
        transaction for all of it (so a restarted service never sees an exit without the end of
        its attempt, or the reverse). The caller applies the returned ``moves`` to its index.
        Exits are taken in the order they happened where the executor knows it (a torchrun
        gang's first death decides whether it restarts or fails)."""
        s = Settlement()
        with self.store.batch():
            for exit_ in sorted(exits, key=_end_order):
                self._on_exit(exit_, now, s)
            for attempt in self.attempts.values():
                self._tick_attempt(attempt, now, s)
            self.store.scheduling.settle(s.exits, s.usage, s.ends)
        if exits:  # stored: what the executor kept to report them can go
            self.executor.release([e.worker_id for e in exits])
        return s

    def _on_exit(self, exit_: WorkerExit, now: float, s: Settlement) -> None:
        if exit_.ended_at is not None:
            now = min(now, exit_.ended_at)  # it may have ended while no service watched
        attempt = self.attempts.of_worker(exit_.worker_id)
        w = attempt.workers.pop(exit_.worker_id, None) if attempt is not None else None
        if w is None:
            return
        self.attempts.disown(w.id)
        self.logs.exited(w.id)
        code = exit_.exit_code if exit_.exit_code is not None else (
            -exit_.signal if exit_.signal else None)
        s.exits.append(WorkerExitRow(w.id, code, now, exit_.reason))
        seconds = max(0.0, now - w.started_at)
        wasted = min(seconds, attempt.wasted.pop(w.id, 0.0))
        for amount, lost in ((seconds - wasted, False), (wasted, True)):
            if amount > 0:
                s.usage.append(UsageRow(w.job_id, w.attempt_no, w.compute_environment,
                                        w.capacity_type, amount, w.price_per_slot_hour, lost,
                                        now))
        attempt.last_exit = exit_
        if (code is not None and code > 0 and w.state == WorkerState.RUNNING
                and not attempt.first_error):
            line = read_error_line(self.folders.log_path(w.job_id, w.id))
            who = f"{w.id.rsplit('-', 1)[-1]} " if attempt.host is not None else ""
            attempt.first_error = f"{who}{line}" if line else None
        if attempt.host is not None and code not in (0, None) and w.state == WorkerState.RUNNING:
            self._failed_untrained(attempt)
        if exit_.lost and not attempt.job.torchrun and (
                attempt.host is None or not attempt.workers):
            attempt.claim(Ending(EndKind.PREEMPTED))  # its node went away: capacity taken back
        if attempt.host is not None:
            attempt.host.worker_exited(w.id, failed=w.state == WorkerState.RUNNING and code != 0,
                                       reason=f"exit code {code}")
        if attempt.job.torchrun:
            self._torchrun_exit(attempt, w.id, exit_, code)
        if (attempt.host is None and attempt.job.num_nodes and attempt.stop_reason is None
                and worker_index(w.id) == 0 and not attempt.job.torchrun):
            # AWS Batch: a multi-node job ends when its main node does; the others are stopped
            attempt.main_exit = exit_
            self.stopper.stop_all(attempt, "the main node exited")
        if attempt.workers:
            self.stopper.count_workers(attempt)

    def _torchrun_exit(self, attempt: Attempt, wid: str, exit_: WorkerExit,
                       code: int | None) -> None:
        """A torchrun gang is whole or not at all: a worker killed restarts it (not counted),
        one failed stops it (counted; its exit decides, as a main node's does), one done means
        the gang is finishing (never resized again: the others end on their own)."""
        decision = after_worker_exit(wid.rsplit("-", 1)[-1], code, lost=exit_.lost,
                                     stopping=attempt.stop_reason is not None)
        if decision.action is ExitAction.RESTART:
            attempt.claim(Ending(EndKind.RESTARTED))
            self.stopper.stop_all(attempt, decision.reason)
        elif decision.action is ExitAction.FINISH:
            attempt.stop(decision.reason)
        elif decision.action is ExitAction.FAIL:
            attempt.main_exit = dataclasses.replace(exit_, reason=decision.reason)
            self.stopper.stop_all(attempt, decision.reason)

    def _failed_untrained(self, attempt: Attempt) -> None:
        """An elastic job replaces a worker that failed, but once as many as it may have failed
        before it ever trained (each cannot reach the coordinator, say) it ends instead of
        starting more of them forever; its reason is the first one's error line."""
        if attempt.running_seen or attempt.stop_reason is not None:
            return
        attempt.failed_untrained += 1
        if attempt.failed_untrained >= attempt.job.workers_range[1]:
            self.stopper.stop_all(attempt, f"{attempt.failed_untrained} worker(s) failed "
                                           "before the job trained")

    def _tick_attempt(self, attempt: Attempt, now: float, s: Settlement) -> None:
        if attempt.host is not None:
            host = attempt.host
            phase = host.tick()
            self._price_crashes(attempt)
            if host.generation is not None and not attempt.running_seen:
                attempt.running_seen = True
                self._set_running(attempt, terminating(attempt.terminated)
                                  if attempt.terminated else
                                  f"generation {host.generation} running", s)
            if phase is Phase.DONE and attempt.stop_reason is None:
                attempt.stop("finished")  # its workers exit on their own; no growth
            if phase is Phase.FAILED and attempt.stop_reason is None:
                self.stopper.stop_all(attempt, host.failure or "the job failed")
            if phase is Phase.WAITING and not attempt.workers and attempt.stop_reason is None:
                self.stopper.stop_all(attempt, "every worker is gone")
        if not attempt.workers:
            self._finish_attempt(attempt, now, s)

    def _set_running(self, attempt: Attempt, reason: str, s: Settlement) -> None:
        job = attempt.job
        if self.store.jobs.transition(job.id, JobStatus.STARTING, JobStatus.RUNNING, reason):
            s.moves.append((job, JobStatus.RUNNING, None))
            attempt.job = dataclasses.replace(job, status=JobStatus.RUNNING)

    def _price_crashes(self, attempt: Attempt) -> None:
        """A crash throws away the interrupted step of every member of the old world."""
        events = attempt.host.events
        for record in events[attempt.priced_events:]:
            if record["event"] == "crash":
                step_s = attempt.host.step_seconds()
                for w in self.store.workers.list_workers(attempt.job_id):
                    attempt.wasted[w.id] = attempt.wasted.get(w.id, 0.0) + step_s * (
                        1 + record.get("steps_redone", 0))
        attempt.priced_events = len(events)

    def _finish_attempt(self, attempt: Attempt, now: float, s: Settlement) -> None:
        if attempt.last_exit is not None and attempt.last_exit.ended_at is not None:
            now = min(now, attempt.last_exit.ended_at)
        job = attempt.job
        self.attempts.remove(attempt.job_id)
        coordinator = None
        if attempt.host is not None:
            phase = attempt.host.phase
            attempt.host.close()
            coordinator = CoordinatorEnd(phase is Phase.DONE, phase is Phase.FAILED,
                                         attempt.host.failure)
        ending = attempt.ending(coordinator)
        result = read_result(self.folders.run_dir(job.id), attempt.started_at)
        if result is not None:  # trainer.report()'s values: the job keeps its last attempt's
            self.store.jobs.update_job(job.id, result=result)
        outcome = after_ending(job.id, ending, job.retry_strategy, job.attempts)
        status, stopped = outcome.status, now if outcome.status.is_terminal() else None
        s.ends.append(AttemptEnd(job.id, attempt.number, ending.exit_code, outcome.reason, now,
                                 status.value, outcome.attempts_used,
                                 job.preemptions + attempt.shrunk + int(ending.preempted),
                                 stopped))
        s.moves.append((job, status, job_view(job) if status is JobStatus.RUNNABLE else None))


def _end_order(exit_: WorkerExit) -> float:
    """When ``exit_`` happened; one the executor did not date sorts after those it did."""
    return exit_.ended_at if exit_.ended_at is not None else float("inf")
