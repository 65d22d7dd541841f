"""What the controller knows in memory about unfinished jobs, kept up to date as they change.

``JobIndex`` holds each queue's RUNNABLE jobs in first in, first out order (what the scheduler
admits from), the SUBMITTED and PENDING jobs with the jobs they wait on, and each unfinished array
job's children counted by status. It learns about new jobs by reading after a watermark
(``Store.scheduling.scan_jobs``) and about every status change from the controller
(``moved``), so a pass never rereads the whole queue: dependency resolution looks only at jobs
whose upstream changed, and an array job's status follows its children's counts. ``reload``
starts over from the database, which corrects anything changed behind the controller's back
(another process writing the same database).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import attrgetter

from dyntrain.service.core import lifecycle
from dyntrain.service.core.lifecycle import Transition
from dyntrain.service.core.model import DependencyType, JobStatus
from dyntrain.service.core.plan import JobView, WaitInfo, WaitingJobs
from dyntrain.service.core.records import Job, JobEntry
from dyntrain.service.store import Store

WAITING = (JobStatus.SUBMITTED, JobStatus.PENDING)
_FIFO = attrgetter("created", "id")


def job_view(e: JobEntry | Job) -> JobView:
    """The scheduler's view of a RUNNABLE job; array children keep their index order."""
    lo, hi = e.workers_range
    return JobView(e.id, e.queue, _created(e), e.resources,
                   lo, hi, JobStatus.RUNNABLE, {}, preemptible=e.min_workers is not None,
                   share=e.share, scheduling_priority=e.scheduling_priority)


def _created(e: JobEntry | Job) -> float:
    return e.created_at + (e.array_index or 0) * 1e-7


def wait_info(waiting: Mapping[str, WaitInfo], job: Job) -> WaitInfo | None:
    """Why ``job`` waits, as of the pass that made ``waiting`` (None if it does not)."""
    if job.status is not JobStatus.RUNNABLE:
        return None
    if isinstance(waiting, WaitingJobs):
        return waiting.of(job.id, _created(job))
    return waiting.get(job.id)


class _Children(Sequence):
    """An array job's child statuses where only some indices were looked up."""

    def __init__(self, size: int, known: dict[int, JobStatus]) -> None:
        self.size, self.known = size, known

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):  # only the looked-up indices are ever read
        return self.known[index]


class JobIndex:
    """See the module docstring. Not thread-safe: the controller's step owns it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reload()

    def reload(self) -> None:
        """Forget everything; the next ``refresh`` reads every unfinished job again."""
        self.queued: dict[str, list[JobView]] = {}
        self.views: dict[str, JobView] = {}  # RUNNABLE job -> its view in queued
        self.waiting: dict[str, JobEntry] = {}
        self.dirty: set[str] = set()  # waiting jobs to resolve again
        self.dependents: dict[str, set[str]] = defaultdict(set)  # upstream -> waiting jobs
        self.parents: dict[str, JobEntry] = {}  # unfinished array jobs
        self.counts: dict[str, Counter] = {}  # array job -> its children by status
        self.changed_parents: set[str] = set()
        self.watermark: tuple[float, str] | None = None

    # ---- learning ---------------------------------------------------------------------------

    def refresh(self, limit: int = 2000) -> int:
        """Read up to ``limit`` jobs submitted since the last call; returns how many."""
        entries = self.store.scheduling.scan_jobs(self.watermark, limit)
        if not entries:
            return 0
        self.watermark = (entries[-1].created_at, entries[-1].id)
        parents = [e for e in entries if e.is_array_parent]
        counts = (self.store.scheduling.child_status_counts([e.id for e in parents]) if parents
                  else {})
        for e in parents:
            self.parents[e.id] = e
            self.counts[e.id] = counts[e.id]
            self.changed_parents.add(e.id)
        for e in entries:
            if e.is_array_parent:
                continue
            if e.status in WAITING:
                self._wait(e)
            elif e.status is JobStatus.RUNNABLE:
                self.enqueue(job_view(e))
            # STARTING and RUNNING jobs belong to the controller's attempts
        return len(entries)

    def _wait(self, e: JobEntry) -> None:
        if e.array_parent_id is not None:
            parent = self.parents.get(e.array_parent_id)
            deps = parent.depends_on if parent is not None else \
                self.store.jobs.get_job(e.array_parent_id).depends_on
            e = dataclasses.replace(e, depends_on=lifecycle.child_dependencies(
                e.array_parent_id, deps))
        self.waiting[e.id] = e
        self.dirty.add(e.id)
        for upstream in lifecycle.upstream_ids(e.depends_on, e.array_index):
            self.dependents[upstream].add(e.id)

    def enqueue(self, view: JobView) -> None:
        if view.id in self.views:
            return
        self.views[view.id] = view
        bisect.insort(self.queued.setdefault(view.queue, []), view, key=_FIFO)

    def forget(self, job_id: str) -> None:
        """Drop a job someone else moved (a compare-and-set of ours failed)."""
        self._dequeue(job_id)
        self.waiting.pop(job_id, None)
        self.dirty.discard(job_id)

    def moved(self, job_id: str, parent_id: str | None, old: JobStatus, new: JobStatus,
              view: JobView | None = None, reason: str | None = None) -> None:
        """The controller moved ``job_id`` from ``old`` to ``new`` (``view``: its scheduler view,
        when it became RUNNABLE; ``reason``: its new reason, when it still waits)."""
        if new in WAITING and job_id in self.waiting:
            self.waiting[job_id] = dataclasses.replace(self.waiting[job_id], status=new,
                                                       status_reason=reason)
        if old is new:
            return
        if parent_id is not None and parent_id in self.counts:
            counts = self.counts[parent_id]
            counts[old] -= 1
            counts[new] += 1
            self.changed_parents.add(parent_id)
            if new is JobStatus.FAILED:  # dependents of the whole array fail at once
                self._touch(parent_id)
        if old is JobStatus.RUNNABLE:
            self._dequeue(job_id)
        if new not in WAITING:
            self.waiting.pop(job_id, None)
            self.dirty.discard(job_id)
        if new is JobStatus.RUNNABLE and view is not None:
            self.enqueue(view)
        if new.is_terminal() and job_id in self.parents:
            del self.parents[job_id]
            del self.counts[job_id]
            self.changed_parents.discard(job_id)
        self._touch(job_id)

    def _touch(self, upstream: str) -> None:
        for dependent in self.dependents.get(upstream, ()):
            if dependent in self.waiting:
                self.dirty.add(dependent)

    def _dequeue(self, job_id: str) -> None:
        view = self.views.pop(job_id, None)
        if view is None:
            return
        jobs = self.queued[view.queue]
        i = bisect.bisect_left(jobs, _FIFO(view), key=_FIFO)
        if i < len(jobs) and jobs[i].id == job_id:
            del jobs[i]

    def drop_children(self, parent_id: str, moved: Iterable[tuple[str, JobStatus]],
                      new: JobStatus) -> None:
        """Many children of one array moved to ``new`` at once (cancel): one pass per queue."""
        gone = set()
        counts = self.counts.get(parent_id)
        for job_id, old in moved:
            gone.add(job_id)
            self.waiting.pop(job_id, None)
            self.dirty.discard(job_id)
            if counts is not None:
                counts[old] -= 1
                counts[new] += 1
        queues = {self.views.pop(j).queue for j in gone if j in self.views}
        for name in queues:
            self.queued[name] = [v for v in self.queued[name] if v.id not in gone]
        if counts is not None:
            self.changed_parents.add(parent_id)
        for job_id in gone:
            self._touch(job_id)
        self._touch(parent_id)

    # ---- reading ----------------------------------------------------------------------------

    def queues(self) -> dict[str, tuple[JobView, ...]]:
        """Each queue's RUNNABLE jobs, first in first out (copies the scheduler may keep)."""
        return {name: tuple(jobs) for name, jobs in self.queued.items() if jobs}

    def children_of(self, parent_id: str) -> Iterator[str]:
        """The ids of the array's children this index holds as waiting or RUNNABLE."""
        prefix = parent_id + ":"
        yield from (j for j in self.waiting if j.startswith(prefix))
        yield from (j for j in self.views if j.startswith(prefix))

    def parent_status(self, parent_id: str) -> JobStatus:
        return lifecycle.array_parent_status(s for s, n in self.counts[parent_id].items() if n)

    def resolve(self, limit: int = 1000) -> list[tuple[JobEntry, Transition]]:
        """Up to ``limit`` waiting jobs whose dependencies changed, with where they go next
        (their status or reason differs from the entry's)."""
        batch = [self.waiting[j] for j in list(self.dirty)[:limit]]
        self.dirty.difference_update(e.id for e in batch)
        upstream = {u for e in batch for u in lifecycle.upstream_ids(e.depends_on,
                                                                     e.array_index)}
        found = self.store.scheduling.job_statuses(sorted(upstream)) if upstream else {}
        arrays: dict[str, list[JobStatus]] = {}
        out = []
        for e in batch:
            deps_status: dict = {}
            for d in e.depends_on:
                if d.type is DependencyType.STANDARD:
                    status, is_parent = found.get(d.job_id, (None, False))
                    if is_parent:
                        if d.job_id not in arrays:
                            arrays[d.job_id] = self.store.jobs.child_statuses(d.job_id)
                        deps_status[d.job_id] = arrays[d.job_id]
                    elif status is not None:
                        deps_status[d.job_id] = status
                    continue
                [child] = lifecycle.upstream_ids([d], e.array_index) or [None]
                if child is None:  # child 0 of a SEQUENTIAL array waits for nothing
                    deps_status[d.job_id] = _Children(0, {})
                elif child in found:
                    index = int(child.rpartition(":")[2])
                    deps_status[d.job_id] = _Children(index + 1, {index: found[child][0]})
            move = lifecycle.resolve_dependencies(
                lifecycle.DependentJob(e.id, e.depends_on, e.array_index), deps_status)
            if move.status is not e.status or move.reason != e.status_reason:
                out.append((e, move))
        return out
