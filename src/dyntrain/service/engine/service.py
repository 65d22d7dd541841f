"""The service process: a store, an executor and the controller loop, behind the REST API.

With ``replica`` the service is one of several replicas on one PostgreSQL database (see
``docs/replicas.md``): each answers every API from the database, and the one that holds the
controller's lease (``engine/leadership.py``) runs the controller, every write of its loop
fenced by that lease (``Store.fenced``). A replica that takes the lease over builds a new
executor and controller and recovers what the previous leader left running, as a restarted
service does (``Controller.recover``); one that loses it stops acting at once: its loop stops,
its executor stops watching (the workers run on, for the next leader to adopt) and the
coordinators it hosted are dropped.
"""

from __future__ import annotations

import gc
import ipaddress
import logging
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from dyntrain.errors import DyntrainError
from dyntrain.service.core.allocation import policy_by_name
from dyntrain.service.core.executor import Executor
from dyntrain.service.core.model import (
    DEFAULT_PORT,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    ValidationError,
)
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.controller import Controller
from dyntrain.service.engine.leadership import Leadership, LeaseConfig
from dyntrain.service.engine.statelock import StateDirLock
from dyntrain.service.store import Store
from dyntrain.service.store.leases import Fenced, LeaseStore

log = logging.getLogger("dyntrain.service")


@dataclass
class ServiceConfig:
    state_dir: Path
    db_url: str | None = None  # default: sqlite:///<state_dir>/dyntrain.db
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    grace_seconds: float = 120.0
    reattach_seconds: float = 300.0  # elastic workers wait this long for a restarted service
    policy: str = "fifo"  # allocation policy: fifo, fair or goodput (core/allocation.py)
    replica: bool = False  # one of several replicas on one PostgreSQL database
    replica_name: str | None = None  # default: host:port
    lease_ttl: float = 5.0  # seconds a leader's lease lasts unrenewed (LeaseConfig)
    lease_renew: float = 1.0  # seconds between two renewals

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        if self.replica and self.url.startswith("sqlite"):
            raise DyntrainError(f"several replicas need PostgreSQL: --replica was given with "
                                f"the SQLite database {self.url}; pass --db "
                                "postgresql+psycopg://USER@HOST:PORT/DB")
        if not is_loopback(self.host) and not self.token:
            raise DyntrainError(f"refusing to listen on {self.host} without a token: pass --token "
                                "(or DYNTRAIN_TOKEN) or listen on 127.0.0.1")

    @property
    def url(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'dyntrain.db'}"


def _import_coordinators() -> None:
    try:
        import dyntrain.service.engine.elastic_host  # noqa: F401
    except Exception as exc:  # the takeover says it again, in its context
        log.warning("cannot import the coordinators' modules: %s", exc)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ExecutorSetup(Protocol):
    """Which executor the service runs its workers with: chosen and built by the assembly
    (``dyntrain.service.assembly``), handed in; the engine never imports an executor."""

    def build(self, state_dir: Path) -> Executor:
        """The executor, keeping its own state in ``state_dir``."""

    def default_environment(self) -> ComputeEnvironmentSpec:
        """The compute environment a new state directory starts with."""


class Service:
    """Owns the store, the executor and the controller; the API calls into it under ``lock``.

    Args:
        config: what to serve and where.
        executor: builds the executor, once the state directory is this service's.
        state_lock: the state directory's lock, already held (``dyntrain server`` takes it
            before it binds its port); None: taken here. Either way the service holds it until
            ``stop``, and a second service on the same state directory is refused
            (``StateDirLocked``).
    """

    def __init__(self, config: ServiceConfig, executor: ExecutorSetup,
                 state_lock: StateDirLock | None = None) -> None:
        self.config = config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        if state_lock is None and not config.replica:  # replicas share it: the lease rules
            state_lock = StateDirLock(config.state_dir)
            state_lock.acquire(f"http://{config.host}:{config.port}")
        self.state_lock = state_lock
        try:
            self._build(config, executor)
        except BaseException:
            if state_lock is not None:
                state_lock.release()
            raise

    def _build(self, config: ServiceConfig, executor: ExecutorSetup) -> None:
        # a replica frozen inside a transaction must not hold the lease's row lock (and so
        # keep the others from taking it over) for longer than the lease itself lasts
        self.store = Store(config.url, idle_transaction_ms=int(config.lease_ttl * 1000)
                           if config.replica else None)
        self._create_schema()
        self._setup = executor
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observers: list = []  # the scheduling passes' observers, kept across terms
        self.leadership: Leadership | None = None
        self.executor, self.controller = self._controller()
        if config.replica:
            self.leadership = Leadership(self.store, LeaseConfig(
                config.replica_name or f"{config.host}:{config.port}",
                f"http://{config.host}:{config.port}", config.lease_ttl, config.lease_renew))
            self.controller.leading = False
            self.recovered: list[str] = []
        else:
            self.recovered = self.controller.recover()
        try:
            self._ensure_defaults(executor.default_environment())
        except ValidationError:
            if not config.replica:
                raise  # a replica starting at the same time made them

    def _create_schema(self) -> None:
        try:
            self.store.create_all()
        except Exception:  # replicas starting at once: another one created the tables
            if not self.config.replica:
                raise
            self.store.create_all()

    def _controller(self) -> tuple[Executor, Controller]:
        config = self.config
        built = self._setup.build(config.state_dir / "executor")
        controller = Controller(self.store, built, ControllerConfig(
            config.state_dir / "runs", grace_seconds=config.grace_seconds,
            reattach_seconds=config.reattach_seconds, policy=policy_by_name(config.policy),
            replicated=config.replica))
        controller.pass_observers = self._observers
        return built, controller

    def _ensure_defaults(self, environment: ComputeEnvironmentSpec) -> None:
        """A new state directory starts with the executor's default compute environment and a
        ``default`` queue on it."""
        if not self.store.environments.list_compute_environments():
            self.store.environments.create_compute_environment(environment)
            self.store.environments.create_job_queue(JobQueueSpec("default", 1,
                                                                  (environment.name,)))

    def start(self) -> None:
        """Run the controller loop in a background thread (a replica's: whenever it leads)."""
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    with self.lock:
                        self.controller.step()
                except Exception as exc:  # one bad step must not stop scheduling for good
                    log.exception("controller step failed: %s", exc)
                    self._record_failure(exc)
                # wakes early when a worker exits, so the next start follows at once
                self.executor.wait(self.controller.config.tick_seconds)

        if self.leadership is not None:
            self.leadership.start()
            # a standby imports what hosting coordinators needs (torch) now, not at takeover
            threading.Thread(target=_import_coordinators, daemon=True,
                             name="dyntrain-standby").start()
        self._thread = threading.Thread(
            target=loop if self.leadership is None else self._replica_loop, daemon=True,
            name="dyntrain-controller")
        self._thread.start()

    def _replica_loop(self) -> None:
        """A replica's controller loop: steps while this replica holds its term, each step's
        writes fenced by it; a term that ends (the lease lost, a write fenced) stops it."""
        leadership = self.leadership
        assert leadership is not None
        epoch: int | None = None  # the term this loop acts in
        while not self._stop.is_set():
            held = leadership.term()
            if epoch is not None and held != epoch:
                self._end_term(epoch)
                epoch = None
            if held is None:
                leadership.changed.wait(0.1)
                leadership.changed.clear()
                continue
            check = partial(LeaseStore.check, holder=leadership.config.name, epoch=held)
            try:
                with self.store.fenced(check):
                    if epoch is None:
                        epoch = held
                        self._begin_term(epoch)
                    with self.lock:
                        self.controller.step()
            except Fenced as exc:
                log.warning("%s: stops acting", exc)
                leadership.lost(held)
                continue
            except Exception as exc:  # one bad step must not stop scheduling for good
                if not leadership.valid(held):  # frozen mid-step: the database ended it
                    log.warning("the step of a term that ended failed (%s): stops acting",
                                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                    continue
                log.exception("controller step failed: %s", exc)
                self._record_failure(exc)
            self.executor.wait(self.controller.config.tick_seconds)

    def _begin_term(self, epoch: int) -> None:
        """This replica leads from now on: a new executor and controller that recover what
        the previous leader left running."""
        with self.lock:
            self.executor.hand_over()
            self.executor, self.controller = self._controller()
            notes = self.controller.recover()
        self.store.logs.add_event(None, "service.leader", {
            "replica": self.leadership.config.name if self.leadership else None,
            "epoch": epoch, "recovered": notes[:20]})
        for note in notes:
            log.warning("recovered: %s", note)

    def _end_term(self, epoch: int) -> None:
        """This replica no longer leads: stop acting at once. Its executor stops watching (the
        workers run on), its coordinators are dropped; a controller that does not lead answers
        the APIs."""
        log.warning("replica lost the controller's lease (epoch %d): stops acting", epoch)
        with self.lock:
            self.executor.hand_over()
            self.executor, self.controller = self._controller()
            self.controller.leading = False
        gc.collect()  # the dropped coordinators' stores stop listening now

    def leader(self) -> tuple[bool, int | None]:
        """Whether this service leads, and its lease's epoch (None: no replicas)."""
        if self.leadership is None:
            return True, None
        held = self.leadership.term()
        if held is not None:
            return True, held
        try:
            lease = self.store.leases.current()
        except Exception:
            return False, None
        return False, None if lease is None else lease.epoch

    def _record_failure(self, exc: Exception) -> None:
        try:
            self.store.logs.add_event(None, "controller.error",
                                 {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
        except Exception:
            log.exception("could not record the controller error")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.executor.shutdown()
        if self.leadership is not None:
            self.leadership.stop()
        self.store.close()
        if self.state_lock is not None:
            self.state_lock.release()
