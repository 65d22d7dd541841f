"""What a job takes from the shell that submits it: a working directory and environment variables.

As Slurm's ``sbatch`` does (``--chdir``, ``--export``), a job submitted from the command line runs
in the submitter's working directory with the submitter's environment by default, so that
``dyntrain submit -- python shard.py`` finds ``shard.py`` and the ``python`` of an activated
virtual environment, whatever directory and environment the server was started from.

``--export`` takes ``ALL`` (the default: every variable), ``NONE`` (no variable: the job sees the
server's environment plus its own ``--env``), or a comma-separated list of names (only those) and
``NAME=VALUE`` items (set to that value); ``ALL,NAME=VALUE`` exports everything plus that value.

The variables the service sets for each worker (its job id, attempt, array index, worker id, run
folder, coordinator) are never exported: a job submitted from inside another job must not inherit
its parent's identity. Exported variables are the lowest layer of a worker's environment: the job
definition's environment and the job's own ``--env`` override them, and the service's variables
override everything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dyntrain.elastic.numerics import (
    ENV_ALLOW_MIXED,
    ENV_CPU_KERNELS,
    LIBRARY_ENV,
    KernelLevel,
    Numerics,
    numerics_from_env,
    parse_switch,
)
from dyntrain.elastic.runs.storage import StorageError, is_url, open_store
from dyntrain.errors import ConfigError
from dyntrain.service.core.model import ValidationError

# Set by the controller for every worker (see Controller._worker_env), never taken from a shell.
SERVICE_VARIABLES = frozenset({
    "DYNTRAIN_JOB_ID", "DYNTRAIN_JOB_NAME", "DYNTRAIN_JOB_ATTEMPT", "DYNTRAIN_ARRAY_INDEX",
    "DYNTRAIN_WORKER_ID", "DYNTRAIN_OUT", "DYNTRAIN_COORDINATOR", "AWS_BATCH_JOB_ID",
    "AWS_BATCH_JOB_ATTEMPT", "AWS_BATCH_JOB_ARRAY_INDEX",
})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ExportSpec:
    """Which of the submitter's variables a job takes (``--export``)."""

    all: bool = True
    names: tuple[str, ...] = ()  # taken from the shell (when not all)
    values: tuple[tuple[str, str], ...] = ()  # NAME=VALUE items


def parse_export(text: str, flag: str = "--export") -> ExportSpec:
    """``ALL``, ``NONE``, or ``[ALL,]NAME[,NAME=VALUE...]``; one-line errors name ``flag``."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise ValidationError(f"{flag} must be ALL, NONE or a comma-separated list of NAME or "
                              f"NAME=VALUE, got {text!r}")
    upper = [item.upper() for item in items]
    if upper == ["NONE"]:
        return ExportSpec(all=False)
    if "NONE" in upper:
        raise ValidationError(f"{flag} NONE cannot be combined with other items, got {text!r}")
    names, values = [], []
    for item in items:
        if item.upper() == "ALL":
            continue
        name, sep, value = item.partition("=")
        if not _NAME.match(name):
            raise ValidationError(f"{flag}: {name!r} is not an environment variable name")
        if sep:
            values.append((name, value))
        else:
            names.append(name)
    return ExportSpec(all="ALL" in upper, names=tuple(names), values=tuple(values))


def exported(environ: Mapping[str, str], spec: ExportSpec = ExportSpec()) -> dict[str, str]:
    """The variables of ``environ`` that ``spec`` exports (service variables left out)."""
    chosen = dict(environ) if spec.all else {n: environ[n] for n in spec.names if n in environ}
    chosen.update(spec.values)
    return clean(chosen)


def clean(variables: Mapping[str, str]) -> dict[str, str]:
    """Drop the service's own variables and names a process environment cannot hold."""
    return {k: str(v) for k, v in variables.items()
            if k not in SERVICE_VARIABLES and _NAME.match(k) and "\x00" not in str(v)}


def check_run_folder(environment: Mapping[str, str]) -> None:
    """A job's own ``DYNTRAIN_OUT`` may move its run folder to an object store, nowhere else:
    the service keeps local run folders in its state directory."""
    out = environment.get("DYNTRAIN_OUT")
    if out is None:
        return
    if not is_url(out):
        raise ValidationError(f"DYNTRAIN_OUT={out!r}: a job's run folder can only be moved to "
                              "an object store (a URL such as s3://bucket/prefix); local run "
                              "folders live in the service's state directory")
    try:
        open_store(out)  # a known protocol whose package is installed here (no request made)
    except StorageError as exc:
        raise ValidationError(f"DYNTRAIN_OUT: {exc}") from None


def pinned_kernels(environment: Mapping[str, str], exported: Mapping[str, str] | None,
                   elastic: bool) -> KernelLevel | None:
    """The CPU kernel level a job's workers are pinned to: its numerics' (``DYNTRAIN_CPU_KERNELS``
    or the default). None for a job that is not elastic and whose own (or exported) variables
    name a kernel variable (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_CBWR``): it
    chose its own, and the service sets none. A ``ValidationError`` naming a bad value."""
    own = {**(exported or {}), **environment}
    if not elastic and own.keys() & set(LIBRARY_ENV[2:]):
        return None
    return job_numerics(environment)[0].cpu_kernels


def kernel_refusal(level: KernelLevel, levels: Sequence[KernelLevel]) -> str | None:
    """Why a job pinned to ``level`` cannot run on a service whose hosts run ``levels`` (one
    line: the level, what the hosts run, what to choose), or None when they run it."""
    if level in levels:
        return None
    best = max(levels, key=lambda k: k.rank, default=KernelLevel.DEFAULT)
    return (f"its cpu kernels {level.value} run on none of this service's hosts (they run "
            f"{', '.join(k.value for k in levels) or 'none'}): submit it with "
            f"{ENV_CPU_KERNELS}={best.value}, a level every host runs")


def job_numerics(environment: Mapping[str, str]) -> tuple[Numerics, bool]:
    """An elastic job's numerics (the defaults and what its environment's ``DYNTRAIN_THREADS``,
    ``DYNTRAIN_CPU_KERNELS``, ``DYNTRAIN_DETERMINISTIC`` and ``DYNTRAIN_MATMUL_PRECISION``
    say) and whether it admits workers of other numerics (``DYNTRAIN_ALLOW_MIXED_NUMERICS``);
    a ``ValidationError`` naming a bad value."""
    try:
        numerics = numerics_from_env(environment, base=Numerics())
        mixed = parse_switch(environment.get(ENV_ALLOW_MIXED, "0"), ENV_ALLOW_MIXED)
    except ConfigError as exc:
        raise ValidationError(str(exc)) from None
    return numerics, mixed
