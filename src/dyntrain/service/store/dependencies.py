"""A job's dependencies as the store keeps them: normalised at submit, checked against the jobs
they name (they exist, N_TO_N pairs arrays of one size, no cycle forms), and read back."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dyntrain.service.core.model import Dependency, DependencyType, ValidationError
from dyntrain.service.store.schema import job_dependencies, jobs


def normalise_deps(job_id: str, depends_on: Iterable[Dependency],
                   array_size: int | None) -> list[Dependency]:
    """``depends_on`` as stored: one entry per job, sorted, a SEQUENTIAL one naming the job
    itself (an array job's only); a job that depends on itself is refused."""
    out: dict[str, Dependency] = {}
    for d in depends_on:
        if not isinstance(d, Dependency):
            raise ValidationError(f"depends_on entries must be Dependency, got {d!r}")
        if d.type is DependencyType.SEQUENTIAL:
            if d.job_id not in ("", job_id):
                raise ValidationError("a SEQUENTIAL dependency names the job itself, not "
                                      f"{d.job_id!r}")
            if array_size is None:
                raise ValidationError("a SEQUENTIAL dependency needs an array job")
            d = Dependency(job_id, DependencyType.SEQUENTIAL)
        elif d.job_id == job_id:
            raise ValidationError(f"dependency cycle: job {job_id!r} would depend on itself")
        if d.job_id in out and out[d.job_id] != d:
            raise ValidationError(f"job {d.job_id!r} is listed twice in depends_on")
        out[d.job_id] = d
    return sorted(out.values(), key=lambda d: d.job_id)  # the order reads give back


def check_deps(conn: Connection, job_id: str, deps: list[Dependency],
               array_size: int | None) -> None:
    """Every dependency exists, N_TO_N pairs arrays of one size, and no cycle forms."""
    others = [d for d in deps if d.type is not DependencyType.SEQUENTIAL]
    if not others:
        return
    found = {r.id: r for r in conn.execute(
        sa.select(jobs.c.id, jobs.c.array_parent_id, jobs.c.array_size)
        .where(jobs.c.id.in_([d.job_id for d in others])))}
    missing = [d.job_id for d in others if d.job_id not in found]
    if missing:
        raise ValidationError(f"depends on unknown job(s) {', '.join(missing)}")
    for d in others:
        r = found[d.job_id]
        if d.type is DependencyType.N_TO_N and (
                array_size is None or r.array_parent_id is not None
                or r.array_size != array_size):
            raise ValidationError(f"an N_TO_N dependency on {d.job_id!r} needs both jobs to be "
                                  f"array jobs of one size (got {array_size} and {r.array_size})")
    # Walk everything the new job would (transitively) wait for; meeting the new job again is a
    # cycle. A child waits for what its parent waits for, so a child leads to its parent.
    seen = {d.job_id for d in others}
    frontier = set(seen)
    while frontier:
        edges = conn.execute(
            sa.select(job_dependencies.c.depends_on).where(
                job_dependencies.c.job_id.in_(frontier),
                job_dependencies.c.type != DependencyType.SEQUENTIAL.value)
            .union(sa.select(jobs.c.array_parent_id).where(
                jobs.c.id.in_(frontier), jobs.c.array_parent_id.is_not(None)))).scalars()
        nxt = set(edges) - seen
        if job_id in nxt:
            raise ValidationError(f"dependency cycle: job {job_id!r} would wait for itself")
        seen |= nxt
        frontier = nxt


def deps_of(conn: Connection, ids: list[str]) -> dict[str, tuple[Dependency, ...]]:
    """The stored dependencies of the jobs ``ids`` (those that have any), in stored order."""
    if not ids:
        return {}
    out: dict[str, list[Dependency]] = {}
    for r in conn.execute(sa.select(job_dependencies).where(job_dependencies.c.job_id.in_(ids))
                          .order_by(job_dependencies.c.job_id, job_dependencies.c.depends_on)):
        out.setdefault(r.job_id, []).append(Dependency(r.depends_on, DependencyType(r.type)))
    return {k: tuple(v) for k, v in out.items()}
