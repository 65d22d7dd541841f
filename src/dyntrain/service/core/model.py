"""Specs and lifecycle enums of the job service, in AWS Batch's vocabulary.

Plain dataclasses, validated on construction with one-line ``ValidationError`` messages (the API
turns them into 4xx answers). Nothing here touches a database or a process.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from dataclasses import dataclass, field

from dyntrain.errors import DyntrainError

DEFAULT_PORT = 8642  # where ``dyntrain server`` listens, and the clients look, by default
MAX_ARRAY_SIZE = 10_000
MAX_ATTEMPTS = 10
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_REF = re.compile(r"Ref::([A-Za-z0-9_]+)")


class ValidationError(DyntrainError, ValueError):
    """A spec or request is invalid; the message says which field and why."""


class CapacityType(str, enum.Enum):
    ON_DEMAND = "ON_DEMAND"
    RESERVED = "RESERVED"
    SPOT = "SPOT"


class State(str, enum.Enum):
    """Whether a compute environment or queue takes new work."""

    ENABLED = "ENABLED"
    DISABLED = "DISABLED"


class CEStatus(str, enum.Enum):
    VALID = "VALID"
    INVALID = "INVALID"


class JobStatus(str, enum.Enum):
    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"  # waiting for dependencies
    RUNNABLE = "RUNNABLE"  # waiting for capacity
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED)

    def is_active(self) -> bool:
        """Holds (or is about to hold) capacity."""
        return self in (JobStatus.STARTING, JobStatus.RUNNING)


class WorkerState(enum.StrEnum):
    """Where one worker process of an attempt stands (the store keeps the value as text)."""

    RUNNING = "RUNNING"
    LEAVING = "LEAVING"  # asked to go (preempted, shrunk, stopped); still holds its slot
    EXITED = "EXITED"  # its process ended and the service stored how


class RetryAction(str, enum.Enum):
    RETRY = "RETRY"
    EXIT = "EXIT"


class DependencyType(str, enum.Enum):
    STANDARD = "STANDARD"  # wait for the whole job (all children of an array)
    N_TO_N = "N_TO_N"  # child i waits for child i of the other array job
    SEQUENTIAL = "SEQUENTIAL"  # child i waits for child i-1 of the same array job


TERMINAL_STATUSES = tuple(s.value for s in JobStatus if s.is_terminal())  # as the API says them


def values(kind: type[enum.Enum]) -> tuple[str, ...]:
    """The values of an enum of this vocabulary, in order: what the API and the CLI accept."""
    return tuple(member.value for member in kind)


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValidationError(
            f"{kind} name {name!r} must be 1-128 letters, digits, '-' or '_' "
            "and start with a letter or digit")
    return name


@dataclass(frozen=True)
class Resources:
    """What one worker slot offers, or what one worker needs."""

    cpus: float = 1.0
    gpus: int = 0
    memory_mib: int = 1024

    def __post_init__(self) -> None:
        if self.cpus <= 0 or self.gpus < 0 or self.memory_mib <= 0:
            raise ValidationError(
                f"resources need cpus > 0, gpus >= 0 and memory_mib > 0, got cpus={self.cpus}, "
                f"gpus={self.gpus}, memory_mib={self.memory_mib}")

    def fits_in(self, slot: Resources) -> bool:
        return (self.cpus <= slot.cpus and self.gpus <= slot.gpus
                and self.memory_mib <= slot.memory_mib)


@dataclass(frozen=True)
class ComputeEnvironmentSpec:
    """A pool of worker slots of one capacity type and price."""

    name: str
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    price_per_slot_hour: float = 0.0
    slot: Resources = field(default_factory=Resources)
    min_slots: int = 0
    desired_slots: int = 0
    max_slots: int = 1
    state: State = State.ENABLED

    def __post_init__(self) -> None:
        check_name("compute environment", self.name)
        object.__setattr__(self, "capacity_type", CapacityType(self.capacity_type))
        object.__setattr__(self, "state", State(self.state))
        if self.price_per_slot_hour < 0:
            raise ValidationError(f"compute environment {self.name}: price must be >= 0")
        if not 0 <= self.min_slots <= self.max_slots:
            raise ValidationError(f"compute environment {self.name}: need 0 <= min_slots <= "
                                  f"max_slots, got {self.min_slots} and {self.max_slots}")
        if not self.min_slots <= self.desired_slots <= self.max_slots:
            raise ValidationError(f"compute environment {self.name}: desired_slots "
                                  f"{self.desired_slots} must lie in [{self.min_slots}, "
                                  f"{self.max_slots}]")


@dataclass(frozen=True)
class JobQueueSpec:
    """A queue with a priority (higher runs first) over an ordered list of environments."""

    name: str
    priority: int = 1
    compute_environments: tuple[str, ...] = ()
    state: State = State.ENABLED
    scheduling_policy: str | None = None  # a fair-share policy's name; None: first in, first out
    preempt_plain_jobs: bool = False  # fair share may preempt its plain jobs (dyntrain's own)

    def __post_init__(self) -> None:
        check_name("job queue", self.name)
        object.__setattr__(self, "state", State(self.state))
        envs = tuple(self.compute_environments)
        object.__setattr__(self, "compute_environments", envs)
        if not envs:
            raise ValidationError(f"job queue {self.name}: needs at least one compute environment")
        if len(set(envs)) != len(envs):
            raise ValidationError(f"job queue {self.name}: a compute environment is listed twice")


@dataclass(frozen=True)
class RetryRule:
    """First matching rule decides: ``on_exit_code`` and ``on_reason`` are glob patterns."""

    action: RetryAction
    on_exit_code: str | None = None
    on_reason: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", RetryAction(self.action))
        if self.on_exit_code is None and self.on_reason is None:
            raise ValidationError("a retry rule needs on_exit_code or on_reason")

    def matches(self, exit_code: int | None, reason: str) -> bool:
        if self.on_exit_code is not None and not fnmatch.fnmatchcase(
                "" if exit_code is None else str(exit_code), self.on_exit_code):
            return False
        return self.on_reason is None or fnmatch.fnmatchcase(reason, self.on_reason)


@dataclass(frozen=True)
class RetryStrategy:
    attempts: int = 1
    evaluate_on_exit: tuple[RetryRule, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= MAX_ATTEMPTS:
            raise ValidationError(f"retry attempts must be 1-{MAX_ATTEMPTS}, got {self.attempts}")
        object.__setattr__(self, "evaluate_on_exit", tuple(self.evaluate_on_exit))

    def should_retry(self, attempts_used: int, exit_code: int | None, reason: str) -> bool:
        """After a failed attempt: retry? (Preemptions never reach here: they cost nothing.)"""
        if attempts_used >= self.attempts:
            return False
        for rule in self.evaluate_on_exit:
            if rule.matches(exit_code, reason):
                return rule.action is RetryAction.RETRY
        return True


class Launcher(str, enum.Enum):
    """How an elastic job's workers are run: dyntrain's exact runtime (its coordinator resizes
    the running group) or torchrun's contract (a plain DDP script, restarted at each resize)."""

    DYNTRAIN = "dyntrain"
    TORCHRUN = "torchrun"


def parse_launcher(value: str | None) -> Launcher:
    """``value`` as a ``Launcher`` (None: dyntrain's); one line naming the choices if unknown."""
    if value is None:
        return Launcher.DYNTRAIN
    try:
        return Launcher(value)
    except ValueError:
        raise ValidationError(f"unknown launcher {value!r}: use one of "
                              f"{', '.join(values(Launcher))}") from None


@dataclass(frozen=True)
class ElasticSettings:
    """An elastic job runs between min and max workers and is resized by the scheduler;
    ``launcher`` says how its workers run (see ``Launcher``)."""

    min_workers: int = 1
    max_workers: int = 1
    launcher: Launcher = Launcher.DYNTRAIN

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValidationError(f"workers must satisfy 1 <= min <= max, got "
                                  f"{self.min_workers}:{self.max_workers}")
        object.__setattr__(self, "launcher", parse_launcher(self.launcher))


@dataclass(frozen=True)
class JobDefinitionSpec:
    """The template of a job; registering the same name again makes a new revision."""

    name: str
    command: tuple[str, ...]
    environment: tuple[tuple[str, str], ...] = ()
    parameters: tuple[tuple[str, str], ...] = ()  # defaults for Ref::name
    resources: Resources = field(default_factory=Resources)  # per worker
    retry_strategy: RetryStrategy = field(default_factory=RetryStrategy)
    timeout_seconds: float | None = None
    elastic: ElasticSettings | None = None

    def __post_init__(self) -> None:
        check_name("job definition", self.name)
        command = tuple(self.command)  # empty: each job brings its own (AWS: an image's CMD)
        if not all(isinstance(a, str) and a for a in command):
            raise ValidationError(f"job definition {self.name}: command must be a list of "
                                  "non-empty strings")
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "environment", tuple(sorted(dict(self.environment).items())))
        object.__setattr__(self, "parameters", tuple(sorted(dict(self.parameters).items())))
        if self.timeout_seconds is not None and self.timeout_seconds <= 0:
            raise ValidationError(f"job definition {self.name}: timeout must be positive")


def substitute(command: tuple[str, ...], parameters: dict[str, str]) -> list[str]:
    """Replace ``Ref::name`` in each argument; a reference without a value is an error."""
    def one(arg: str) -> str:
        def repl(m: re.Match) -> str:
            if m.group(1) not in parameters:
                raise ValidationError(f"parameter {m.group(1)!r} is referenced by the command "
                                      "but has no value")
            return str(parameters[m.group(1)])
        return _REF.sub(repl, arg)
    return [one(a) for a in command]


@dataclass(frozen=True)
class Dependency:
    job_id: str
    type: DependencyType = DependencyType.STANDARD

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", DependencyType(self.type))


def describe_resources(r: Resources) -> str:
    """``cpus=2, gpus=0, memory_mib=1024``"""
    return f"cpus={r.cpus:g}, gpus={r.gpus}, memory_mib={r.memory_mib}"


def never_fits(queue: str, need: Resources, slots: list[tuple[str, Resources]]) -> str:
    """Why a worker needing ``need`` can never run in ``queue``, whose environments offer
    ``slots`` (name, slot size) in order; '' when one of them fits.

    A slot's size never changes, so this holds until the queue's environments do. The message
    names the largest slot: the one that fits the most of cpus, gpus and memory, then the
    biggest.
    """
    if any(need.fits_in(slot) for _, slot in slots):
        return ""
    if not slots:
        return f"queue {queue} has no compute environment: it can never run"

    def size(item: tuple[str, Resources]) -> tuple:
        s = item[1]
        fitting = (need.cpus <= s.cpus) + (need.gpus <= s.gpus) + (need.memory_mib <= s.memory_mib)
        return fitting, s.gpus, s.cpus, s.memory_mib

    name, largest = max(slots, key=size)
    return (f"needs {describe_resources(need)} per worker, but the largest slot of queue "
            f"{queue}'s compute environments is {describe_resources(largest)} ({name}): "
            "it can never run")


def check_array_size(size: int | None) -> int | None:
    if size is not None and not 2 <= size <= MAX_ARRAY_SIZE:
        raise ValidationError(f"array size must be 2-{MAX_ARRAY_SIZE}, got {size}")
    return size
