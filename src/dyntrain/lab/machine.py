"""The machine a lab experiment ran on: what it is (CPU, cores, GPUs, torch), and how much CPU
other processes used meanwhile."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
from typing import Any

from dyntrain.procstat import machine_busy_seconds


def hardware() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, GPU, torch and the collective backend."""
    import torch

    cpu = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    cpu = cpu or platform.processor() or platform.machine()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu_name = torch.cuda.get_device_name(0) if gpus else None
    info = {"cpu_model": cpu, "cpu_cores": usable, "cpu_count": os.cpu_count(),
            "gpu": gpu_name, "gpu_count": gpus, "torch": torch.__version__,
            "backend": "nccl" if gpus else "gloo", "device": "cuda" if gpus else "cpu",
            "python": platform.python_version(), "platform": platform.platform(),
            "hostname": platform.node()}
    info["summary"] = describe_hardware(info)
    return info


def describe_hardware(hw: dict[str, Any]) -> str:
    gpu = f"{hw['gpu_count']} x {hw['gpu']}" if hw.get("gpu_count") else "no GPU"
    return (f"{hw['cpu_model']}, {hw['cpu_cores']} CPU cores, {gpu}, torch {hw['torch']}, "
            f"{hw['backend']}")


def oversubscribed(workers: int, hw: dict[str, Any], threads_per_worker: int = 1) -> bool:
    """More worker threads than cores (CPU) or more workers than GPUs."""
    if hw.get("gpu_count"):
        return workers > hw["gpu_count"]
    return workers * threads_per_worker > hw["cpu_cores"]



def cpu_accounts() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its reaped
    children, the workers); None where /proc/stat is missing."""
    busy = machine_busy_seconds()
    if busy is None:
        return None
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def other_load(before, after, wall: float) -> float | None:
    """Cores' worth of CPU that processes other than ours used during a run."""
    if before is None or after is None or wall <= 0:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall

