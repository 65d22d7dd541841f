"""Telling workers to leave: the notice is recorded, then sent; SIGKILL follows the grace period."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dyntrain.service.core.executor import Executor, ExecutorError
from dyntrain.service.core.lifecycle import Ending, EndKind
from dyntrain.service.core.model import WorkerState
from dyntrain.service.core.records import WorkerRecord
from dyntrain.service.engine.attempts import Attempt
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.store import Store


class Stopper:
    """Stops attempts and shrinks them: each notice is stored (``LEAVING``, why, when) before
    its SIGTERM goes out, and a worker still there the grace period later gets SIGKILL. An
    elastic job's coordinator hears of each notice, so the worker leaves at a step boundary.

    Args:
        store: where the workers' states and the jobs' worker counts are written.
        executor: what signals the workers.
        clock: the time of a notice (epoch seconds).
        config: its ``grace_seconds`` (SIGTERM -> SIGKILL).
    """

    def __init__(self, store: Store, executor: Executor, clock: Callable[[], float],
                 config: ControllerConfig) -> None:
        self.store, self.executor, self.clock, self.config = store, executor, clock, config

    def stop_all(self, attempt: Attempt, reason: str) -> None:
        """Tell every running worker of ``attempt`` to leave (recorded in one commit, then the
        notices go out together); ``reason`` is kept if it is the first."""
        attempt.stop(reason)
        leaving = attempt.running()
        with self.store.batch():
            for w in leaving:
                self._record_leave(attempt, w, reason)
            self.count_workers(attempt)
        for w in leaving:
            self._notify(w)

    def shrink(self, attempt: Attempt, env: str, count: int, reason: str) -> None:
        """Tell the newest ``count`` running workers of ``attempt`` in ``env`` to leave; each
        is one of the job's preemptions."""
        chosen = [w for w in attempt.running() if w.compute_environment == env][-count:]
        for w in chosen:
            self._record_leave(attempt, w, f"shrink: {reason}")
            self._notify(w)
        if chosen:  # what a user calls a preemption: capacity taken from a running job
            attempt.shrunk += len(chosen)
            self.store.jobs.update_job(attempt.job_id,
                                  preemptions=attempt.job.preemptions + attempt.shrunk)
        self.count_workers(attempt)

    def count_workers(self, attempt: Attempt) -> None:
        """Store how many of the attempt's workers train (those told to leave left out)."""
        self.store.jobs.update_job(attempt.job_id, current_workers=len(attempt.running()))

    def enforce_deadlines(self, attempts: Iterable[Attempt], now: float) -> None:
        """SIGKILL to workers past their grace period; stop attempts past their job's timeout
        (the attempt then ends as timed out)."""
        for attempt in attempts:
            for w in attempt.workers.values():
                if (w.state == WorkerState.LEAVING
                        and now - (w.leave_at or now) > self.config.grace_seconds):
                    try:
                        self.executor.signal(w.id, "KILL")
                    except ExecutorError:
                        pass
            timeout = attempt.job.timeout_seconds
            if (timeout and EndKind.TIMED_OUT not in attempt.claims
                    and now - attempt.started_at > timeout):
                attempt.claim(Ending(EndKind.TIMED_OUT, timeout_seconds=timeout))
                self.stop_all(attempt, f"timeout after {timeout:g}s")

    def _record_leave(self, attempt: Attempt, w: WorkerRecord, reason: str) -> None:
        if attempt.host is not None:
            attempt.host.note_request(w.id)
        now = self.clock()
        self.store.workers.update_worker(w.id, state=WorkerState.LEAVING, leave_reason=reason,
                                         leave_at=now)
        attempt.leaving(w, reason, now)

    def _notify(self, w: WorkerRecord) -> None:
        try:
            self.executor.signal(w.id, "TERM")
        except ExecutorError:
            pass  # already gone; its exit is on its way
