"""How an operation says no, beyond a bad request (``ValidationError``): the resource it names
does not exist (``Unknown``; the REST API: 404), or the state a resource is in refuses the
request (``Refused`` and its kinds; the REST API: 409). Each front end says it in its own words
and codes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dyntrain.service.core.model import JobStatus, ValidationError

T = TypeVar("T")


class Unknown(ValidationError):
    """The resource an operation names (a job id, an environment's name...) does not exist."""


def found(read: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """The resource a store getter reads; its ``unknown ...`` refusal becomes ``Unknown``."""
    try:
        return read(*args, **kwargs)
    except ValidationError as e:
        if str(e).startswith("unknown ") and not isinstance(e, Unknown):
            raise Unknown(str(e)) from None
        raise


class Refused(ValidationError):
    """The request is valid but the current state of a resource refuses it."""


class EnvironmentInUse(Refused):
    """A compute environment still has active workers, so it cannot be deleted."""

    def __init__(self, name: str, workers: int) -> None:
        super().__init__(f"compute environment {name!r} still has {workers} active worker(s); "
                         "disable it and let them finish first")
        self.name, self.workers = name, workers


class QueueExists(Refused):
    """A job queue of that name already exists."""

    def __init__(self, name: str) -> None:
        super().__init__(f"job queue {name!r} already exists")
        self.name = name


class JobNotCancellable(Refused):
    """A job that already started (or finished) cannot be cancelled: only terminated."""

    def __init__(self, job_id: str, status: JobStatus, message: str) -> None:
        super().__init__(message)
        self.job_id, self.status = job_id, status


class JobFinished(Refused):
    """A job that already finished cannot be stopped."""

    def __init__(self, job_id: str, status: JobStatus) -> None:
        super().__init__(f"job {job_id} already finished: {status.value}")
        self.job_id, self.status = job_id, status


class PolicyInUse(Refused):
    """A scheduling policy that a job queue uses cannot be deleted."""

    def __init__(self, name: str, queues: list[str]) -> None:
        super().__init__(f"scheduling policy {name!r} is used by job queue(s) "
                         f"{', '.join(queues)}; delete them or give them another first")
        self.name, self.queues = name, queues


class PolicyChange(Refused):
    """A first in, first out queue cannot be given a fair-share policy after it is created."""
