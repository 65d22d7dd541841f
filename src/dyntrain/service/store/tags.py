"""Tags of compute environments, job queues, job definition revisions and jobs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dyntrain.service.core.model import ValidationError
from dyntrain.service.store.base import Part, _one
from dyntrain.service.store.schema import (
    compute_environments,
    job_definitions,
    job_queues,
    jobs,
    scheduling_policies,
)

# kind -> (table, how to read its key, what the store calls it)
_KINDS: dict[str, tuple[sa.Table, str]] = {
    "compute-environment": (compute_environments, "compute environment"),
    "job-queue": (job_queues, "job queue"),
    "job-definition": (job_definitions, "job definition"),
    "job": (jobs, "job"),
    "scheduling-policy": (scheduling_policies, "scheduling policy"),
}


class TagStore(Part):
    """Key-value tags on any resource, addressed by kind and key (a job definition's key is
    ``name:revision``)."""

    def resource_tags(self, kind: str, key: str) -> dict[str, str]:
        with self._tx(write=False) as conn:
            return dict(_row(conn, kind, key).tags or {})

    def tag_resource(self, kind: str, key: str, tags: dict[str, str]) -> dict[str, str]:
        """Add or overwrite ``tags``; returns all the resource's tags."""
        with self._tx() as conn:
            merged = {**(_row(conn, kind, key).tags or {}), **tags}
            _write(conn, kind, key, merged)
        return merged

    def untag_resource(self, kind: str, key: str, keys: Iterable[str]) -> dict[str, str]:
        """Remove the tags named ``keys`` (missing ones are ignored); returns those left."""
        with self._tx() as conn:
            left = {k: v for k, v in (_row(conn, kind, key).tags or {}).items()
                    if k not in set(keys)}
            _write(conn, kind, key, left)
        return left


def _keys(kind: str, key: str) -> tuple[sa.Table, str, dict[str, Any]]:
    if kind not in _KINDS:
        raise ValidationError(f"unknown resource kind {kind!r}; expected one of "
                              f"{', '.join(_KINDS)}")
    table, what = _KINDS[kind]
    if table is job_definitions:
        name, _, revision = key.rpartition(":")
        if not name or not revision.isdigit():
            raise ValidationError(f"a job definition is tagged as NAME:REVISION, got {key!r}")
        return table, what, {"name": name, "revision": int(revision)}
    return table, what, {"id" if table is jobs else "name": key}


def _row(conn: Connection, kind: str, key: str) -> sa.Row:
    table, what, keys = _keys(kind, key)
    return _one(conn, table, what, **keys)


def _write(conn: Connection, kind: str, key: str, tags: dict[str, str]) -> None:
    table, _, keys = _keys(kind, key)
    conn.execute(table.update().where(*[table.c[k] == v for k, v in keys.items()])
                 .values(tags=tags or None))
