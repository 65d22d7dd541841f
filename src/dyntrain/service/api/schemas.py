"""Request bodies. Unknown fields are refused, every number is bounded and every string rule (a
name's spelling, no NUL, an absolute path) is checked here and stated in the OpenAPI schema as a
pattern, so garbage gets a 422 with a one-line message before it reaches the store; the specs in
``dyntrain.service.core.model`` then check what relates several fields (min <= desired <= max) or
names other resources (an unknown queue) with a 400."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    model_validator,
)

from dyntrain.service.core.model import (
    MAX_ARRAY_SIZE,
    MAX_ATTEMPTS,
    CapacityType,
    DependencyType,
    Launcher,
    Resources,
    RetryAction,
    State,
)

MAX_SLOTS = 100_000
MAX_WORKERS = 10_000
MAX_INT32 = 2**31 - 1
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
NO_NUL_PATTERN = r"^[^\x00]*$"
DEFINITION_REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}(:[1-9][0-9]{0,8})?$"


def _rule(pattern: str, message: str, **bounds: int) -> Any:
    """A string type whose rule is stated in the schema as ``pattern`` and refused with
    ``message``; ``bounds``: its min_length/max_length."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(message)
        return value

    return Annotated[str, Field(json_schema_extra={"pattern": pattern}, **bounds),
                     AfterValidator(check)]


def _keys_by_pattern(schema: dict[str, Any]) -> None:
    """pydantic states a key pattern as ``patternProperties``, which lets other keys through;
    the server refuses them, so the schema says so in ``propertyNames``."""
    (pattern, values), = schema.pop("patternProperties").items()
    schema.setdefault("propertyNames", {})["pattern"] = pattern
    schema["additionalProperties"] = values


def _not_text_or_flag(value: Any) -> Any:
    if isinstance(value, (str, bool)):
        raise ValueError("Input should be an integer")
    return value


def _integer(**bounds: int) -> Any:
    """A JSON integer within ``bounds`` (ge/gt/le): 3 or 3.0, as JSON Schema's integers, never
    "3" or true."""
    return Annotated[int, Field(**bounds), BeforeValidator(_not_text_or_flag)]


Integer = _integer()
NO_NUL = "must not contain NUL characters"
Name = _rule(NAME_PATTERN, "a name is letters, digits, '-' or '_' and starts with a letter or "
                           "digit", min_length=1, max_length=128)
Text = _rule(NO_NUL_PATTERN, NO_NUL, max_length=65_536)
Arg = _rule(NO_NUL_PATTERN, NO_NUL, min_length=1, max_length=65_536)
EnvName = _rule(ENV_NAME_PATTERN, "an environment variable name must be letters, digits or '_' "
                                  "and not start with a digit", max_length=1024)
ParamValue = Text | Integer | StrictFloat
Slots = _integer(ge=0, le=MAX_SLOTS)
Price = Annotated[float, Field(strict=True, ge=0, le=1e9, allow_inf_nan=False)]
Seconds = Annotated[float, Field(strict=True, gt=0, le=1e9, allow_inf_nan=False)]
Priority = _integer(ge=-1_000_000, le=1_000_000)
Workers = _integer(ge=1, le=MAX_WORKERS)


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourcesIn(Body):
    """One worker slot (of an environment) or what one worker needs (of a job)."""

    cpus: Annotated[float, Field(strict=True, gt=0, le=100_000, allow_inf_nan=False)] = 1.0
    gpus: _integer(ge=0, le=100_000) = 0
    memory_mib: _integer(gt=0, le=MAX_INT32) = 1024

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
    loop: StrictBool = False


# ---------------------------------------------------------------------------------- job queues


EnvironmentNames = Annotated[list[Name], Field(min_length=1, max_length=1000,
                                               json_schema_extra={"uniqueItems": True})]


class JobQueueIn(Body):
    name: Name
    priority: Priority = 1
    compute_environments: EnvironmentNames
    state: State = State.ENABLED
    scheduling_policy: Name | None = Field(
        None, description="a fair-share scheduling policy's name; none: first in, first out")
    preempt_plain_jobs: bool = Field(
        False, description="under the fairshare policy, a plain job of an over-entitled share "
                           "may be preempted (queued again, the attempt not counted) for a "
                           "share below its entitlement when no elastic job can shrink")


class JobQueuePatch(Body):
    priority: Priority | None = None
    state: State | None = None
    compute_environments: EnvironmentNames | None = None
    scheduling_policy: Name | None = Field(
        None, description="replaces the queue's fair-share policy (a first in, first out "
                          "queue cannot be given one)")
    preempt_plain_jobs: bool | None = None


# ------------------------------------------------------------------------ scheduling policies

ShareId = _rule(r"^[A-Za-z0-9]{1,255}$", "a share identifier is 1-255 letters or digits",
                min_length=1, max_length=255)


class ShareIn(Body):
    identifier: _rule(r"^[A-Za-z0-9]{1,255}\*?$", "a share identifier is 1-255 letters or "
                      "digits, optionally followed by * (a prefix)", min_length=1,
                      max_length=256)
    weight_factor: Annotated[float, Field(strict=False, ge=0.0001, le=999.9999,
                                          allow_inf_nan=False)] = 1.0


class FairshareIn(Body):
    """AWS Batch's fairsharePolicy: a lower weight factor gets more slots."""

    share_decay_seconds: _integer(ge=0, le=604800) = 0
    compute_reservation: _integer(ge=0, le=99) = 0
    shares: Annotated[list[ShareIn], Field(max_length=500)] = []


class SchedulingPolicyIn(FairshareIn):
    name: Name


# ----------------------------------------------------------------------------- job definitions


class RetryRuleIn(Body):
    """What to do when an attempt ends in a way that matches ``on_exit_code`` or
    ``on_reason`` (at least one of them)."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": ["on_exit_code"], "properties": {"on_exit_code": {"not": {"type": "null"}}}},
        {"required": ["on_reason"], "properties": {"on_reason": {"type": "string"}}}]})

    action: RetryAction
    on_exit_code: Annotated[str, Field(max_length=256)] | Integer | None = None
    on_reason: Annotated[str, Field(max_length=1024)] | None = None

    @model_validator(mode="after")
    def _matches_something(self) -> RetryRuleIn:
        if self.on_exit_code is None and self.on_reason is None:
            raise ValueError("a retry rule needs on_exit_code or on_reason")
        return self


class RetryStrategyIn(Body):
    attempts: _integer(ge=1, le=MAX_ATTEMPTS) = 1
    evaluate_on_exit: Annotated[list[RetryRuleIn], Field(max_length=100)] = []


class ElasticIn(Body):
    min_workers: Workers = 1
    max_workers: Workers = 1
    launcher: Launcher = Field(
        Launcher.DYNTRAIN, description="dyntrain: the exact runtime; torchrun: a plain DDP "
                                       "script with torchrun's variables, restarted per resize")


Command = Annotated[list[Arg], Field(min_length=1, max_length=10_000)]
Environment = Annotated[dict[EnvName, Text], Field(max_length=10_000,
                                                   json_schema_extra=_keys_by_pattern)]
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
    """A job: a job definition, a command, or both (the command then replaces the
    definition's)."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": ["definition"], "properties": {"definition": {"type": "string"}}},
        {"required": ["command"], "properties": {"command": {"type": "array"}}}]})

    queue: Name
    definition: _rule(DEFINITION_REF_PATTERN, "a job definition is NAME or NAME:REVISION (a "
                                              "revision is a number >= 1)") | None = None
    command: Command | None = None
    name: Name | None = None
    parameters: Parameters = {}
    environment: Environment = {}
    resources: ResourcesIn | None = None
    array_size: _integer(ge=2, le=MAX_ARRAY_SIZE) | None = None
    depends_on: Annotated[list[DependencyIn], Field(max_length=1000)] = []
    workers: WorkersIn | None = None
    launcher: Launcher | None = Field(
        None, description="how an elastic job's workers run (needs `workers` here or in the "
                          "definition); default: the definition's, else dyntrain")
    retry_attempts: _integer(ge=1, le=MAX_ATTEMPTS) | None = None
    timeout_seconds: Seconds | None = None
    job_id: _rule(NAME_PATTERN, "a job id is letters, digits, '-' or '_' and starts with a "
                                "letter or digit", min_length=1, max_length=64) | None = None
    workdir: _rule(r"^/[^\x00]*$", "must be an absolute path (without NUL characters)",
                   min_length=1, max_length=4096) | None = Field(
        None, description="where the workers start (the CLI sends the submitter's directory); "
                          "default: the service's working directory")
    exported_environment: Environment | None = Field(
        None, description="the submitter's environment variables (`--export`), under "
                          "`environment` and the job definition's")
    share: ShareId | None = Field(
        None, description="its share identifier: required by a queue with a fair-share "
                          "scheduling policy, refused by any other")
    scheduling_priority: _integer(ge=0, le=9999) | None = Field(
        None, description="orders the jobs of one share, higher first")

    @model_validator(mode="after")
    def _definition_or_command(self) -> JobIn:
        if self.definition is None and self.command is None:
            raise ValueError("submit needs a job definition or a command")
        return self
