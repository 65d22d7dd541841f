"""Tags of compute environments, job queues, job definitions and jobs (``kind``, ``name``)."""

from __future__ import annotations

from collections.abc import Sequence

from dyntrain.service.engine.service import Service


class Tags:
    def __init__(self, service: Service) -> None:
        self._service = service

    def of(self, kind: str, name: str) -> dict[str, str]:
        return self._service.store.tags.resource_tags(kind, name)

    def add(self, kind: str, name: str, tags: dict[str, str]) -> None:
        with self._service.lock:
            self._service.store.tags.tag_resource(kind, name, tags)

    def remove(self, kind: str, name: str, keys: Sequence[str]) -> None:
        with self._service.lock:
            self._service.store.tags.untag_resource(kind, name, keys)
