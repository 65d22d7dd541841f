"""Where the service keeps each job's files, and hosting an elastic job's coordinator there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dyntrain.elastic.protocol import ENV_OUT
from dyntrain.elastic.runs.storage import LocalStore, RunStore, open_store
from dyntrain.service.core.executor import Executor
from dyntrain.service.core.submitter import job_numerics
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.store import Job, Store

if TYPE_CHECKING:  # torch: imported only once an elastic job runs
    from dyntrain.service.engine.elastic_host import ElasticHost


@dataclass(frozen=True)
class RunFolders:
    """Each job's run folder under ``root`` (``jobs/<id>``, an array child's ``<parent>_<i>``):
    its workers' logs, its coordinator's secret and, unless the job's ``DYNTRAIN_OUT`` names
    an object store, its training files."""

    root: Path

    def run_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id.replace(":", "_")

    def log_path(self, job_id: str, worker_id: str) -> Path:
        return self.run_dir(job_id) / "logs" / f"{worker_id}.log"

    def run_store(self, job: Job) -> RunStore:
        """Where a job's training files go: the object store its ``DYNTRAIN_OUT`` names, else
        its run folder here (which keeps its logs either way)."""
        out = job.environment.get(ENV_OUT)
        return open_store(out) if out else LocalStore(self.run_dir(job.id))


@dataclass(frozen=True)
class ElasticHosts:
    """Builds the coordinator host of an elastic job's attempt, in the job's run folder, where
    the executor's workers reach it.

    Args:
        store: where the host's sink writes the job's events and progress.
        folders: the jobs' run folders.
        executor: whose ``coordinator_host`` the workers are told.
        config: its ``failure_timeout``, the heartbeat timeout of the job's workers.
    """

    store: Store
    folders: RunFolders
    executor: Executor
    config: ControllerConfig

    def host(self, job: Job, attempt_no: int, expected: int,
             recovering: list[str] | None = None) -> ElasticHost:
        """A new host for ``job``'s attempt ``attempt_no`` expecting ``expected`` workers;
        ``recovering``: after a restart, the workers that re-attach to it."""
        from dyntrain.service.engine.elastic_host import ElasticHost  # torch: only when needed

        numerics, mixed = job_numerics(job.environment)
        return ElasticHost(self.store, job.id, self.folders.run_dir(job.id), job.min_workers,
                           job.max_workers, expected=expected,
                           failure_timeout=self.config.failure_timeout, attempt=attempt_no,
                           recovering=recovering, host=self.executor.coordinator_host,
                           files=self.folders.run_store(job), numerics=numerics,
                           allow_mixed_numerics=mixed)
