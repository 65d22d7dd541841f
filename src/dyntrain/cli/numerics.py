"""The options that choose a job's numerics (``dyntrain run``, ``dyntrain submit``)."""

from __future__ import annotations

import os

import click

from dyntrain.elastic.numerics import (
    ENV_CPU_KERNELS,
    ENV_DETERMINISTIC,
    ENV_MATMUL_PRECISION,
    ENV_THREADS,
    MATMUL_PRECISIONS,
    KernelLevel,
    numerics_from_env,
)


def numerics_options(command):
    """Add ``--threads``, ``--cpu-kernels``, ``--deterministic``, ``--matmul-precision`` and
    ``--allow-mixed-numerics`` to ``command``."""
    options = [
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help=f"Intra-op threads of every worker, whatever its host's cores "
                          f"[default: the run folder's, else {ENV_THREADS}, else 1]."),
        click.option("--cpu-kernels", type=click.Choice([k.value for k in KernelLevel]),
                     default=None,
                     help=f"CPU kernel level of every worker (torch, oneDNN and MKL together); "
                          f"a host that lacks it is refused [default: the run folder's, else "
                          f"{ENV_CPU_KERNELS}, else avx2 on x86-64]."),
        click.option("--deterministic/--no-deterministic", default=None,
                     help="torch.use_deterministic_algorithms in every worker [default: off]."),
        click.option("--matmul-precision", type=click.Choice(MATMUL_PRECISIONS), default=None,
                     help="torch.set_float32_matmul_precision in every worker "
                          "[default: highest]."),
        click.option("--allow-mixed-numerics", is_flag=True,
                     help="Admit a worker that computes other bits than the job (another "
                          "torch, CPU or GPU) instead of refusing it; the run folder records "
                          "from which step the run is no longer bitwise."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def asked_numerics(threads: int | None, cpu_kernels: str | None, deterministic: bool | None,
                   matmul_precision: str | None) -> dict:
    """The numerics fields the user chose: the options given, else the ``DYNTRAIN_*``
    variables of this shell (``DYNTRAIN_THREADS``, ...); the rest is left to the run folder's
    record or the defaults."""
    from_env = numerics_from_env(os.environ) if any(
        name in os.environ for name in (ENV_THREADS, ENV_CPU_KERNELS, ENV_DETERMINISTIC,
                                        ENV_MATMUL_PRECISION)) else None
    asked = {}
    for name, env, given in (("threads", ENV_THREADS, threads),
                             ("cpu_kernels", ENV_CPU_KERNELS, cpu_kernels),
                             ("deterministic", ENV_DETERMINISTIC, deterministic),
                             ("matmul_precision", ENV_MATMUL_PRECISION, matmul_precision)):
        if given is not None:
            asked[name] = given
        elif from_env is not None and env in os.environ:
            asked[name] = getattr(from_env, name)
    if "cpu_kernels" in asked:
        asked["cpu_kernels"] = KernelLevel(asked["cpu_kernels"])
    return asked
