"""Where a job's coordinator listens, recorded in its run folder for workers that lost it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dyntrain.elastic.runs.storage import StorageError, open_store

COORDINATOR_FILE = "coordinator.json"  # in the run folder: {"address", "job"}


def write_coordinator_file(run_dir: Path, address: str, job: str) -> None:
    """Record where the job's coordinator listens, for workers that lost it (atomic replace)."""
    tmp = run_dir / f"{COORDINATOR_FILE}.tmp"
    tmp.write_text(json.dumps({"address": address, "job": job}) + "\n")
    os.replace(tmp, run_dir / COORDINATOR_FILE)


def read_coordinator_file(run_dir: str | Path) -> dict:
    """What ``write_coordinator_file`` left in ``run_dir`` (a folder or an object-store URL);
    {} when there is nothing readable."""
    try:
        record = json.loads(open_store(run_dir).get(COORDINATOR_FILE))
    except (OSError, ValueError, StorageError):
        return {}
    return record if isinstance(record, dict) else {}
