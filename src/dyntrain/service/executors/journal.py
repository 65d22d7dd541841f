"""What the local executor's supervisors leave in its state dir, read back: the journal of the
workers each one started (``supervisor-*.started``) and each worker's status file."""

from __future__ import annotations

import json
from pathlib import Path


def journal_entry(directory: Path, worker_id: str) -> dict | None:
    """Where the supervisors' journals say ``worker_id`` was started, if they say so."""
    needle = json.dumps(worker_id)
    for journal in directory.glob("supervisor-*.started"):
        try:
            lines = journal.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if needle in line:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if entry.get("id") == worker_id:
                    return entry
    return None


def read_status(path: Path) -> dict | None:
    """A worker's status file (what its supervisor recorded), None when unreadable."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
