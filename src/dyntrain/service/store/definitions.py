"""Job definitions and their revisions."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from dyntrain.service.core.model import JobDefinitionSpec, Resources, ValidationError
from dyntrain.service.core.records import ACTIVE, INACTIVE, JobDefinition, elastic_settings
from dyntrain.service.store.base import Part, _one, known_names
from dyntrain.service.store.columns import launcher_column, retry_from_json, retry_to_json
from dyntrain.service.store.schema import job_definitions


class DefinitionStore(Part):
    """Job definitions and their revisions."""

    def register_job_definition(self, spec: JobDefinitionSpec, *,
                                tags: dict[str, str] | None = None,
                                aws: dict[str, Any] | None = None) -> tuple[str, int]:
        """Store ``spec`` as the next revision of its name (1 for a new name)."""
        for attempt in range(5):
            try:
                with self._tx() as conn:
                    if conn.dialect.name == "postgresql":  # SQLite: writers already serialise
                        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(
                            sa.func.hashtext("job_definitions:" + spec.name))))
                    last = conn.scalar(sa.select(sa.func.max(job_definitions.c.revision))
                                       .where(job_definitions.c.name == spec.name))
                    revision = (last or 0) + 1
                    conn.execute(job_definitions.insert().values(
                        name=spec.name, revision=revision, status=ACTIVE,
                        command=list(spec.command), environment=dict(spec.environment),
                        parameters=dict(spec.parameters), cpus=spec.resources.cpus,
                        gpus=spec.resources.gpus, memory_mib=spec.resources.memory_mib,
                        retry_strategy=retry_to_json(spec.retry_strategy),
                        timeout_seconds=spec.timeout_seconds,
                        min_workers=spec.elastic.min_workers if spec.elastic else None,
                        max_workers=spec.elastic.max_workers if spec.elastic else None,
                        launcher=launcher_column(spec.elastic),
                        created_at=self.clock(), tags=tags or None, aws=aws or None))
                return spec.name, revision
            except ValidationError as e:
                # a concurrent register took the same revision number (only if another
                # program registers without the lock); try again
                if attempt == 4 or not isinstance(e.__cause__, IntegrityError):
                    raise
        raise AssertionError("unreachable")

    def get_job_definition(self, name: str, revision: int | None = None) -> JobDefinition:
        """A given revision (even if deregistered), or the latest active one."""
        with self._tx(write=False) as conn:
            return _definition_from_row(_find_definition(conn, name, revision))

    def list_job_definitions(self, name: str | None = None,
                             include_inactive: bool = False) -> list[JobDefinition]:
        q = sa.select(job_definitions).order_by(job_definitions.c.name,
                                                job_definitions.c.revision)
        if name is not None:
            q = q.where(job_definitions.c.name == name)
        if not include_inactive:
            q = q.where(job_definitions.c.status == ACTIVE)
        with self._tx(write=False) as conn:
            return [_definition_from_row(r) for r in conn.execute(q)]

    def deregister_job_definition(self, name: str, revision: int) -> None:
        """Mark a revision INACTIVE: it can no longer be submitted (idempotent)."""
        with self._tx() as conn:
            _revision(conn, name, revision)
            conn.execute(job_definitions.update().where(
                job_definitions.c.name == name, job_definitions.c.revision == revision)
                .values(status=INACTIVE))


def _find_definition(conn: Connection, name: str, revision: int | None) -> sa.Row:
    if revision is not None:
        return _revision(conn, name, revision)
    row = conn.execute(sa.select(job_definitions).where(
        job_definitions.c.name == name, job_definitions.c.status == ACTIVE)
        .order_by(job_definitions.c.revision.desc()).limit(1)).first()
    if row is None:
        known = known_names(conn, job_definitions, "job definition",
                            job_definitions.c.status == ACTIVE)
        raise ValidationError(f"unknown job definition {name!r} (or no active revision; {known})")
    return row


def _revision(conn: Connection, name: str, revision: int) -> sa.Row:
    """Revision ``revision`` of ``name``; unknown: an error listing the revisions there are."""
    try:
        return _one(conn, job_definitions, "job definition", name=name, revision=revision)
    except ValidationError as e:
        revisions = conn.execute(sa.select(job_definitions.c.revision).where(
            job_definitions.c.name == name).order_by(job_definitions.c.revision)).scalars().all()
        known = (f"{name} has revision(s) {', '.join(map(str, revisions))}" if revisions
                 else known_names(conn, job_definitions, "job definition",
                                  job_definitions.c.status == ACTIVE))
        raise ValidationError(f"{e} ({known})") from None


def _definition_from_row(r: sa.Row) -> JobDefinition:
    spec = JobDefinitionSpec(
        name=r.name, command=tuple(r.command), environment=tuple(r.environment.items()),
        parameters=tuple(r.parameters.items()),
        resources=Resources(r.cpus, r.gpus, r.memory_mib),
        retry_strategy=retry_from_json(r.retry_strategy), timeout_seconds=r.timeout_seconds,
        elastic=elastic_settings(r.min_workers, r.max_workers, r.launcher))
    return JobDefinition(spec, r.revision, r.status, r.created_at, dict(r.tags or {}),
                         dict(r.aws or {}))


