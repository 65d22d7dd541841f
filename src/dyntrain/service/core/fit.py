"""Pure: how a compute environment's declared size compares with the machine that runs it.

With the local executor every slot is carved out of one machine (its cores, memory and GPUs:
``LocalExecutor.capacity()``), which refuses a worker that does not fit what is free. A slot
larger than the machine could never hold a worker: such an environment is refused. An
environment declaring more slots than the machine holds at once is allowed (several
environments share the machine, and a trace may never reach its maximum), and its description
says how many of its slots fit: the others are never filled.
"""

from __future__ import annotations

import math
import sys

from dyntrain.service.core.executor import describe
from dyntrain.service.core.model import ComputeEnvironmentSpec, Resources


def slots_that_fit(slot: Resources, machine: Resources) -> int:
    """How many slots of this size the machine holds at once."""
    cpus = machine.cpus / slot.cpus  # infinite for a vanishingly small slot: no limit
    counts = [math.floor(cpus + 1e-9) if math.isfinite(cpus) else sys.maxsize,
              machine.memory_mib // slot.memory_mib]
    if slot.gpus:
        counts.append(machine.gpus // slot.gpus)
    return max(0, min(counts))


def slot_refusal(spec: ComputeEnvironmentSpec, machine: Resources) -> str | None:
    """Why no worker of ``spec`` could ever start on the machine, or None."""
    if slots_that_fit(spec.slot, machine) >= 1:
        return None
    return (f"compute environment {spec.name}: one slot ({describe(spec.slot)}) is larger than "
            f"this machine ({describe(machine)}, the local executor): no worker of it could "
            f"start")


def machine_note(spec: ComputeEnvironmentSpec, machine: Resources) -> str | None:
    """Said when the machine holds fewer of ``spec``'s slots at once than it may offer."""
    fit = slots_that_fit(spec.slot, machine)
    if spec.max_slots <= fit:
        return None
    return (f"this machine ({describe(machine)}) holds {fit} of its {spec.max_slots} slots "
            f"at once; slots beyond {fit} are never filled")
