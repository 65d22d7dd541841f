"""Policies side by side: the same capacity and job traces under static, fifo, fair, goodput
and fairshare.

``static`` is the fixed cluster that *Dynamic Training* (AWS, 2018) compares with: every job
runs at a fixed size (its max, at most the cluster) on ``static_slots`` on-demand slots that
never change, first in, first out, at the on-demand price. The others run the job trace as it
is (elastic jobs from their min to their max) on the capacity traces, with the scheduler given
that allocation policy (``fifo``: the service's default).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dyntrain.service.core.allocation import FIFO, policy_by_name
from dyntrain.service.core.capacity import trace_from_points
from dyntrain.service.core.model import CapacityType, ValidationError
from dyntrain.sim.engine import EnvSpec, SimConfig, run_simulation
from dyntrain.sim.jobs import JobTrace
from dyntrain.sim.results import SimResult

POLICIES = ("static", "fifo", "fair", "goodput", "fairshare")
# p3.2xlarge (one V100), us-west-2: the on-demand list price, and spot at 30 % of it (an
# assumption: the public traces carry availability, not prices)
ON_DEMAND_PRICE = 3.06
SPOT_PRICE = 0.918


@dataclass(frozen=True)
class StaticCluster:
    """The ``static`` baseline's cluster: ``slots`` on-demand slots at ``price``."""

    slots: int
    price: float = ON_DEMAND_PRICE


def parse_policies(text: str) -> tuple[str, ...]:
    """``"static,fifo"`` -> ``("static", "fifo")``; ValidationError names an unknown one."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise ValidationError(f"--policies needs at least one of {', '.join(POLICIES)}")
    for name in names:
        if name not in POLICIES:
            raise ValidationError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return names


def static_setup(jobs: JobTrace, cluster: StaticCluster) -> tuple[list[EnvSpec], JobTrace]:
    """The fixed on-demand cluster and the jobs at their fixed size."""
    env = EnvSpec("static-on-demand", trace_from_points([(0.0, cluster.slots)],
                                                        source="static cluster"),
                  CapacityType.ON_DEMAND, cluster.price)
    fixed = tuple(replace(j, min_workers=min(j.max_workers, cluster.slots),
                          max_workers=min(j.max_workers, cluster.slots), elastic=False)
                  for j in jobs.jobs)
    return [env], replace(jobs, jobs=fixed)


def run_policy(name: str, envs: list[EnvSpec], jobs: JobTrace, config: SimConfig | None = None,
               cluster: StaticCluster | None = None) -> SimResult:
    """One policy of ``POLICIES`` on the traces (``cluster``: the static baseline's; default
    as many slots as the capacity traces' maxima together)."""
    if name == "static":
        cluster = cluster or StaticCluster(sum(e.trace.max_slots for e in envs))
        static_envs, fixed = static_setup(jobs, cluster)
        return run_simulation(static_envs, fixed, FIFO, config, "static")
    return run_simulation(envs, jobs, policy_by_name(name), config, name)


def compare(names: tuple[str, ...], envs: list[EnvSpec], jobs: JobTrace,
            config: SimConfig | None = None,
            cluster: StaticCluster | None = None) -> list[SimResult]:
    """Each policy of ``names`` on the same traces, in that order."""
    return [run_policy(name, envs, jobs, config, cluster) for name in names]
