"""Jobs' log lines (per job, per attempt, searched) and events.

Reads of log lines hold the lock: the controller is then between steps, so a job seen ended
has had every line of its workers copied into the store, and no lines with an ended job mean
that its log is over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dyntrain.service.core.records import Event, Job, LogLine, LogStream
from dyntrain.service.engine.service import Service
from dyntrain.service.operations.errors import found


@dataclass(frozen=True)
class LogPage:
    """A job's log lines after a sequence number, the job as it was when they were read, and
    the last sequence number the log has."""

    job: Job
    lines: list[LogLine]
    last_seq: int


class Logs:
    def __init__(self, service: Service) -> None:
        self._service = service

    def read(self, job_id: str, after_seq: int = 0, limit: int = 1000) -> LogPage:
        store = self._service.store
        with self._service.lock:
            job = found(store.jobs.get_job, job_id)
            lines, last = store.logs.read_log(job_id, after_seq, limit)
        return LogPage(job, lines, last)

    def streams(self, *, job_ids: Sequence[str] | None = None,
                job_id_prefix: str | None = None, job_name: str | None = None,
                definition_name: str | None = None) -> list[LogStream]:
        """Each attempt's log, of the jobs named (all when nothing narrows it)."""
        return self._service.store.logs.log_streams(
            job_ids=job_ids, job_id_prefix=job_id_prefix, job_name=job_name,
            definition_name=definition_name)

    def attempt(self, job_id: str, attempt_no: int, *, after_seq: int | None = None,
                before_seq: int | None = None, start_at: float | None = None,
                end_at: float | None = None, limit: int = 10_000,
                newest: bool = False) -> list[LogLine]:
        """One attempt's lines after or before a sequence number, within a time window
        (``newest``: the last ``limit`` of them), oldest first."""
        with self._service.lock:
            return self._service.store.logs.attempt_log(
                job_id, attempt_no, after_seq=after_seq, before_seq=before_seq,
                start_at=start_at, end_at=end_at, limit=limit, newest=newest)

    def search(self, streams: Sequence[tuple[str, int]] | None = None, *,
               start_at: float | None = None, end_at: float | None = None,
               terms: Sequence[str] = (), offset: int = 0, limit: int = 10_000
               ) -> list[tuple[str, LogLine]]:
        """Lines of those (job id, attempt) streams (None: all) within a time window that hold
        every term, as (job id, line), interleaved by time."""
        with self._service.lock:
            return self._service.store.logs.search_logs(
                streams, start_at=start_at, end_at=end_at, terms=terms, offset=offset,
                limit=limit)

    def events(self, job_id: str, after_id: int = 0, limit: int = 1000) -> list[Event]:
        """The job's events with id > ``after_id``, oldest first."""
        return self._service.store.logs.list_events(job_id, after_id=after_id, limit=limit)

    def job_events(self, job_id: str, prefix: str) -> list[Event]:
        """The job's events whose kind starts with ``prefix`` (``membership.``...)."""
        return self._service.store.summaries.list_job_events(job_id, prefix)

    def count_events(self, prefix: str = "") -> dict[str, int]:
        """Every job's events whose kind starts with ``prefix``, counted by kind."""
        return self._service.store.summaries.count_events_by_kind(prefix)
