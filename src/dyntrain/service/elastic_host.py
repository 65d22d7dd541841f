"""Hosting an elastic job's coordinator inside the service, one per running attempt."""

from __future__ import annotations

import json
import os
import secrets
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.channel import parse_address
from dyntrain.elastic.checkpoint import latest_valid_checkpoint
from dyntrain.elastic.coordinator import Coordinator, CoordinatorConfig, Phase
from dyntrain.launch.runner import RunSink
from dyntrain.service.model import JobStatus
from dyntrain.service.store import Store

PROGRESS_FIELDS = ("step", "total_steps", "epoch", "world_size", "loss", "samples_per_s", "time")
PROGRESS_EVERY = 1.0  # seconds between two progress writes to the store
SECRET_FILE = "coordinator.secret"


class ServiceSink(RunSink):
    """The launcher's files (events.jsonl, metrics.jsonl, result.json), plus service events, the
    job's progress (its latest metrics, at most once a second) and a status reason that follows
    its membership changes."""

    def __init__(self, store: Store, job_id: str, run_dir: Path) -> None:
        super().__init__(run_dir, "?", stream=None, quiet=True, every=1e9)
        self.store, self.job_id = store, job_id
        self._progress_at = -PROGRESS_EVERY
        self._progress_of: dict | None = None  # the metrics record last written as progress

    def event(self, record: dict) -> None:
        super().event(record)
        self.store.add_event(self.job_id, f"membership.{record['event']}", record)
        world, who = record.get("world_after"), ", ".join(record.get("workers") or [])
        if world is not None:
            self.store.update_job(
                self.job_id, expected_status=JobStatus.RUNNING,
                status_reason=f"training with {world} worker(s) since generation "
                              f"{record.get('generation')} ({record['event']}"
                              f"{': ' + who if who else ''})")

    def metrics(self, record: dict) -> None:
        super().metrics(record)
        now = time.monotonic()
        last = self._progress_of or {}
        if (now - self._progress_at >= PROGRESS_EVERY
                or record.get("world_size") != last.get("world_size")):
            self._write_progress(record, now)

    def _write_progress(self, record: dict, now: float) -> None:
        progress = {k: record[k] for k in PROGRESS_FIELDS if k in record}
        progress["generation"] = record.get("gen")
        self.store.update_job(self.job_id, progress=progress)
        self._progress_at, self._progress_of = now, record

    def close(self) -> None:
        if self.last_metrics is not None and self.last_metrics is not self._progress_of:
            self._write_progress(self.last_metrics, time.monotonic())
        super().close()

    def log(self, line: str) -> None:
        self.store.add_event(self.job_id, "coordinator", {"message": line})


class ElasticHost:
    """A TCPStore server and a Coordinator for one attempt of one elastic job.

    Its address and identity (job id and attempt) go to ``coordinator.json`` in the run folder.
    ``recovering`` (after a service restart): the attempt's workers that may still run; the
    store listens on the recorded port again if it can (else on a new one, which the file
    tells the workers) and the coordinator is rebuilt from their reports.
    """

    def __init__(self, store: Store, job_id: str, run_dir: Path, min_workers: int,
                 max_workers: int, expected: int, failure_timeout: float = p.FAILURE_TIMEOUT,
                 attempt: int = 1, recovering: list[str] | None = None,
                 host: str = "127.0.0.1") -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.identity = f"{job_id}/attempt-{attempt}"
        previous = p.read_coordinator_file(run_dir) if recovering is not None else {}
        same = previous.get("job") == self.identity
        port = parse_address(previous["address"])[1] if same and "address" in previous else 0
        self.secret = _secret(run_dir, self.identity, reuse=recovering is not None)
        self.tcp = _listen(port)  # TCPStore listens on every interface, whatever the host
        jobstore = dist.PrefixStore(self.secret, self.tcp)
        self.address = f"{host}:{self.tcp.port}"
        jobstore.set(p.JOB_INFO, json.dumps({"out_dir": str(run_dir.resolve()),
                                             "job": self.identity}))
        p.write_coordinator_file(run_dir, self.address, self.identity)
        self.sink = ServiceSink(store, job_id, run_dir)
        self.coordinator = Coordinator(
            jobstore, CoordinatorConfig(min_workers, max_workers, expected_initial=expected,
                                        settle_seconds=2.0, failure_timeout=failure_timeout),
            self.sink, self._find_checkpoint)
        if recovering is not None:
            self.coordinator.expect_reattach(recovering, _last_step(run_dir / "metrics.jsonl"))

    def _find_checkpoint(self):
        found = latest_valid_checkpoint(self.run_dir / "checkpoints")
        return (found[0], str(found[1])) if found else None

    def tick(self) -> Phase:
        return self.coordinator.tick()

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


def _last_step(metrics: Path) -> int:
    """The step of the last complete row of a metrics file (0 when there is none)."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 65536))
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0
