"""How a restarted service picks up the jobs its predecessor left running."""

from __future__ import annotations

import time
from collections import defaultdict

from dyntrain.service.core.executor import ExecutorError, WorkerExit, WorkerHandle, WorkerSpec
from dyntrain.service.core.model import JobStatus
from dyntrain.service.engine.attempts import Attempt, LogTail, after_lines
from dyntrain.service.store import WORKER_EXITED, Job, WorkerRecord


class Recovery:
    """The controller's ``recover()`` (mixed into ``Controller``)."""

    def recover(self) -> list[str]:
        """After a (re)start: adopt the workers of plain jobs, host elastic jobs again.

        A plain job's attempt goes on where it was: its running workers are adopted, and a worker
        that exited while no service watched is reported by the executor from what it left
        behind (exit code or signal, end time), so the job ends as that exit dictates and never
        runs twice. A worker whose handle was never stored is looked up by its id; one that was
        never started re-queues the attempt (it did not run). An elastic job's coordinator died
        with the previous service, but its workers trained on: it is hosted again (same port if
        free) and they re-attach (``reattach_seconds``). Without any running worker, or with
        re-attaching off, the job is queued again to resume from its newest checkpoint. Returns
        one line per job touched.
        """
        notes = []
        by_job: dict[str, list[WorkerRecord]] = defaultdict(list)
        for w in self.store.list_workers(active=True):
            by_job[w.job_id].append(w)
        for job in self.store.list_jobs(status=[JobStatus.STARTING, JobStatus.RUNNING],
                                        limit=1_000_000):
            if job.is_array_parent:
                continue
            workers = by_job.get(job.id, [])
            number = len(self.store.list_attempts(job.id))
            ever = [w for w in self.store.list_workers(job.id, active=False)
                    if w.attempt_no == number]
            attempt = Attempt(job.id, number, job.started_at or self.clock(),
                              workers_started=len(ever), job=job)
            if job.elastic is None:
                self.attempts[job.id] = attempt
                notes.append(f"{job.id}: {self._recover_plain(attempt, workers, ever)}")
                continue
            found = {w.id: self._adopt(attempt, w) for w in workers}
            adopted = [w for w in workers if found[w.id]]
            if adopted and self.config.reattach_seconds:
                started = [w for w in workers if found[w.id] is not None]
                notes.append(f"{job.id}: {self._host_again(job, attempt, started)}")
                continue
            for w in adopted:
                self.executor.signal(w.id, "KILL")
            self._wait_gone([w.id for w in adopted])
            for w in workers:
                self.store.update_worker(w.id, state=WORKER_EXITED, stopped_at=self.clock())
                self._forget_worker(w.id)
            reason = "service restarted: resumes from its newest checkpoint"
            if number:
                self.store.finish_attempt(job.id, number, None, reason, self.clock())
            self.store.update_job(job.id, status=JobStatus.RUNNABLE, status_reason=reason,
                                  preemptions=job.preemptions + 1, current_workers=0)
            notes.append(f"{job.id}: {reason}")
        ended = self.executor.sweep()
        if ended:
            notes.append(f"ended {len(ended)} worker(s) that no record owns: "
                         f"{', '.join(sorted(ended)[:5])}{' ...' if len(ended) > 5 else ''}")
        return notes

    def _recover_plain(self, attempt: Attempt, workers: list[WorkerRecord],
                       ever: list[WorkerRecord]) -> str:
        found = [self._adopt(attempt, w) for w in workers]
        running, exited = found.count(True), found.count(False)
        if running or exited:
            return ", ".join(part for part in (
                f"re-adopted {running} running worker(s)" if running else "",
                f"{exited} worker(s) exited while the service was down" if exited else "")
                if part)
        ended = [w for w in ever if w.state == WORKER_EXITED and w.leave_reason != "never started"]
        if ended:  # its exit was stored, but not the end of the attempt
            w = ended[-1]
            code = w.exit_code if w.exit_code is None or w.exit_code >= 0 else None
            sig = -w.exit_code if w.exit_code is not None and w.exit_code < 0 else None
            attempt.last_exit = WorkerExit(w.id, code, sig, w.leave_reason or
                                           f"exit code {w.exit_code}", w.stopped_at)
            return "its worker had exited: the attempt ends as that exit dictates"
        attempt.preempted = True
        attempt.stop_reason = "the service stopped before its worker started"
        return "its worker never started: queued again"

    def _host_again(self, job: Job, attempt: Attempt, workers: list[WorkerRecord]) -> str:
        """Host a running elastic job's coordinator again: its workers trained on meanwhile and
        re-attach (those that ended while the service was down are reported by the executor)."""
        from dyntrain.service.engine.elastic_host import ElasticHost  # torch: only when needed

        attempt.host = ElasticHost(self.store, job.id, self.run_dir(job.id), job.min_workers,
                                   job.max_workers, expected=len(workers),
                                   failure_timeout=self.config.failure_timeout,
                                   attempt=attempt.number, recovering=[w.id for w in workers],
                                   host=self.executor.coordinator_host,
                                   files=self.run_store(job))
        self.attempts[job.id] = attempt
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
            self.store.update_worker(w.id, state=WORKER_EXITED, stopped_at=self.clock(),
                                     leave_reason=reason)
            return False
        if handle is None:
            self.store.update_worker(w.id, state=WORKER_EXITED, stopped_at=self.clock(),
                                     leave_reason="never started")
            return None
        if not w.handle:
            self.store.update_worker(w.id, handle=handle.to_dict())
        spec = WorkerSpec(w.job_id, w.attempt_no, w.id, ["true"], {}, attempt.job.resources,
                          None, str(self._log_path(w.job_id, w.id)))
        path = self._log_path(w.job_id, w.id)
        offset = after_lines(path, self.store.count_log_lines(w.job_id, w.id))
        self._logs[w.id] = LogTail(path, w.job_id, w.attempt_no, offset)
        attempt.workers[w.id] = w
        self._owner[w.id] = w.job_id
        if self.executor.adopt(handle, spec):
            return True
        self._logs[w.id].exited = True  # its exit comes with the next poll()
        return False

    def _wait_gone(self, worker_ids: list[str], timeout: float = 10.0) -> None:
        """Wait for these workers' exits; the exits of others are kept for the next step."""
        deadline = time.monotonic() + timeout
        pending = set(worker_ids)
        while pending and time.monotonic() < deadline:
            for e in self.executor.poll():
                if e.worker_id in pending:
                    pending.discard(e.worker_id)
                else:
                    self._early_exits.append(e)
            self.executor.wait(0.02)
        self.executor.release([w for w in worker_ids if w not in pending])
