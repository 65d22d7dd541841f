"""Hosting an elastic job's coordinator inside the service, one per running attempt."""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.membership.coordinator import Coordinator
from dyntrain.elastic.membership.members import CoordinatorConfig
from dyntrain.elastic.membership.phases import Phase
from dyntrain.elastic.numerics import Numerics
from dyntrain.elastic.runs.checkpoints import latest_valid_checkpoint
from dyntrain.elastic.runs.coordinator_file import (
    COORDINATOR_FILE,
    read_coordinator_file,
    write_coordinator_file,
)
from dyntrain.elastic.runs.folder import read_numerics
from dyntrain.elastic.runs.log import last_step
from dyntrain.elastic.runs.progress import result_line
from dyntrain.elastic.runs.storage import LocalStore, RunStore, StorageError
from dyntrain.elastic.worker.connect import parse_address
from dyntrain.errors import ConfigError
from dyntrain.launch.sink import RunSink
from dyntrain.service.core.jobtext import short_worker
from dyntrain.service.core.model import JobStatus
from dyntrain.service.core.speedup import JobProfile, SpeedupTracker
from dyntrain.service.store import Store

log = logging.getLogger("dyntrain.service")
PROGRESS_FIELDS = ("step", "total_steps", "epoch", "world_size", "loss", "samples_per_s", "time")
PROGRESS_EVERY = 1.0  # seconds between two progress writes to the store
SECRET_FILE = "coordinator.secret"


class ServiceSink(RunSink):
    """The launcher's files (events.jsonl, metrics.jsonl, result.json), plus service events, the
    job's progress (its latest metrics, at most once a second), a status reason that follows
    its membership changes, and what the training reported as a line of the job's log."""

    def __init__(self, store: Store, job_id: str, files: RunStore, attempt: int = 1) -> None:
        super().__init__(files, "?", stream=None, quiet=True, every=1e9)
        self.store, self.job_id, self.attempt = store, job_id, attempt
        self._progress_at = -PROGRESS_EVERY
        self._progress_of: dict | None = None  # the metrics record last written as progress
        self.stopping = False  # the job is being stopped: its status reason says so already
        self.speedup = SpeedupTracker()  # its measured speed-up (allocation policies)

    def event(self, record: dict) -> None:
        super().event(record)
        self.speedup.observe_change(record)
        self.store.logs.add_event(self.job_id, f"membership.{record['event']}", record)
        world = record.get("world_after")
        who = ", ".join(short_worker(w) for w in record.get("workers") or [])
        if world is not None and not self.stopping:
            self.store.jobs.update_job(
                self.job_id, expected_status=JobStatus.RUNNING,
                status_reason=f"training with {world} worker(s) since generation "
                              f"{record.get('generation')} ({record['event']}"
                              f"{': ' + who if who else ''})")

    def metrics(self, record: dict) -> None:
        super().metrics(record)
        self.speedup.observe_step(record)
        now = time.monotonic()
        last = self._progress_of or {}
        if (now - self._progress_at >= PROGRESS_EVERY
                or record.get("world_size") != last.get("world_size")):
            self._write_progress(record, now)

    def _write_progress(self, record: dict, now: float) -> None:
        progress = {k: record[k] for k in PROGRESS_FIELDS if k in record}
        progress["generation"] = record.get("gen")
        self.store.jobs.update_job(self.job_id, progress=progress)
        self._progress_at, self._progress_of = now, record

    def close(self) -> None:
        if self.last_metrics is not None and self.last_metrics is not self._progress_of:
            self._write_progress(self.last_metrics, time.monotonic())
        super().close()

    def result(self, record: dict) -> None:
        """``trainer.report()``: result.json, and the job's log (what ``logs`` and
        ``submit --wait`` show); the controller stores the values with the job."""
        super().result(record)
        values = {k: v for k, v in record.items() if k != "worker"}
        self.store.logs.append_log(self.job_id, self.attempt, None, [result_line(values)])

    def log(self, line: str) -> None:
        self.store.logs.add_event(self.job_id, "coordinator", {"message": line})

    def storage_warning(self, line: str) -> None:
        # from a writer's thread: the service's log, not its store (the controller's)
        log.warning("job %s: %s", self.job_id, line)


class ElasticHost:
    """A TCPStore server and a Coordinator for one attempt of one elastic job.

    Its address and identity (job id and attempt) go to ``coordinator.json`` in the run folder.
    ``recovering`` (after a service restart): the attempt's workers that may still run; the
    store listens on the recorded port again if it can (else on a new one, which the file
    tells the workers) and the coordinator is rebuilt from their reports.

    ``files``: where the job's training files go (checkpoints, metrics, events, results) when
    not in ``run_dir``: an object store (the job's ``DYNTRAIN_OUT``). ``run_dir`` keeps what
    belongs to this service only (logs, the coordinator's secret), and ``coordinator.json`` is
    written to both, for workers that share neither.
    """

    def __init__(self, store: Store, job_id: str, run_dir: Path, min_workers: int,
                 max_workers: int, expected: int, failure_timeout: float = p.FAILURE_TIMEOUT,
                 attempt: int = 1, recovering: list[str] | None = None,
                 host: str = "127.0.0.1", files: RunStore | None = None,
                 numerics: Numerics | None = None, allow_mixed_numerics: bool = False) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.files = files or LocalStore(run_dir)
        self.identity = f"{job_id}/attempt-{attempt}"
        previous = read_coordinator_file(run_dir) if recovering is not None else {}
        same = previous.get("job") == self.identity
        port = parse_address(previous["address"])[1] if same and "address" in previous else 0
        self.secret = _secret(run_dir, self.identity, reuse=recovering is not None)
        self.tcp = _listen(port)  # TCPStore listens on every interface, whatever the host
        jobstore = dist.PrefixStore(self.secret, self.tcp)
        self.address = f"{host}:{self.tcp.port}"
        out = str(run_dir.resolve()) if self.files.local is not None else self.files.location
        self.numerics = numerics or Numerics()  # what every worker gets in its environment
        jobstore.set(p.JOB_INFO, json.dumps({"out_dir": out, "job": self.identity,
                                             "numerics": self.numerics.to_json()}))
        write_coordinator_file(run_dir, self.address, self.identity)
        self.sink = ServiceSink(store, job_id, self.files, attempt)
        try:
            recorded = read_numerics(self.files)
        except (ConfigError, OSError, StorageError) as exc:  # said, and recorded again
            self.sink.log(f"the run folder's numerics are not readable ({exc}); the first "
                          "worker records them again")
            recorded = None
        if self.files.local is None:
            try:
                self.files.put(COORDINATOR_FILE, (run_dir / COORDINATOR_FILE).read_bytes())
            except StorageError as exc:  # its workers fail on it too, and say so
                self.sink.log(f"cannot record the coordinator's address: {exc}")
        self.coordinator = Coordinator(
            jobstore, CoordinatorConfig(min_workers, max_workers, expected_initial=expected,
                                        settle_seconds=2.0, failure_timeout=failure_timeout,
                                        numerics=self.numerics,
                                        allow_mixed_numerics=allow_mixed_numerics),
            self.sink, self._find_checkpoint, numerics=recorded)
        if recovering is not None:
            self.coordinator.expect_reattach(recovering, last_step(self.files))

    # What the controller needs of the attempt's coordinator and sink, so that it never
    # reaches through the host into them.

    @property
    def phase(self) -> Phase:
        return self.coordinator.phase

    @property
    def failure(self) -> str | None:
        """Why the coordinator failed the job, None while it has not."""
        return self.coordinator.failure

    @property
    def generation(self) -> int | None:
        """The number of the generation training now, None before the first one formed."""
        current = self.coordinator.current
        return None if current is None else current.number

    @property
    def events(self) -> list[dict]:
        """The job's membership events so far, oldest first."""
        return self.sink.events

    def step_seconds(self) -> float:
        """Seconds one global step takes at the latest measured rate (0: none measured)."""
        rate = (self.sink.last_metrics or {}).get("samples_per_s") or 0
        return self.coordinator.job_config.get("global_batch", 0) / rate if rate else 0.0

    def speedup_profile(self) -> JobProfile | None:
        """The job's measured speed-up, None while too little is measured."""
        return self.sink.speedup.profile()

    def mark_stopping(self) -> None:
        """The job is being stopped: its status reason says so, membership news no longer."""
        self.sink.stopping = True

    def clock(self) -> float:
        return self.coordinator.clock()

    def expect_joiners(self, workers: list[str], within: float, requested_at: float | None) -> None:
        self.coordinator.expect_joiners(workers, within=within, requested_at=requested_at)

    def note_request(self, worker_id: str) -> None:
        """The service asked ``worker_id`` to leave."""
        self.coordinator.note_request(worker_id)

    def worker_exited(self, worker_id: str, failed: bool, reason: str) -> None:
        """A worker's process ended: dead to the coordinator when it ``failed`` (or the
        coordinator still awaited it)."""
        if failed or self.coordinator.awaits(worker_id):
            self.coordinator.mark_dead(worker_id, reason)

    def _find_checkpoint(self):
        found = latest_valid_checkpoint(self.files)
        return (found[0], found[1]) if found else None

    def tick(self) -> Phase:
        try:
            return self.coordinator.tick()
        except StorageError as exc:  # finding a checkpoint: never start over from step 0
            self.coordinator.fail(f"the run folder cannot be read: {exc}")
            return self.coordinator.phase

    def close(self) -> None:
        if self.coordinator.phase is Phase.DONE:
            self.coordinator.drain()
        self.sink.close()


def _secret(run_dir: Path, identity: str, reuse: bool) -> str:
    """The attempt's coordinator secret: the one recorded for it (a restarted service) or a new
    one, kept in the run folder readable by its owner only (workers get it in their
    environment, never on a command line)."""
    path = run_dir / SECRET_FILE
    if reuse:
        try:
            record = json.loads(path.read_text())
            if record.get("job") == identity and record.get("secret"):
                return str(record["secret"])
        except (OSError, ValueError, AttributeError):
            pass
    secret = secrets.token_hex(16)
    tmp = run_dir / f"{SECRET_FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"job": identity, "secret": secret}, f)
    os.replace(tmp, path)
    return secret


def _listen(port: int) -> dist.TCPStore:
    """A TCPStore server on ``port`` (a restarted service's old one), else on a free port."""
    for candidate in dict.fromkeys((port, 0)):
        try:
            return dist.TCPStore("127.0.0.1", candidate, is_master=True, wait_for_workers=False,
                                 timeout=timedelta(seconds=30))
        except Exception:  # the old port was taken meanwhile
            if candidate == 0:
                raise
    raise AssertionError("unreachable")

