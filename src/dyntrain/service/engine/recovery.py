"""How a restarted service picks up the jobs its predecessor left running."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from dyntrain.service.core.executor import (
    Executor,
    ExecutorError,
    WorkerExit,
    WorkerHandle,
    WorkerSpec,
)
from dyntrain.service.core.lifecycle import Ending, EndKind
from dyntrain.service.core.model import JobStatus, WorkerState
from dyntrain.service.core.records import Job, WorkerRecord
from dyntrain.service.engine.attempts import Attempt, AttemptTable
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.logtail import LogPump, after_lines
from dyntrain.service.engine.runfolders import ElasticHosts, RunFolders
from dyntrain.service.store import Store


@dataclass
class Recovered:
    """What ``Recovery.recover`` did: one line per job touched, and the exits of other workers
    it saw while it waited for some to go (for the controller's next step)."""

    notes: list[str] = field(default_factory=list)
    exits: list[WorkerExit] = field(default_factory=list)


class Recovery:
    """Picks up, after a (re)start, the attempts the store says are running.

    Args:
        store: the jobs, attempts and workers a previous service left.
        executor: adopts (or finds) their workers.
        attempts: where each picked-up attempt is tracked.
        logs: follows each adopted worker's log from the first line not yet stored.
        folders: the jobs' run folders.
        hosts: hosts an elastic job's coordinator again.
        clock: epoch seconds.
        config: its ``reattach_seconds`` (0: elastic workers do not re-attach; their jobs
            are queued again).
    """

    def __init__(self, *, store: Store, executor: Executor, attempts: AttemptTable,
                 logs: LogPump, folders: RunFolders, hosts: ElasticHosts,
                 clock: Callable[[], float], config: ControllerConfig) -> None:
        self.store, self.executor, self.attempts, self.logs = store, executor, attempts, logs
        self.folders, self.hosts, self.clock, self.config = folders, hosts, clock, config

    def recover(self) -> Recovered:
        """Adopt the workers of plain jobs, host elastic jobs again.

        A plain job's attempt goes on where it was: its running workers are adopted, and a worker
        that exited while no service watched is reported by the executor from what it left
        behind (exit code or signal, end time), so the job ends as that exit dictates and never
        runs twice. A worker whose handle was never stored is looked up by its id; one that was
        never started re-queues the attempt (it did not run). An elastic job's coordinator died
        with the previous service, but its workers trained on: it is hosted again (same port if
        free) and they re-attach (``reattach_seconds``). Without any running worker, or with
        re-attaching off, the job is queued again to resume from its newest checkpoint.
        """
        out = Recovered()
        by_job: dict[str, list[WorkerRecord]] = defaultdict(list)
        for w in self.store.workers.list_workers(active=True):
            by_job[w.job_id].append(w)
        for job in self.store.jobs.list_jobs(status=[JobStatus.STARTING, JobStatus.RUNNING],
                                        limit=1_000_000):
            if job.is_array_parent:
                continue
            workers = by_job.get(job.id, [])
            number = len(self.store.jobs.list_attempts(job.id))
            ever = [w for w in self.store.workers.list_workers(job.id, active=False)
                    if w.attempt_no == number]
            attempt = Attempt(job.id, number, job.started_at or self.clock(),
                              workers_started=len(ever), job=job)
            if job.elastic is None or job.torchrun:  # its workers run on by themselves
                self.attempts.add(attempt)
                out.notes.append(f"{job.id}: {self._recover_plain(attempt, workers, ever)}")
                continue
            found = {w.id: self._adopt(attempt, w) for w in workers}
            adopted = [w for w in workers if found[w.id]]
            if adopted and self.config.reattach_seconds:
                started = [w for w in workers if found[w.id] is not None]
                out.notes.append(f"{job.id}: {self._host_again(job, attempt, started)}")
                continue
            for w in adopted:
                self.executor.signal(w.id, "KILL")
            out.exits += self._wait_gone([w.id for w in adopted])
            for w in workers:
                self.store.workers.update_worker(w.id, state=WorkerState.EXITED,
                                                 stopped_at=self.clock())
                self.attempts.disown(w.id)
                self.logs.exited(w.id)
            reason = "service restarted: resumes from its newest checkpoint"
            if number:
                self.store.jobs.finish_attempt(job.id, number, None, reason, self.clock())
            self.store.jobs.update_job(job.id, status=JobStatus.RUNNABLE, status_reason=reason,
                                  preemptions=job.preemptions + 1, current_workers=0)
            out.notes.append(f"{job.id}: {reason}")
        ended = self.executor.sweep()
        if ended:
            out.notes.append(f"ended {len(ended)} worker(s) that no record owns: "
                             f"{', '.join(sorted(ended)[:5])}{' ...' if len(ended) > 5 else ''}")
        return out

    def _recover_plain(self, attempt: Attempt, workers: list[WorkerRecord],
                       ever: list[WorkerRecord]) -> str:
        found = [self._adopt(attempt, w) for w in workers]
        running, exited = found.count(True), found.count(False)
        if running or exited:
            return ", ".join(part for part in (
                f"re-adopted {running} running worker(s)" if running else "",
                f"{exited} worker(s) exited while the service was down" if exited else "")
                if part)
        ended = [w for w in ever
                 if w.state == WorkerState.EXITED and w.leave_reason != "never started"]
        if ended:  # its exit was stored, but not the end of the attempt
            w = ended[-1]
            code = w.exit_code if w.exit_code is None or w.exit_code >= 0 else None
            sig = -w.exit_code if w.exit_code is not None and w.exit_code < 0 else None
            attempt.last_exit = WorkerExit(w.id, code, sig, w.leave_reason or
                                           f"exit code {w.exit_code}", w.stopped_at)
            return "its worker had exited: the attempt ends as that exit dictates"
        attempt.claim(Ending(EndKind.PREEMPTED))
        attempt.stop("the service stopped before its worker started")
        return "its worker never started: queued again"

    def _host_again(self, job: Job, attempt: Attempt, workers: list[WorkerRecord]) -> str:
        """Host a running elastic job's coordinator again: its workers trained on meanwhile and
        re-attach (those that ended while the service was down are reported by the executor)."""
        attempt.host = self.hosts.host(job, attempt.number, len(workers),
                                       recovering=[w.id for w in workers])
        self.attempts.add(attempt)
        return f"its workers re-attach to its coordinator at {attempt.host.address}"

    def _adopt(self, attempt: Attempt, w: WorkerRecord) -> bool | None:
        """Watch ``w`` again: True while it runs, False when it ended (the executor reports its
        exit), None when it never started.

        A worker without a stored handle was being started when the service stopped: the
        executor finds it by its id, or it never started (it is then marked so).
        """
        handle = None
        try:
            handle = WorkerHandle.from_dict(w.handle) if w.handle else self.executor.find(w.id)
        except ExecutorError as e:
            reason = f"exit status lost: the service stopped while starting it ({e})"
            attempt.last_exit = WorkerExit(w.id, None, None, reason)
            self.store.workers.update_worker(
                w.id, state=WorkerState.EXITED, stopped_at=self.clock(), leave_reason=reason
            )
            return False
        if handle is None:
            self.store.workers.update_worker(
                w.id,
                state=WorkerState.EXITED,
                stopped_at=self.clock(),
                leave_reason="never started",
            )
            return None
        if not w.handle:
            self.store.workers.update_worker(w.id, handle=handle.to_dict())
        path = self.folders.log_path(w.job_id, w.id)
        spec = WorkerSpec(w.job_id, w.attempt_no, w.id, ["true"], {}, attempt.job.resources,
                          None, str(path))
        offset = after_lines(path, self.store.logs.count_log_lines(w.job_id, w.id))
        self.logs.follow(w.id, path, w.job_id, w.attempt_no, offset)
        attempt.workers[w.id] = w
        self.attempts.own(w.id, w.job_id)
        if self.executor.adopt(handle, spec):
            return True
        self.logs.exited(w.id)  # its exit comes with the next poll()
        return False

    def _wait_gone(self, worker_ids: list[str], timeout: float = 10.0) -> list[WorkerExit]:
        """Wait for these workers' exits; returns the exits of others (for the next step)."""
        others = []
        deadline = time.monotonic() + timeout
        pending = set(worker_ids)
        while pending and time.monotonic() < deadline:
            for e in self.executor.poll():
                if e.worker_id in pending:
                    pending.discard(e.worker_id)
                else:
                    others.append(e)
            self.executor.wait(0.02)
        self.executor.release([w for w in worker_ids if w not in pending])
        return others
