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
            name, revision = store.definitions.register_job_definition(spec, tags=tags, aws=aws)
            return found(store.definitions.get_job_definition, name, revision)

    def get(self, name: str, revision: int | None = None) -> JobDefinition:
        """A revision (None: the latest active one)."""
        return found(self._service.store.definitions.get_job_definition, name, revision)

    def list(self, name: str | None = None, include_inactive: bool = False
             ) -> list[JobDefinition]:
        definitions = self._service.store.definitions
        return definitions.list_job_definitions(name, include_inactive=include_inactive)

    def deregister(self, name: str, revision: int | None = None) -> JobDefinition:
        """Deregister a revision (None: the latest active one): no new job can use it."""
        store = self._service.store
        with self._service.lock:
            revised = found(store.definitions.get_job_definition, name, revision)
            store.definitions.deregister_job_definition(revised.name, revised.revision)
            return store.definitions.get_job_definition(revised.name, revised.revision)
