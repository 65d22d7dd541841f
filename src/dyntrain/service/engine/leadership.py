"""One service replica's part in the election: it seeks, holds and renews the controller's
lease in the database (``store/leases.py``), and records its heartbeat.

A thread claims the lease every ``renew_seconds``: the leader renews it for ``ttl_seconds``,
another replica takes it over once it has lapsed (by the database's clock). The leader trusts
its lease until ``ttl_seconds`` after it *sent* its last successful renewal, measured on its own
monotonic clock: the database stamped the renewal later than that, so the leader stops believing
in it no later than the database lets it lapse, whatever the hosts' clocks say (only their rates
must agree, as they do). A leader frozen (SIGSTOP, a partition) past that point finds, before
its next step, that its term is over (``valid``); a write already on its way is refused by the
database (``Store.fenced``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dyntrain.errors import DyntrainError
from dyntrain.service.store import Store

log = logging.getLogger("dyntrain.service")


@dataclass(frozen=True)
class LeaseConfig:
    """How one replica takes part in the election.

    Args:
        name: this replica's name (unique among the replicas; default: host and port).
        url: where this replica answers (what the dashboard and the lease show).
        ttl_seconds: a lease not renewed this long lapses and another replica takes it.
        renew_seconds: how often the leader renews it (and every replica records its
            heartbeat).
    """

    name: str
    url: str | None = None
    ttl_seconds: float = 5.0
    renew_seconds: float = 1.0

    def __post_init__(self) -> None:
        if not self.renew_seconds > 0:
            raise DyntrainError(f"--lease-renew-seconds must be > 0, got {self.renew_seconds:g}")
        if not self.ttl_seconds >= 2 * self.renew_seconds:
            raise DyntrainError(f"--lease-ttl-seconds ({self.ttl_seconds:g}) must be at least "
                                f"twice --lease-renew-seconds ({self.renew_seconds:g})")


class Leadership:
    """Seeks and holds the controller's lease for one replica (see the module docstring).

    Args:
        store: the database the replicas share.
        config: this replica's name and the lease's timings.
        monotonic: this host's monotonic clock (tests may pass their own).
    """

    def __init__(self, store: Store, config: LeaseConfig,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store, self.config, self.monotonic = store, config, monotonic
        self.epoch: int | None = None  # the term this replica holds, None: it does not lead
        self.since: float | None = None  # when that term began (database time)
        self.changed = threading.Event()  # set whenever the term begins or ends
        self._valid_until = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def term(self) -> int | None:
        """The epoch of the term this replica holds now, None when it does not lead (or its
        lease may have lapsed)."""
        with self._lock:
            if self.epoch is not None and self.monotonic() < self._valid_until:
                return self.epoch
            return None

    def valid(self, epoch: int) -> bool:
        """Whether this replica still holds term ``epoch``."""
        return self.term() == epoch

    def claim(self) -> int | None:
        """One round: renew or take the lease, record the heartbeat; returns the term held."""
        sent = self.monotonic()
        try:
            lease = self.store.leases.claim(self.config.name, self.config.url,
                                            self.config.ttl_seconds, self.epoch)
        except Exception as exc:  # the database does not answer: the lease runs out by itself
            log.warning("cannot renew the controller's lease: %s", str(exc).splitlines()[0])
            return self.term()
        with self._lock:
            if lease is None:
                if self.epoch is not None:
                    log.warning("replica %s lost the controller's lease (epoch %d)",
                                self.config.name, self.epoch)
                    self.epoch, self.since = None, None
                    self.changed.set()
            else:
                if lease.epoch != self.epoch:
                    log.warning("replica %s leads (epoch %d)", self.config.name, lease.epoch)
                    self.epoch, self.since = lease.epoch, lease.acquired_at
                    self.changed.set()
                self._valid_until = sent + self.config.ttl_seconds
        try:
            self.store.leases.beat(self.config.name, self.config.url, lease is not None)
        except Exception as exc:
            log.warning("cannot record this replica's heartbeat: %s", str(exc).splitlines()[0])
        return self.term()

    def lost(self, epoch: int) -> None:
        """Term ``epoch`` is over (a write was fenced): claim anew from the next round on."""
        with self._lock:
            if self.epoch == epoch:
                self.epoch, self.since = None, None
                self.changed.set()

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                self.claim()
                self._stop.wait(self.config.renew_seconds)

        self._thread = threading.Thread(target=loop, daemon=True, name="dyntrain-lease")
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming; a lease held is let go at once, so another replica takes it now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            epoch, self.epoch = self.epoch, None
        if epoch is not None:
            try:
                self.store.leases.release(self.config.name, epoch)
            except Exception as exc:
                log.warning("cannot let the controller's lease go: %s", str(exc).splitlines()[0])
