"""Capacity over time: each compute environment's slots, sampled on the scheduler's passes.

The store keeps an environment's current settings, not their history, so the service remembers
the change points it saw since it started (in memory, bounded): available slots (a trace's
or the desired count), slots in use, desired and max.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

MAX_POINTS = 5000  # change points kept per environment


@dataclass(frozen=True)
class Sample:
    at: float
    available: int
    in_use: int
    desired: int
    max: int

    def same_as(self, other: Sample) -> bool:
        return (self.available, self.in_use, self.desired, self.max) == (
            other.available, other.in_use, other.desired, other.max)


class CapacityHistory:
    """Per environment, the samples at which anything changed (thread-safe)."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self._points: dict[str, deque[Sample]] = {}
        self._last: dict[str, Sample] = {}
        self._max_points = max_points
        self._lock = threading.Lock()

    def record(self, env: str, sample: Sample) -> None:
        with self._lock:
            last = self._last.get(env)
            self._last[env] = sample
            if last is not None and last.same_as(sample):
                return
            self._points.setdefault(env, deque(maxlen=self._max_points)).append(sample)

    def forget_except(self, envs: set[str]) -> None:
        """Drop environments that no longer exist."""
        with self._lock:
            for name in set(self._points) - envs:
                del self._points[name]
                self._last.pop(name, None)

    def table(self, now: float, since: float = 0.0) -> dict:
        """Aligned columns for a chart: ``t`` and, per environment, available and in-use slots
        at each time (the last value carried forward; null before the environment was seen)."""
        with self._lock:
            points = {env: [s for s in pts if s.at >= since] or list(pts)[-1:]
                      for env, pts in self._points.items()}
            last = dict(self._last)
        times = sorted({s.at for pts in points.values() for s in pts} | {now})
        envs = []
        for env in sorted(points):
            pts = points[env]
            available, in_use, i, current = [], [], 0, None
            for t in times:
                while i < len(pts) and pts[i].at <= t:
                    current, i = pts[i], i + 1
                if t == now and env in last:
                    current = last[env]
                available.append(None if current is None else current.available)
                in_use.append(None if current is None else current.in_use)
            envs.append({"name": env, "available": available, "in_use": in_use})
        return {"t": times, "environments": envs}
