"""How the Ray executor names what it makes in the cluster and counts what the nodes offer: the
custom resource that marks a node as an environment's capacity, the actors' names and
namespace, and the slots one node holds."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dyntrain.service.core.executor import ExecutorError, WorkerSpec, describe
from dyntrain.service.core.model import Resources

RESOURCE_PREFIX = "dyntrain_ce_"
EXTRA = "pip install 'dyntrain[ray]'"


def import_ray():
    """The ``ray`` module, or a one-line error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"--executor ray needs Ray: {EXTRA}") from None
    return ray


def resource_name(environment: str) -> str:
    """The custom resource that marks a Ray node as capacity of ``environment``."""
    return f"{RESOURCE_PREFIX}{environment}"


def actor_name(spec: WorkerSpec) -> str:
    return f"dyntrain:{spec.job_id}:{spec.attempt}:{spec.worker_id}"


def main_actor_name(spec: WorkerSpec) -> str:
    """The actor name of the main worker of ``spec``'s gang (``spec.main_worker``)."""
    return f"dyntrain:{spec.job_id}:{spec.attempt}:{spec.main_worker}"


def packed_on(node: str | None):
    """Ray's scheduling strategy for a worker packed beside its job's others on ``node``
    (None: the job has no worker yet, anywhere will do)."""
    if node is None:
        return "DEFAULT"
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # soft + spill: the node it runs on when that has room, else any node (not a wait)
    return NodeAffinitySchedulingStrategy(node, soft=True, _spill_on_unavailable=True)


def default_namespace(state_dir: str | os.PathLike) -> str:
    """A namespace of this service: one per state dir, so two services never share actors."""
    digest = hashlib.sha1(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]
    return f"dyntrain-{digest}"


def node_slots(resources: dict[str, float], environment: str, slot: Resources) -> int:
    """Slots of ``environment`` one node offers: its units of the environment's resource, bounded
    by how many slots its CPUs, GPUs and memory hold."""
    bounds = [int(resources.get(resource_name(environment), 0))]
    if slot.cpus > 0:
        bounds.append(int(resources.get("CPU", 0) / slot.cpus + 1e-9))
    if slot.gpus > 0:
        bounds.append(int(resources.get("GPU", 0) // slot.gpus))
    if slot.memory_mib > 0 and "memory" in resources:
        bounds.append(int(resources["memory"] // (slot.memory_mib * 2**20)))
    return max(0, min(bounds))


def needs(spec: WorkerSpec) -> str:
    """What a worker asks of a node: ``cpus=1 gpus=0 memory=512 MiB and 1 dyntrain_ce_spot``."""
    where = f" and 1 {resource_name(spec.environment)}" if spec.environment else ""
    return f"{describe(spec.resources)}{where}"
