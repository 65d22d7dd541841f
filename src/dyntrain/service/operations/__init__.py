"""The one way into the service: commands and queries that every front end calls.

The REST API (``service/api``), the AWS wire protocols (``service/aws``), the dashboard and
``/metrics`` (``service/web``) translate their wire formats into these calls and the records
they return (``dyntrain.service.core.records``, ``dyntrain.service.core.model``) back; none of
them touches the store or the service's lock (``tests/test_layers.py`` keeps it so).

Each operation owns its transaction and its locking, one rule for every front end:

* a command that changes what the controller reads (environments, queues, definitions, tags,
  cancel, terminate) holds the service's lock, so it lands between two controller steps, and
  its checks and its write are one step (no worker starts in an environment between the check
  that none is active and its delete);
* a submit is one store transaction without the lock: the controller finds new jobs after its
  watermark whenever they commit;
* a query of the store alone takes no lock; log lines are read under it (``logs``), and so are
  the slots the controller offers now (``Environments.capacity``).

Errors: ``ValidationError`` (core) for a bad request or an unknown resource (``unknown ...``),
``operations.errors.Refused`` and its kinds when the state of a resource refuses the request.
"""

from __future__ import annotations

from collections.abc import Callable

from dyntrain.service.engine.service import Service
from dyntrain.service.operations.definitions import Definitions
from dyntrain.service.operations.environments import Environments, Queues
from dyntrain.service.operations.jobs import Jobs
from dyntrain.service.operations.logs import Logs
from dyntrain.service.operations.policies import SchedulingPolicies
from dyntrain.service.operations.tags import Tags
from dyntrain.service.store.leases import Lease, Replica


class Operations:
    """The service's commands and queries, by what they concern.

    Args:
        service: the running service (store, executor, controller and their lock).
    """

    def __init__(self, service: Service) -> None:
        self._service = service
        self.environments = Environments(service)
        self.queues = Queues(service)
        self.definitions = Definitions(service)
        self.jobs = Jobs(service)
        self.logs = Logs(service)
        self.tags = Tags(service)
        self.policies = SchedulingPolicies(service)

    @property
    def token(self) -> str | None:
        """What a request must carry (``Authorization: Bearer``), if anything."""
        return self._service.config.token

    def clock(self) -> float:
        """The service's time (epoch seconds), as its records are stamped."""
        return self._service.store.clock()

    def leader(self) -> tuple[bool, int | None]:
        """Whether this service runs the controller, and the epoch of the controller's lease
        (None: a single service, no replicas)."""
        return self._service.leader()

    def replicas(self) -> tuple[Lease | None, list[Replica]]:
        """The controller's lease and every replica's last heartbeat (nothing without
        replicas)."""
        if self._service.leadership is None:
            return None, []
        store = self._service.store
        return store.leases.current(), store.leases.list_replicas()

    def observe_passes(self, observer: Callable[[float], None]) -> None:
        """Call ``observer`` with each scheduling pass's seconds, in the controller's thread
        between two steps (it must be quick and must not raise)."""
        self._service.controller.pass_observers.append(observer)
