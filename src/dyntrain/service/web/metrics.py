"""``/metrics``: the service in Prometheus' text format, with the official ``prometheus_client``.

Every value but the scheduler pass time is read at scrape time from the store, the controller
and the run folders (a custom collector), so a restarted service reports the same counts; the
pass time is a histogram fed by the controller's ``pass_observers`` hook. Each service app gets
its own registry (no process-wide globals: tests run several services in one process).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dyntrain.service.core.model import JobStatus, WorkerState
from dyntrain.service.operations import Operations
from dyntrain.service.web import runfiles
from dyntrain.service.web.context import environments

PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RATE_WINDOW_ROWS = 50  # steps/s over the last rows of a job's metrics.jsonl


class ServiceCollector(Collector):
    """Jobs, slots, membership changes and elastic progress, read when Prometheus scrapes."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._slots()
        yield from self._membership()
        yield from self._elastic()

    def _jobs(self) -> Iterator[Metric]:
        counts = self.ops.jobs.counts()
        jobs = GaugeMetricFamily(
            "dyntrain_jobs", "Jobs by queue and state (array children count, their parent not).",
            labels=["queue", "state"])
        names = {q.name for q in self.ops.queues.list()} | {q for q, _ in counts}
        for queue in sorted(names):
            for status in JobStatus:
                jobs.add_metric([queue, status.value], counts.get((queue, status), 0))
        yield jobs

    def _slots(self) -> Iterator[Metric]:
        labels = ["compute_environment", "capacity_type"]
        families = {
            "available": GaugeMetricFamily(
                "dyntrain_slots_available",
                "Slots a compute environment offers now (its trace, else desired).", labels=labels),
            "in_use": GaugeMetricFamily(
                "dyntrain_slots_in_use", "Slots held by active workers.", labels=labels),
            "desired": GaugeMetricFamily(
                "dyntrain_slots_desired", "A compute environment's desired slots.", labels=labels),
            "max": GaugeMetricFamily(
                "dyntrain_slots_max", "A compute environment's maximum slots.", labels=labels),
        }
        for ce in environments(self.ops):  # as GET /compute-environments shows them
            key = [ce["name"], ce["capacity_type"]]
            families["available"].add_metric(key, ce["available_slots"])
            families["in_use"].add_metric(key, ce["slots_in_use"])
            families["desired"].add_metric(key, ce["desired_slots"])
            families["max"].add_metric(key, ce["max_slots"])
        yield from families.values()

    def _membership(self) -> Iterator[Metric]:
        changes = CounterMetricFamily(
            "dyntrain_membership_changes",
            "Membership changes of elastic jobs (start, join, leave, crash, resume, ...).",
            labels=["kind"])
        for kind, n in sorted(self.ops.logs.count_events("membership.").items()):
            changes.add_metric([kind.removeprefix("membership.")], n)
        yield changes

    def _elastic(self) -> Iterator[Metric]:
        labels = ["job_id", "job_name"]
        steps = GaugeMetricFamily(
            "dyntrain_elastic_steps_per_second",
            f"Applied optimizer steps per second of a running elastic job (its last "
            f"{RATE_WINDOW_ROWS} steps).", labels=labels)
        samples = GaugeMetricFamily(
            "dyntrain_elastic_samples_per_second",
            "Training samples per second of a running elastic job's last step.", labels=labels)
        world = GaugeMetricFamily(
            "dyntrain_elastic_world_size", "Workers training a running elastic job.",
            labels=labels)
        step = GaugeMetricFamily(
            "dyntrain_elastic_step", "Optimizer steps a running elastic job has applied.",
            labels=labels)
        jobs = self.ops.jobs
        running = Counter(w.job_id for w in jobs.workers(active=True)
                          if w.state == WorkerState.RUNNING)
        for job in jobs.list(status=[JobStatus.RUNNING], limit=10_000):
            if job.elastic is None:
                continue
            key = [job.id, job.name]
            rows = runfiles.tail_rows(jobs.run_folder(job), RATE_WINDOW_ROWS)
            world.add_metric(key, rows[-1].get("world_size", running[job.id]) if rows
                             else running[job.id])
            rate = runfiles.steps_per_second(rows)
            if rate is not None:
                steps.add_metric(key, rate)
            if rows:
                step.add_metric(key, rows[-1].get("step", 0))
                if isinstance(rows[-1].get("samples_per_s"), (int, float)):
                    samples.add_metric(key, rows[-1]["samples_per_s"])
        yield from (steps, samples, world, step)


def service_registry(ops: Operations) -> CollectorRegistry:
    """A registry with the service's collector and the scheduler pass-time histogram, which
    the controller feeds after each scheduling pass."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(ops))
    passes = Histogram("dyntrain_scheduler_pass_seconds",
                       "Time of one scheduling pass of the controller (dependencies, array "
                       "parents, the scheduler's plan and applying it).",
                       buckets=PASS_BUCKETS, registry=registry)
    ops.observe_passes(passes.observe)
    return registry
