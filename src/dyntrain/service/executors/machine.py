"""This machine as the local executor sees it: its memory and its GPUs (what ``/proc`` says about
a process is :mod:`dyntrain.procstat`'s)."""

from __future__ import annotations

import os


def mem_total_mib() -> int:
    """This machine's memory in MiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def detect_gpus() -> list[int]:
    """CUDA device indices usable here: none unless torch imports and sees CUDA (without an
    NVIDIA driver or ``CUDA_VISIBLE_DEVICES``, none, and torch is not imported).

    Indices are those of ``CUDA_VISIBLE_DEVICES`` when it already restricts this process to
    numbered devices, so that a worker's own ``CUDA_VISIBLE_DEVICES`` names the same devices.
    """
    if not os.path.isdir("/proc/driver/nvidia/gpus") and not os.environ.get(
            "CUDA_VISIBLE_DEVICES", "").strip():
        return []  # no NVIDIA driver: spare the service a torch import (seconds) at start
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        n = torch.cuda.device_count()
    except Exception:  # a broken CUDA setup means no GPUs, not a dead service
        return []
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if len(visible) >= n and all(v.isdigit() for v in visible[:n]):
        return [int(v) for v in visible[:n]]
    return list(range(n))
