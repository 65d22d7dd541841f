"""What a simulation measured: per job, and summed up per policy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SUMMARY_FIELDS = ("avg_jct_s", "p95_jct_s", "makespan_s", "cost", "utilisation",
                  "reformations")


@dataclass
class JobRecord:
    """One job's life in a simulation; ``finished_s`` is None when it did not finish."""

    id: str
    arrival_s: float
    samples: float
    started_s: float | None = None
    finished_s: float | None = None
    cost: float = 0.0
    worker_seconds: float = 0.0
    reformations: int = 0
    suspensions: int = 0
    sizes: dict[int, float] = field(default_factory=dict)  # world size -> seconds trained at it

    @property
    def jct_s(self) -> float | None:
        """Job completion time: from arrival to the end of its last step."""
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    def to_dict(self) -> dict:
        return {"id": self.id, "arrival_s": self.arrival_s, "started_s": self.started_s,
                "finished_s": self.finished_s, "jct_s": self.jct_s, "cost": self.cost,
                "worker_seconds": self.worker_seconds, "reformations": self.reformations,
                "suspensions": self.suspensions,
                "seconds_at_size": {str(k): v for k, v in sorted(self.sizes.items())}}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``values`` (nan when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class SimResult:
    """One policy's simulation: its jobs, totals, and (when recorded) its timeline.

    ``timeline`` rows are ``(t, {env: slots}, {job: workers held})`` after each pass.
    """

    policy: str
    jobs: list[JobRecord]
    cost: float
    slot_seconds_used: float
    slot_seconds_available: float
    passes: int
    sim_s: float
    wall_s: float
    timeline: list[tuple[float, dict[str, int], dict[str, int]]] = field(default_factory=list)

    @property
    def finished(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.finished_s is not None]

    @property
    def makespan_s(self) -> float:
        """From the first arrival to the last finish (to the end of the simulation when a job
        did not finish)."""
        if not self.jobs:
            return 0.0
        start = min(j.arrival_s for j in self.jobs)
        if len(self.finished) < len(self.jobs):
            return self.sim_s - start
        return max(j.finished_s for j in self.jobs) - start

    @property
    def utilisation(self) -> float:
        """Slot-seconds held by workers over slot-seconds that existed, over the makespan."""
        if self.slot_seconds_available <= 0:
            return 0.0
        return self.slot_seconds_used / self.slot_seconds_available

    def summary(self) -> dict:
        """One record of the comparison (``dyntrain sim --json``)."""
        jcts = [j.jct_s for j in self.finished]
        return {"policy": self.policy,
                "avg_jct_s": sum(jcts) / len(jcts) if jcts else math.nan,
                "p95_jct_s": percentile(jcts, 95), "makespan_s": self.makespan_s,
                "cost": self.cost, "utilisation": self.utilisation,
                "reformations": sum(j.reformations for j in self.jobs),
                "suspensions": sum(j.suspensions for j in self.jobs),
                "jobs": len(self.jobs), "unfinished": len(self.jobs) - len(jcts),
                "passes": self.passes, "simulated_s": self.sim_s, "wall_s": self.wall_s,
                "simulated_s_per_s": self.sim_s / self.wall_s if self.wall_s > 0 else math.inf}


UNITS = (("h", 3600.0), ("min", 60.0), ("s", 1.0))


def _unit(results: list[dict]) -> tuple[str, float]:
    """Hours for long traces, minutes or seconds for short ones (the live benchmark's)."""
    longest = max((r["makespan_s"] for r in results if math.isfinite(r["makespan_s"])),
                  default=0.0)
    for name, seconds in UNITS:
        if longest >= 3 * seconds:
            return name, seconds
    return UNITS[-1]


def format_table(results: list[dict]) -> list[str]:
    """The comparison as terminal lines: one row per policy."""
    unit, scale = _unit(results)

    def t(seconds: float) -> str:
        return "-" if not math.isfinite(seconds) else f"{seconds / scale:.2f}"

    jct, p95, span = f"avg JCT {unit}", f"p95 JCT {unit}", f"makespan {unit}"
    lines = [f"{'policy':<9} {jct:>12} {p95:>12} {span:>13} {'cost':>11} {'util':>6} "
             f"{'reforms':>8} {'unfinished':>10}"]
    for r in results:
        lines.append(f"{r['policy']:<9} {t(r['avg_jct_s']):>12} {t(r['p95_jct_s']):>12} "
                     f"{t(r['makespan_s']):>13} {r['cost']:>11.2f} "
                     f"{r['utilisation'] * 100:>5.1f}% {r['reformations']:>8} "
                     f"{r['unfinished']:>10}")
    return lines
