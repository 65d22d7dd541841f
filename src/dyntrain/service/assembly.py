"""Which executor runs the service's workers, and how it is built: the one place that knows the
implementations (``executors/local.py``, ``executors/ray.py``) and their options.

The engine's ``Service`` is handed an ``ExecutorSetup`` (one of the two below) and builds the
executor with it once the state directory is its own; it never imports an executor.
``dyntrain server`` chooses one with ``--executor``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dyntrain.service.core.executor import Executor
from dyntrain.service.core.model import CapacityType, ComputeEnvironmentSpec, Resources
from dyntrain.service.engine.service import ExecutorSetup, Service, ServiceConfig
from dyntrain.service.engine.statelock import StateDirLock

#: the one slot of a default compute environment: a core and 1 GiB
DEFAULT_SLOT = Resources(1.0, 0, 1024)


@dataclass(frozen=True)
class LocalExecutorSetup:
    """Workers are processes on this machine.

    Args:
        warm_workers: Python processes with torch imported kept ready to become workers.
        coordinator_host: where workers reach job coordinators (default: 127.0.0.1).
    """

    warm_workers: int = 1
    coordinator_host: str | None = None

    def build(self, state_dir: Path) -> Executor:
        from dyntrain.service.executors.local import LocalExecutor

        executor = LocalExecutor(state_dir, warm_workers=self.warm_workers)
        if self.coordinator_host:
            executor.coordinator_host = self.coordinator_host
        return executor

    def default_environment(self) -> ComputeEnvironmentSpec:
        """``local``: on demand, one slot per core of this machine."""
        cpus = os.cpu_count() or 1
        return ComputeEnvironmentSpec("local", CapacityType.ON_DEMAND, 0.0, DEFAULT_SLOT, 0,
                                      cpus, cpus)


@dataclass(frozen=True)
class RayExecutorSetup:
    """Workers run on the nodes of a Ray cluster (the ``dyntrain[ray]`` extra).

    Args:
        address: the cluster's GCS address HOST:PORT, or ``auto``.
        namespace: the Ray namespace of the service's actors (default: one per state dir).
        placement: ``pack`` (a job's new workers prefer its nodes) or ``spread``.
        fence_seconds: a worker cut off from the cluster this long is killed.
        coordinator_host: where workers reach job coordinators (default: the address the
            cluster sees for this host).
    """

    address: str = "auto"
    namespace: str | None = None
    placement: str = "pack"
    fence_seconds: float = 10.0
    coordinator_host: str | None = None

    def build(self, state_dir: Path) -> Executor:
        from dyntrain.service.executors.ray import RayExecutor

        executor = RayExecutor(state_dir, address=self.address, namespace=self.namespace,
                               placement=self.placement, fence_seconds=self.fence_seconds)
        if self.coordinator_host:
            executor.coordinator_host = self.coordinator_host
        return executor

    def default_environment(self) -> ComputeEnvironmentSpec:
        """``ray``: its slots are what the nodes carrying ``dyntrain_ce_ray`` offer."""
        return ComputeEnvironmentSpec("ray", CapacityType.ON_DEMAND, 0.0, DEFAULT_SLOT, 0, 0,
                                      10_000)


def build_service(config: ServiceConfig, executor: ExecutorSetup = LocalExecutorSetup(),
                  state_lock: StateDirLock | None = None) -> Service:
    """The service of ``config`` with its workers where ``executor`` says.

    Args:
        config: what to serve and where.
        executor: which executor runs the workers, with its options.
        state_lock: the state directory's lock, already held; None: taken here.
    """
    return Service(config, executor, state_lock)
