"""Request bodies. Unknown fields are refused and every number is bounded, so garbage gets a 422
with a one-line message before it reaches the store; the specs in ``dyntrain.service.model``
then check what relates several fields (min <= desired <= max, a name's spelling) with a 400."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from dyntrain.service.model import (
    MAX_ARRAY_SIZE,
    MAX_ATTEMPTS,
    CapacityType,
    DependencyType,
    Resources,
    RetryAction,
    State,
)

MAX_SLOTS = 100_000
MAX_WORKERS = 10_000
MAX_INT32 = 2**31 - 1
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFINITION_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}(:[1-9][0-9]{0,8})?$")


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError("an environment variable name must be letters, digits or '_' and not "
                         "start with a digit")
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("must be an absolute path")
    return value


def _definition_ref(value: str) -> str:
    if not _DEFINITION_REF.match(value):
        raise ValueError("a job definition is NAME or NAME:REVISION (a revision is a number "
                         ">= 1)")
    return value


Name = Annotated[str, Field(min_length=1, max_length=128)]
Text = Annotated[str, Field(max_length=65_536), AfterValidator(_no_nul)]
Arg = Annotated[str, Field(min_length=1, max_length=65_536), AfterValidator(_no_nul)]
EnvName = Annotated[str, Field(max_length=1024), AfterValidator(_env_name)]
ParamValue = Annotated[str, Field(max_length=65_536), AfterValidator(_no_nul)] | int | float
Slots = Annotated[int, Field(ge=0, le=MAX_SLOTS)]
Price = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]
Priority = Annotated[int, Field(ge=-1_000_000, le=1_000_000)]
Workers = Annotated[int, Field(ge=1, le=MAX_WORKERS)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourcesIn(Body):
    """One worker slot (of an environment) or what one worker needs (of a job)."""

    cpus: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] = 1.0
    gpus: Annotated[int, Field(ge=0, le=100_000)] = 0
    memory_mib: Annotated[int, Field(gt=0, le=MAX_INT32)] = 1024

    def spec(self) -> Resources:
        return Resources(self.cpus, self.gpus, self.memory_mib)


# ------------------------------------------------------------------------ compute environments


class ComputeEnvironmentIn(Body):
    name: Name
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    price_per_slot_hour: Price = 0.0
    slot: ResourcesIn = Field(default_factory=ResourcesIn)
    min_slots: Slots = 0
    desired_slots: Slots = 0
    max_slots: Slots = 1
    state: State = State.ENABLED


class ComputeEnvironmentPatch(Body):
    """Change capacity at run time; fields left out keep their value."""

    state: State | None = None
    min_slots: Slots | None = None
    desired_slots: Slots | None = None
    max_slots: Slots | None = None
    price_per_slot_hour: Price | None = None


class TraceIn(Body):
    csv: Annotated[str, Field(min_length=1, max_length=1_000_000)]
    loop: bool = False


# ---------------------------------------------------------------------------------- job queues


class JobQueueIn(Body):
    name: Name
    priority: Priority = 1
    compute_environments: Annotated[list[Name], Field(max_length=1000)]
    state: State = State.ENABLED


class JobQueuePatch(Body):
    priority: Priority | None = None
    state: State | None = None
    compute_environments: Annotated[list[Name], Field(max_length=1000)] | None = None


# ----------------------------------------------------------------------------- job definitions


class RetryRuleIn(Body):
    action: RetryAction
    on_exit_code: Annotated[str, Field(max_length=256)] | int | None = None
    on_reason: Annotated[str, Field(max_length=1024)] | None = None


class RetryStrategyIn(Body):
    attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)] = 1
    evaluate_on_exit: Annotated[list[RetryRuleIn], Field(max_length=100)] = []


class ElasticIn(Body):
    min_workers: Workers = 1
    max_workers: Workers = 1


Command = Annotated[list[Arg], Field(min_length=1, max_length=10_000)]
Environment = Annotated[dict[EnvName, Text], Field(max_length=10_000)]
Parameters = Annotated[dict[Annotated[str, Field(min_length=1, max_length=256)], ParamValue],
                       Field(max_length=10_000)]


class JobDefinitionIn(Body):
    name: Name
    command: Command
    environment: Environment = {}
    parameters: Parameters = {}
    resources: ResourcesIn = Field(default_factory=ResourcesIn)
    retry_strategy: RetryStrategyIn = Field(default_factory=RetryStrategyIn)
    timeout_seconds: Seconds | None = None
    elastic: ElasticIn | None = None


# ---------------------------------------------------------------------------------------- jobs


class DependencyIn(Body):
    job_id: Annotated[str, Field(max_length=200)] = ""  # "" (itself) for SEQUENTIAL
    type: DependencyType = DependencyType.STANDARD


class WorkersIn(Body):
    min: Workers = 1
    max: Workers = 1


class JobIn(Body):
    queue: Name
    definition: Annotated[str, AfterValidator(_definition_ref)] | None = None  # name[:rev]
    command: Command | None = None
    name: Name | None = None
    parameters: Parameters = {}
    environment: Environment = {}
    resources: ResourcesIn | None = None
    array_size: Annotated[int, Field(ge=2, le=MAX_ARRAY_SIZE)] | None = None
    depends_on: Annotated[list[DependencyIn], Field(max_length=1000)] = []
    workers: WorkersIn | None = None
    retry_attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)] | None = None
    timeout_seconds: Seconds | None = None
    job_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    workdir: Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_no_nul),
                       AfterValidator(_absolute)] | None = Field(
        None, description="where the workers start (the CLI sends the submitter's directory); "
                          "default: the service's working directory")
    exported_environment: Environment | None = Field(
        None, description="the submitter's environment variables (`--export`), under "
                          "`environment` and the job definition's")
