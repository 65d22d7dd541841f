"""Hosting an elastic job's coordinator inside the service, one per running attempt."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.checkpoint import latest_valid_checkpoint
from dyntrain.elastic.coordinator import Coordinator, CoordinatorConfig, Phase
from dyntrain.launch.runner import RunSink
from dyntrain.service.store import Store


class ServiceSink(RunSink):
    """The launcher's files (events.jsonl, metrics.jsonl, result.json), plus service events."""

    def __init__(self, store: Store, job_id: str, run_dir: Path) -> None:
        super().__init__(run_dir, "?", stream=None, quiet=True, every=1e9)
        self.store, self.job_id = store, job_id

    def event(self, record: dict) -> None:
        super().event(record)
        self.store.add_event(self.job_id, f"membership.{record['event']}", record)

    def log(self, line: str) -> None:
        self.store.add_event(self.job_id, "coordinator", {"message": line})


class ElasticHost:
    """A TCPStore server and a Coordinator for one attempt of one elastic job."""

    def __init__(self, store: Store, job_id: str, run_dir: Path, min_workers: int,
                 max_workers: int, expected: int, failure_timeout: float = 10.0) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.tcp = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                 timeout=timedelta(seconds=30))
        self.address = f"127.0.0.1:{self.tcp.port}"
        self.tcp.set(p.JOB_INFO, json.dumps({"out_dir": str(run_dir.resolve())}))
        self.sink = ServiceSink(store, job_id, run_dir)
        self.coordinator = Coordinator(
            self.tcp, CoordinatorConfig(min_workers, max_workers, expected_initial=expected,
                                        settle_seconds=2.0, failure_timeout=failure_timeout),
            self.sink, self._find_checkpoint)

    def _find_checkpoint(self):
        found = latest_valid_checkpoint(self.run_dir / "checkpoints")
        return (found[0], str(found[1])) if found else None

    def tick(self) -> Phase:
        return self.coordinator.tick()

    def close(self) -> None:
        if self.coordinator.phase is Phase.DONE:
            self.coordinator.drain()
        self.sink.close()
