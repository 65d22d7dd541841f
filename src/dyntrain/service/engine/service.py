"""The service process: a store, an executor and the controller loop, behind the REST API."""

from __future__ import annotations

import ipaddress
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dyntrain.errors import DyntrainError
from dyntrain.service.core.allocation import policy_by_name
from dyntrain.service.core.executor import Executor
from dyntrain.service.core.model import DEFAULT_PORT, ComputeEnvironmentSpec, JobQueueSpec
from dyntrain.service.engine.config import ControllerConfig
from dyntrain.service.engine.controller import Controller
from dyntrain.service.engine.statelock import StateDirLock
from dyntrain.service.store import Store

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

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        if not is_loopback(self.host) and not self.token:
            raise DyntrainError(f"refusing to listen on {self.host} without a token: pass --token "
                                "(or DYNTRAIN_TOKEN) or listen on 127.0.0.1")

    @property
    def url(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'dyntrain.db'}"


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
        if state_lock is None:
            state_lock = StateDirLock(config.state_dir)
            state_lock.acquire(f"http://{config.host}:{config.port}")
        self.state_lock = state_lock
        try:
            self._build(config, executor)
        except BaseException:
            state_lock.release()
            raise

    def _build(self, config: ServiceConfig, executor: ExecutorSetup) -> None:
        self.store = Store(config.url)
        self.store.create_all()
        self.executor = executor.build(config.state_dir / "executor")
        self.controller = Controller(self.store, self.executor, ControllerConfig(
            config.state_dir / "runs", grace_seconds=config.grace_seconds,
            reattach_seconds=config.reattach_seconds, policy=policy_by_name(config.policy)))
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.recovered = self.controller.recover()
        self._ensure_defaults(executor.default_environment())

    def _ensure_defaults(self, environment: ComputeEnvironmentSpec) -> None:
        """A new state directory starts with the executor's default compute environment and a
        ``default`` queue on it."""
        if not self.store.environments.list_compute_environments():
            self.store.environments.create_compute_environment(environment)
            self.store.environments.create_job_queue(JobQueueSpec("default", 1,
                                                                  (environment.name,)))

    def start(self) -> None:
        """Run the controller loop in a background thread."""
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

        self._thread = threading.Thread(target=loop, daemon=True, name="dyntrain-controller")
        self._thread.start()

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
        self.store.close()
        self.state_lock.release()
