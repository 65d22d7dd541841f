"""The keys and messages that workers and the coordinator exchange through the TCPStore.

Workers -> coordinator: each worker appends messages to its own inbox (``inbox/<id>/<k>``, then
bumps ``inbox/<id>/n``), announces itself once on the ``roster`` list (then bumps ``roster/n``,
so that the coordinator polls one number, not the list) and bumps ``hb/<id>`` as a heartbeat.
Coordinator -> workers: ``gen/latest`` and ``gen/<n>`` (the membership of generation n),
``ctl/<n>/<id>`` (run, reform, drain or abort), ``reply/<id>`` (a rejection) and ``job/state``.
A worker whose coordinator was restarted (a new store) first sends ``reattach``: where it stands.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The environment of a worker process (set by the launcher or the service; torch-free, so the
# service can set it without importing torch).
ENV_COORDINATOR = "DYNTRAIN_COORDINATOR"
ENV_WORKER_ID = "DYNTRAIN_WORKER_ID"
ENV_OUT = "DYNTRAIN_OUT"
ENV_CONNECT_TIMEOUT = "DYNTRAIN_CONNECT_TIMEOUT"
# Seconds a worker that lost its coordinator trains on and waits for it to come back (a
# restarted service); 0, the default outside the service, ends the worker at once.
ENV_REATTACH = "DYNTRAIN_REATTACH_SECONDS"
# The address a worker binds and gives its peers, or the interface to take it from (set by
# ``dyntrain worker --advertise-address/--iface``); by default the one it reaches the
# coordinator from (``dyntrain.elastic.address``).
ENV_ADVERTISE = "DYNTRAIN_ADVERTISE_ADDRESS"
ENV_IFACE = "DYNTRAIN_IFACE"

ROSTER = "roster"
ROSTER_COUNT = "roster/n"  # bumped after each roster entry: one number to poll, not the list
GEN_LATEST = "gen/latest"
JOB_STATE = "job/state"
JOB_INFO = "job/info"  # {"out_dir": run folder, "job": who hosts it (same across restarts)}
COORDINATOR_FILE = "coordinator.json"  # in the run folder: {"address", "job"}

CTL_RUN, CTL_REFORM, CTL_DRAIN, CTL_ABORT = "run", "reform", "drain", "abort"


def gen_key(number: int) -> str:
    return f"gen/{number}"


def ctl_key(number: int, worker: str) -> str:
    return f"ctl/{number}/{worker}"


def inbox_key(worker: str, seq: int) -> str:
    return f"inbox/{worker}/{seq}"


def inbox_count_key(worker: str) -> str:
    return f"inbox/{worker}/n"


def heartbeat_key(worker: str) -> str:
    return f"hb/{worker}"


def reply_key(worker: str) -> str:
    return f"reply/{worker}"


@dataclass(frozen=True)
class Generation:
    """One membership of the job: who takes part, from which step, and where state comes from.

    ``source`` is the member whose state everyone adopts (``receivers`` get it by broadcast);
    ``checkpoint`` is set instead when no member holds state and the job resumes from disk;
    ``fresh`` marks a brand-new run whose rank-0 initial state is broadcast to all.
    ``probes``: each member's probe endpoint ("address:port", ``dyntrain.elastic.reach``), in
    the order of ``members`` ("" for one that did not give one).
    """

    number: int
    members: tuple[str, ...]
    start_step: int
    source: str | None = None
    receivers: tuple[str, ...] = ()
    checkpoint: str | None = None
    fresh: bool = False
    probes: tuple[str, ...] = ()

    def rank_of(self, worker: str) -> int:
        return self.members.index(worker)

    @property
    def world_size(self) -> int:
        return len(self.members)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Generation:
        data = json.loads(text)
        data["members"] = tuple(data["members"])
        data["receivers"] = tuple(data["receivers"])
        data["probes"] = tuple(data.get("probes", ()))
        return cls(**data)

    def peer_probes(self, worker: str) -> dict[str, str]:
        """The other members' probe endpoints (those that gave one)."""
        return {w: e for w, e in zip(self.members, self.probes, strict=False)
                if w != worker and e}


@dataclass
class Message:
    """A message from a worker to the coordinator."""

    kind: str
    worker: str
    fields: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "worker": self.worker, **self.fields})

    @classmethod
    def from_json(cls, text: str | bytes) -> Message:
        data = json.loads(text)
        return cls(kind=data.pop("kind"), worker=data.pop("worker"), fields=data)


#: a job's coordinator secret: every key of its store lives under it, so a client without it
#: (anyone who can reach the port) can neither read the job's keys nor post to its inboxes
ENV_SECRET = "DYNTRAIN_COORDINATOR_SECRET"


def write_coordinator_file(run_dir: Path, address: str, job: str) -> None:
    """Record where the job's coordinator listens, for workers that lost it (atomic replace)."""
    tmp = run_dir / f"{COORDINATOR_FILE}.tmp"
    tmp.write_text(json.dumps({"address": address, "job": job}) + "\n")
    os.replace(tmp, run_dir / COORDINATOR_FILE)


def read_coordinator_file(run_dir: Path) -> dict:
    """What ``write_coordinator_file`` left in ``run_dir``; {} when there is nothing readable."""
    try:
        record = json.loads((run_dir / COORDINATOR_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
