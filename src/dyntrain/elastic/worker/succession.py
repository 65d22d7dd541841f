"""Who hosts a ``dyntrain run`` job's coordinator when its host is lost for good (``--takeover``).

The launcher of ``dyntrain run --takeover`` puts a ``Takeover`` into the job's ``job/info``;
every worker reads it when it connects, so it still holds it when the store is gone with the
launcher's host. A worker that has been without its coordinator for ``after`` seconds looks at
the last generation it took part in:

- the lost host is the host of the coordinator's address; the members whose failure domain
  (``Generation.failure_domains``: the host of their probe endpoint) is that host are presumed
  lost with it (the launcher's local workers die with the launcher);
- the successors are the other members in rank order: every member of the generation computes
  the same list from the same message, without asking anyone (``successors``);
- a worker notices the loss within half the delay even when the host's connections stay open
  and silent (``silence_bound``: the channel then cuts them, ``connect.sever``);
- successor ``k`` hosts a new coordinator once the old one has been away for ``after * (k +
  1) + k * STARTUP_SECONDS`` seconds and no successor answered (``due``): the first one,
  unless it is lost too; one that finds an earlier successor hosting the job (its address
  answers with the job, or the run folder's claim of that epoch is another's) yields;
- it listens on its own host at the old coordinator's port (``successor_addresses``): every
  survivor knows that address without the store or the run folder, and tries it beside the
  run folder's ``coordinator.json``, where the successor claims the coordinator with the
  next epoch (a host that cannot read the run folder finds it all the same).

The successor's coordinator is rebuilt from the workers' own positions, as a restarted service's
is (``Coordinator.expect_reattach``): nothing is read from the old store. ``Succession`` is the
thin part: it starts ``python -m dyntrain.launch.successor`` in a session of its own, so that the
new coordinator outlives the worker that started it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dyntrain.elastic import protocol as p

#: the key of ``job/info`` that holds a ``Takeover``
INFO_KEY = "takeover"


@dataclass(frozen=True)
class Takeover:
    """How the workers of a job take its coordinator over.

    Args:
        after: seconds without the coordinator before the first successor hosts a new one.
        within: seconds a worker waits for a coordinator (old or new) before it stops.
        coordinator: the ``CoordinatorConfig`` fields a successor needs (``min_workers``,
            ``max_workers``, ``settle_seconds``, ``failure_timeout``, ``allow_mixed_numerics``).
        epoch: how many times the coordinator moved (0: the launcher's).
    """

    after: float
    within: float
    coordinator: dict = field(default_factory=dict)
    epoch: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_info(cls, info: dict) -> Takeover | None:
        """The takeover of a job's ``job/info`` (None: the job has none)."""
        raw = info.get(INFO_KEY)
        if not isinstance(raw, dict):
            return None
        return cls(float(raw["after"]), float(raw["within"]), dict(raw.get("coordinator", {})),
                   int(raw.get("epoch", 0)))


def lost_host(coordinator_address: str) -> str:
    """The host of a coordinator's ``HOST:PORT``."""
    return coordinator_address.rpartition(":")[0]


def successors(gen: p.Generation, lost: str) -> list[str]:
    """The members of ``gen`` that may host the next coordinator, first first: those not on the
    ``lost`` host, in rank order."""
    domains = gen.failure_domains()
    return [w for w in gen.members if domains[w] != lost]


def presumed_lost(gen: p.Generation, lost: str) -> list[str]:
    """The members of ``gen`` on the ``lost`` host: gone with it."""
    domains = gen.failure_domains()
    return [w for w in gen.members if domains[w] == lost]


def successor_addresses(gen: p.Generation, lost: str, port: int) -> list[str]:
    """Where each successor's coordinator listens: its host, the old coordinator's port."""
    domains = gen.failure_domains()
    return list(dict.fromkeys(f"{domains[w]}:{port}" for w in successors(gen, lost)))


def earlier_addresses(gen: p.Generation, lost: str, worker: str, port: int) -> list[str]:
    """Where the successors ranked before ``worker`` would listen (it yields to them)."""
    order, domains = successors(gen, lost), gen.failure_domains()
    before = order[:order.index(worker)] if worker in order else order
    return list(dict.fromkeys(f"{domains[w]}:{port}" for w in before))


#: seconds a successor's process may take to listen (it imports torch) before the next
#: successor may start one too
STARTUP_SECONDS = 60.0


def due(gen: p.Generation, lost: str, worker: str, away: float, after: float) -> bool:
    """Whether ``worker`` should host a coordinator now, the old one away for ``away`` s:
    successor ``k`` after ``after * (k + 1) + k * STARTUP_SECONDS``."""
    order = successors(gen, lost)
    if worker not in order:
        return False
    k = order.index(worker)
    return away >= after * (k + 1) + k * STARTUP_SECONDS


class Succession:
    """A worker's part in a takeover: where to look for a successor, and hosting one when due.

    Args:
        takeover: the job's ``Takeover`` (None: the job has none, and this does nothing).
        info: the job's ``job/info`` (its run folder, job id, numerics).
        worker: this worker's id.
        position: where this worker stands (its last generation).
    """

    def __init__(self, takeover: Takeover | None, info: dict, worker: str,
                 position: Callable[[], p.Position]) -> None:
        self.takeover, self.info, self.worker, self.position = takeover, info, worker, position
        self.started: subprocess.Popen | None = None

    @property
    def within(self) -> float:
        """Seconds to wait for a coordinator, old or new (0: no takeover)."""
        return self.takeover.within if self.takeover else 0.0

    @property
    def silence_bound(self) -> float:
        """Seconds without an answer from the coordinator's store before its connections are
        cut (half the takeover's delay, at least 2 s): see ``WorkerChannel._guard_loop``."""
        return max(2.0, self.takeover.after / 2) if self.takeover else 0.0

    def addresses(self, coordinator: str) -> list[str]:
        """The successors' addresses after losing ``coordinator`` (none before a generation)."""
        gen = self.position().generation
        if self.takeover is None or gen is None:
            return []
        port = int(coordinator.rpartition(":")[2])
        return successor_addresses(gen, lost_host(coordinator), port)

    def poll(self, coordinator: str, away: float) -> None:
        """Host a coordinator if this worker is the successor due after ``away`` seconds."""
        gen = self.position().generation
        lost = lost_host(coordinator)
        if self.takeover is None or self.started is not None or gen is None or \
                not due(gen, lost, self.worker, away, self.takeover.after):
            return
        spec = {"info": self.info, "takeover": self.takeover.to_json(), "by": self.worker,
                "host": gen.failure_domains()[self.worker],
                "port": int(coordinator.rpartition(":")[2]), "lost_host": lost,
                "expect": list(gen.members), "lost": presumed_lost(gen, lost),
                "earlier": earlier_addresses(gen, lost, self.worker,
                                             int(coordinator.rpartition(":")[2]))}
        log = Path(tempfile.gettempdir()) / f"dyntrain-successor-{self.worker}.log"
        with open(log, "ab") as out:
            self.started = subprocess.Popen(
                [sys.executable, "-m", "dyntrain.launch.successor", json.dumps(spec)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env={k: v for k, v in os.environ.items()
                                             if not k.startswith("DYNTRAIN_")})
