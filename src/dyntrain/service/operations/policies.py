"""Fair-share scheduling policies: commands and queries."""

from __future__ import annotations

from dyntrain.service.core.fairshare import FairsharePolicy
from dyntrain.service.core.records import SchedulingPolicy
from dyntrain.service.engine.service import Service
from dyntrain.service.operations.errors import PolicyInUse, found


class SchedulingPolicies:
    """Named fair-share policies that job queues refer to (``JobQueueSpec.scheduling_policy``).
    A change reaches the scheduler at its next pass."""

    def __init__(self, service: Service) -> None:
        self._service = service

    def create(self, name: str, policy: FairsharePolicy,
               tags: dict[str, str] | None = None) -> SchedulingPolicy:
        with self._service.lock:
            return self._service.store.policies.create(name, policy, tags)

    def get(self, name: str) -> SchedulingPolicy:
        return found(self._service.store.policies.get, name)

    def list(self) -> list[SchedulingPolicy]:
        return self._service.store.policies.list()

    def update(self, name: str, policy: FairsharePolicy) -> SchedulingPolicy:
        with self._service.lock:
            return found(self._service.store.policies.update, name, policy)

    def delete(self, name: str) -> None:
        """Refused (``PolicyInUse``) while a job queue uses it."""
        store = self._service.store
        with self._service.lock:
            found(store.policies.get, name)
            using = store.policies.queues_using(name)
            if using:
                raise PolicyInUse(name, using)
            store.policies.delete(name)
