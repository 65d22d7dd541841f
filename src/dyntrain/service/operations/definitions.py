"""Job definitions: templates of jobs; registering a name again makes its next revision."""

from __future__ import annotations

from typing import Any

from dyntrain.service.core.model import JobDefinitionSpec
from dyntrain.service.core.records import JobDefinition
from dyntrain.service.engine.service import Service
from dyntrain.service.operations.errors import found


class Definitions:
    def __init__(self, service: Service) -> None:
        self._service = service

    def register(self, spec: JobDefinitionSpec, tags: dict[str, str] | None = None,
                 aws: dict[str, Any] | None = None) -> JobDefinition:
        """The name's next revision."""
        store = self._service.store
        with self._service.lock:
            name, revision = store.register_job_definition(spec, tags=tags, aws=aws)
            return found(store.get_job_definition, name, revision)

    def get(self, name: str, revision: int | None = None) -> JobDefinition:
        """A revision (None: the latest active one)."""
        return found(self._service.store.get_job_definition, name, revision)

    def list(self, name: str | None = None, include_inactive: bool = False
             ) -> list[JobDefinition]:
        return self._service.store.list_job_definitions(name, include_inactive=include_inactive)

    def deregister(self, name: str, revision: int | None = None) -> JobDefinition:
        """Deregister a revision (None: the latest active one): no new job can use it."""
        store = self._service.store
        with self._service.lock:
            revised = found(store.get_job_definition, name, revision)
            store.deregister_job_definition(revised.name, revised.revision)
            return store.get_job_definition(revised.name, revised.revision)
