"""Persistence of the job service: SQLAlchemy Core over SQLite (embedded) or PostgreSQL.

``Store(url)`` takes ``sqlite:///path.db`` (WAL, busy timeout and foreign keys are switched on for
every connection; write transactions start with ``BEGIN IMMEDIATE`` so writers queue on the busy
timeout instead of failing mid-transaction) or ``postgresql+psycopg://user@host:port/db``.

Every public method runs in one transaction of its own: it either commits everything or, on any
error, nothing. Bad requests raise ``ValidationError`` with a one-line message. Methods return
frozen dataclasses (never rows or ORM objects), so callers hold no session.

Times are float seconds since the epoch. Children of an array job have ids ``<parent>:<index>``
(as in AWS Batch) and carry the parent's resolved command, environment and settings; the parent's
dependencies are stored on the parent only (the controller applies them to the children, child i
following child i of an ``N_TO_N`` dependency and child i-1 for ``SEQUENTIAL``).

One module per aggregate: ``schema`` (tables and the upgrade on open), ``columns`` (records as
columns and back; the records themselves are ``dyntrain.service.core.records``),
``environments`` (compute environments, queues, capacity traces), ``definitions``, ``jobs``
(jobs, attempts), ``dependencies`` (a job's, checked and read), ``scheduling`` (the
controller's bulk reads and writes), ``workers`` (workers, usage), ``logs`` (log lines, events),
``summaries`` (counts and searches for the dashboard and /metrics), ``tags``, ``leases``
(which replica leads, fencing), ``policies``
(fair-share scheduling policies); ``Store`` holds
one of each, as ``store.environments``, ``store.jobs``, ..., over one engine (``base.Database``).
"""

from collections.abc import Callable

from dyntrain.service.store.base import Database
from dyntrain.service.store.definitions import DefinitionStore
from dyntrain.service.store.environments import EnvironmentStore
from dyntrain.service.store.jobs import JobStore
from dyntrain.service.store.leases import LeaseStore
from dyntrain.service.store.logs import LogStore
from dyntrain.service.store.policies import PolicyStore
from dyntrain.service.store.scheduling import SchedulingStore
from dyntrain.service.store.schema import metadata
from dyntrain.service.store.summaries import SummaryStore
from dyntrain.service.store.tags import TagStore
from dyntrain.service.store.workers import WorkerStore


class Store(Database):
    """The service's database: one part per aggregate (``store.jobs.get_job(...)``), all over
    one engine. Thread-safe: each call takes a pooled connection of its own."""

    def __init__(self, url: str, **options: bool | int | Callable[[], float] | None) -> None:
        super().__init__(url, **options)  # type: ignore[arg-type]
        self.environments = EnvironmentStore(self)
        self.definitions = DefinitionStore(self)
        self.jobs = JobStore(self)
        self.scheduling = SchedulingStore(self)
        self.workers = WorkerStore(self)
        self.logs = LogStore(self)
        self.summaries = SummaryStore(self)
        self.tags = TagStore(self)
        self.leases = LeaseStore(self)
        self.policies = PolicyStore(self)


__all__ = ["Store", "metadata"]
