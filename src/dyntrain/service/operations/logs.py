"""Jobs' log lines (per job, per attempt, searched) and events.

Reads of log lines hold the lock: the controller is then between steps, so a job seen ended
has had every line of its workers copied into the store, and no lines with an ended job mean
that its log is over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
            job = found(store.get_job, job_id)
            lines, last = store.read_log(job_id, after_seq, limit)
        return LogPage(job, lines, last)

    def streams(self, **narrow: Any) -> list[LogStream]:
        """Each attempt's log (``Store.log_streams``'s filters: job_ids, job_id_prefix...)."""
        return self._service.store.log_streams(**narrow)

    def attempt(self, job_id: str, attempt_no: int, **window: Any) -> list[LogLine]:
        """One attempt's lines (``Store.attempt_log``'s window: after/before_seq, times...)."""
        with self._service.lock:
            return self._service.store.attempt_log(job_id, attempt_no, **window)

    def search(self, streams: Sequence[tuple[str, int]] | None = None, **query: Any
               ) -> list[tuple[str, LogLine]]:
        """Lines of those (job id, attempt) streams (None: all) by ``Store.search_logs``'s
        query (times, terms, offset, limit), as (job id, line)."""
        with self._service.lock:
            return self._service.store.search_logs(streams, **query)

    def events(self, job_id: str, after_id: int = 0, limit: int = 1000) -> list[Event]:
        """The job's events with id > ``after_id``, oldest first."""
        return self._service.store.list_events(job_id, after_id=after_id, limit=limit)

    def job_events(self, job_id: str, prefix: str) -> list[Event]:
        """The job's events whose kind starts with ``prefix`` (``membership.``...)."""
        return self._service.store.list_job_events(job_id, prefix)

    def count_events(self, prefix: str = "") -> dict[str, int]:
        """Every job's events whose kind starts with ``prefix``, counted by kind."""
        return self._service.store.count_events_by_kind(prefix)
