"""The job's numerics: what changes the bits a kernel returns, pinned by the job, not the host.

torch picks its CPU kernels by the host's instruction set (``ATEN_CPU_CAPABILITY``; oneDNN and
MKL pick theirs too), splits work by its intra-op thread count, and has global switches that
change results (deterministic algorithms, the float32 matmul precision). Two workers that differ
in any of these compute other bits for the same chunk, and an elastic job whose workers land on
a mixed spot fleet would train a model that depends on where it ran. So a job chooses them once
(``Numerics``: documented defaults, each one the user's to set), records them in its run folder
and applies them in every worker before the script runs, wherever it runs and whatever
``--workers`` says:

- ``threads``: torch's intra-op threads (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
  ``torch.set_num_threads``); default 1, never derived from the host's cores.
- ``cpu_kernels``: the CPU kernel level (``KernelLevel``), which pins ATen's
  (``ATEN_CPU_CAPABILITY``), oneDNN's (``ONEDNN_MAX_CPU_ISA``) and MKL's
  (``MKL_CBWR``) code paths together; default ``avx2`` on x86-64 (every x86-64 cloud instance
  of the last decade runs it), ``default`` elsewhere. A host that lacks the instruction set is
  refused (``host_refusal``) with the level every host can run.
- ``deterministic``: ``torch.use_deterministic_algorithms``; default off.
- ``matmul_precision``: ``torch.set_float32_matmul_precision``; default ``highest``.

What the job cannot choose (the torch build, the CPU architecture, on GPUs the device's
architecture and the CUDA libraries) is observed (``observe``) and must be the same on every
worker; a canary computation (``dyntrain.elastic.step.canary``) proves the rest. ``judge`` is the
pure admission policy the coordinator applies to each worker's hello.

This module does not import torch at import time: the CLI and the service use ``Numerics``
before (or without) torch.
"""

from __future__ import annotations

import enum
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dyntrain.errors import ConfigError

#: the run folder's record of the job's numerics (``NumericsRecord``)
NUMERICS_FILE = "numerics.json"

# The environment that carries a job's numerics to its workers, and the words a user sets them
# with (a service job's environment, or the shell of ``dyntrain run``).
ENV_THREADS = "DYNTRAIN_THREADS"
ENV_CPU_KERNELS = "DYNTRAIN_CPU_KERNELS"
ENV_DETERMINISTIC = "DYNTRAIN_DETERMINISTIC"
ENV_MATMUL_PRECISION = "DYNTRAIN_MATMUL_PRECISION"
ENV_NAMES = (ENV_THREADS, ENV_CPU_KERNELS, ENV_DETERMINISTIC, ENV_MATMUL_PRECISION)
#: a service job's word for ``dyntrain run --allow-mixed-numerics``
ENV_ALLOW_MIXED = "DYNTRAIN_ALLOW_MIXED_NUMERICS"
#: what the libraries themselves read when they load: set from the pin, never by hand
LIBRARY_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
               "MKL_CBWR")

MATMUL_PRECISIONS = ("highest", "high", "medium")
#: the most intra-op threads a worker may be given: beyond, its start fails creating them
MAX_THREADS = 1024
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
X86 = ("x86_64", "amd64", "i686", "i386")


class KernelLevel(str, enum.Enum):
    """A CPU kernel level: the instruction set torch, oneDNN and MKL may use, pinned together.

    Ordered from the lowest; a host runs a level when its CPU has every flag the level needs.
    """

    DEFAULT = "default"  # no vector extensions beyond the architecture's baseline
    AVX2 = "avx2"
    AVX512 = "avx512"
    AVX512_BF16 = "avx512-bf16"  # AVX-512 with native bfloat16 (oneDNN's bf16 kernels)

    @property
    def rank(self) -> int:
        return list(KernelLevel).index(self)

    @property
    def x86_only(self) -> bool:
        return self is not KernelLevel.DEFAULT

    @property
    def cpu_flags(self) -> tuple[str, ...]:
        """The ``/proc/cpuinfo`` flags a host needs (torch's own test for the level)."""
        return _FLAGS[self]

    def env(self, machine: str | None = None) -> dict[str, str]:
        """The variables that pin ATen's, oneDNN's and MKL's code paths to this level (on other
        architectures than x86-64 ATen's only: oneDNN and MKL name x86 instruction sets)."""
        aten, onednn, mkl = _LIBRARY_LEVELS[self]
        if (machine or platform.machine()).lower() not in X86:
            return {"ATEN_CPU_CAPABILITY": aten}
        return {"ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": onednn, "MKL_CBWR": mkl}


_FLAGS = {
    KernelLevel.DEFAULT: (),
    KernelLevel.AVX2: ("avx2", "fma"),
    KernelLevel.AVX512: ("avx512f", "avx512vl", "avx512bw", "avx512dq", "fma"),
    KernelLevel.AVX512_BF16: ("avx512f", "avx512vl", "avx512bw", "avx512dq", "fma",
                              "avx512_bf16"),
}
# (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_CBWR) of each level. oneDNN is capped below its
# bfloat16 and AMX kernels at ``avx512``: with them it rounds bf16 products another way.
_LIBRARY_LEVELS = {
    KernelLevel.DEFAULT: ("default", "SSE41", "COMPATIBLE"),
    KernelLevel.AVX2: ("avx2", "AVX2", "AVX2"),
    KernelLevel.AVX512: ("avx512", "AVX512_CORE", "AVX512"),
    KernelLevel.AVX512_BF16: ("avx512", "AVX512_CORE_BF16", "AVX512"),
}


def default_kernels(machine: str | None = None) -> KernelLevel:
    """The documented default level: ``avx2`` on x86-64, ``default`` on other architectures."""
    machine = (machine or platform.machine()).lower()
    return KernelLevel.AVX2 if machine in X86 else KernelLevel.DEFAULT


def parse_level(text: str, source: str = "cpu_kernels") -> KernelLevel:
    """The level named ``text``; a ``ConfigError`` naming ``source`` and the choices otherwise."""
    try:
        return KernelLevel(text.strip().lower())
    except ValueError:
        raise ConfigError(f"{source} must be one of {', '.join(k.value for k in KernelLevel)}, "
                          f"got {text!r}") from None


@dataclass(frozen=True)
class Numerics:
    """What a job pins so that every worker computes the same bits; validated on construction.

    Args:
        threads: Intra-op threads of every worker (at least 1), whatever its host's cores.
        cpu_kernels: The CPU kernel level (``KernelLevel`` or its name) every worker runs.
        deterministic: ``torch.use_deterministic_algorithms`` in every worker.
        matmul_precision: ``torch.set_float32_matmul_precision`` in every worker: ``highest``,
            ``high`` or ``medium``.

    Raises:
        ConfigError: A value is out of range (one line, naming it).
    """

    threads: int = 1
    cpu_kernels: KernelLevel = field(default_factory=default_kernels)
    deterministic: bool = False
    matmul_precision: str = "highest"

    def __post_init__(self) -> None:
        if isinstance(self.cpu_kernels, str) and not isinstance(self.cpu_kernels, KernelLevel):
            object.__setattr__(self, "cpu_kernels", parse_level(self.cpu_kernels))
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) \
                or self.threads < 1:
            raise ConfigError(f"threads must be a whole number of at least 1, got "
                              f"{self.threads!r}")
        if self.threads > MAX_THREADS:
            raise ConfigError(f"threads must be at most {MAX_THREADS} (intra-op threads of one "
                              f"worker), got {self.threads}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ConfigError(f"matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)}, "
                              f"got {self.matmul_precision!r}")
        if not isinstance(self.deterministic, bool):
            raise ConfigError(f"deterministic must be true or false, got "
                              f"{self.deterministic!r}")

    def to_json(self) -> dict:
        return {**asdict(self), "cpu_kernels": self.cpu_kernels.value}

    @classmethod
    def from_json(cls, data: Mapping) -> Numerics:
        """The numerics of ``to_json``; a ``ConfigError`` if a field is missing or malformed."""
        try:
            return cls(threads=data["threads"], cpu_kernels=data["cpu_kernels"],
                       deterministic=data["deterministic"],
                       matmul_precision=data["matmul_precision"])
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not a numerics record ({exc!r} missing or malformed)") from None

    def env(self) -> dict[str, str]:
        """A worker's environment for these numerics: dyntrain's own words (which tell the
        worker its job pinned them) and what torch, OpenMP, oneDNN and MKL read when they
        load."""
        return {ENV_THREADS: str(self.threads), ENV_CPU_KERNELS: self.cpu_kernels.value,
                ENV_DETERMINISTIC: "1" if self.deterministic else "0",
                ENV_MATMUL_PRECISION: self.matmul_precision, **self.library_env()}

    def library_env(self, own: Mapping[str, str] | None = None) -> dict[str, str]:
        """What torch, OpenMP, oneDNN and MKL read when they load (threads and kernel level):
        what pins any process that imports torch, dyntrain's worker or not. Less what ``own``
        (a process's own variables) already chooses: its threads if it names any thread
        variable, its kernel level if it names any kernel variable (never half of each)."""
        own = own or {}
        threads = {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
        kernels = self.cpu_kernels.env()
        return {**({} if own.keys() & threads.keys() else threads),
                **({} if own.keys() & set(LIBRARY_ENV[2:]) else kernels)}

    def expected(self) -> dict[str, object]:
        """What ``observe`` must find in a worker that applied these numerics."""
        libraries = self.cpu_kernels.env()
        return {"threads": self.threads,
                "cpu_capability": libraries["ATEN_CPU_CAPABILITY"].upper(),
                "onednn_max_isa": libraries.get("ONEDNN_MAX_CPU_ISA", ""),
                "mkl_cbwr": libraries.get("MKL_CBWR", ""),
                "deterministic": self.deterministic,
                "matmul_precision": self.matmul_precision}

    def describe(self) -> str:
        """``threads 1, cpu kernels avx2, deterministic off, matmul precision highest``."""
        return (f"threads {self.threads}, cpu kernels {self.cpu_kernels.value}, deterministic "
                f"{'on' if self.deterministic else 'off'}, matmul precision "
                f"{self.matmul_precision}")


def numerics_from_env(environ: Mapping[str, str] | None = None, *,
                      base: Numerics | None = None) -> Numerics | None:
    """The numerics the ``DYNTRAIN_*`` variables of ``environ`` name over ``base`` (default:
    the defaults); None when none of them is set and no ``base`` is given."""
    environ = os.environ if environ is None else environ
    given = {name: environ[name] for name in ENV_NAMES if name in environ}
    if not given and base is None:
        return None
    fields: dict[str, object] = {}
    if ENV_THREADS in given:
        try:
            fields["threads"] = int(given[ENV_THREADS])
        except ValueError:
            raise ConfigError(f"{ENV_THREADS} must be a whole number, got "
                              f"{given[ENV_THREADS]!r}") from None
    if ENV_CPU_KERNELS in given:
        fields["cpu_kernels"] = parse_level(given[ENV_CPU_KERNELS], ENV_CPU_KERNELS)
    if ENV_DETERMINISTIC in given:
        fields["deterministic"] = parse_switch(given[ENV_DETERMINISTIC], ENV_DETERMINISTIC)
    if ENV_MATMUL_PRECISION in given:
        fields["matmul_precision"] = given[ENV_MATMUL_PRECISION].strip().lower()
    return Numerics(**{**(base.to_json() if base else {}), **fields})


def parse_switch(text: str, source: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ConfigError(f"{source} must be 1 or 0 (true or false), got {text!r}")


def merge_pin(asked: Mapping[str, object], recorded: Numerics | None,
              where: str) -> Numerics:
    """The numerics of a job (re)started with the settings ``asked`` (only those the user
    gave) in a run folder that recorded ``recorded`` (None: a fresh run): what was recorded,
    refusing a change; else the defaults with what was asked."""
    if recorded is None:
        return Numerics(**asked)
    wanted = Numerics(**{**recorded.to_json(), **asked})
    if wanted != recorded:
        changed = ", ".join(f"{k} {recorded.to_json()[k]} -> {v}"
                            for k, v in wanted.to_json().items() if recorded.to_json()[k] != v)
        raise ConfigError(f"{where} holds a run whose numerics are pinned ({recorded.describe()}); "
                          f"this launch asks {changed}: a resumed run keeps its numerics (use a "
                          f"fresh folder to change them)")
    return recorded


# ---- the host ----------------------------------------------------------------------------------


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's flags as ``/proc/cpuinfo`` lists them (empty where there is no such file)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def host_levels(flags: set[str] | None = None, machine: str | None = None) -> list[KernelLevel]:
    """The kernel levels this host can run, lowest first: each needs the ones below it too
    (AVX-512 code paths use AVX2 instructions as well)."""
    flags = cpu_flags() if flags is None else flags
    machine = (machine or platform.machine()).lower()
    runs = []
    for level in KernelLevel:
        if (level.x86_only and machine not in X86) or not all(f in flags
                                                              for f in level.cpu_flags):
            break
        runs.append(level)
    return runs


def level_refusal(level: KernelLevel, levels: Sequence[KernelLevel], host: str) -> str | None:
    """Why ``host``, which runs the kernel ``levels``, cannot run a job pinned to ``level`` (one
    line: what it runs and the level to choose instead), or None when it can."""
    if level in levels:
        return None
    best = max(levels, key=lambda k: k.rank, default=KernelLevel.DEFAULT)
    return (f"{host} runs cpu kernels up to {best.value}, not the job's {level.value}: start the "
            f"job with --cpu-kernels {best.value} ({ENV_CPU_KERNELS}={best.value}), a level every "
            "host runs")


def host_refusal(numerics: Numerics, host: str, flags: set[str] | None = None,
                 machine: str | None = None) -> str | None:
    """Why ``host`` cannot apply ``numerics`` (one line: what differs and what every host can
    run), or None when it can."""
    machine = (machine or platform.machine()).lower()
    levels = host_levels(flags, machine)
    level = numerics.cpu_kernels
    if level in levels:
        return None
    best = levels[-1] if levels else KernelLevel.DEFAULT
    if level.x86_only and machine not in X86:
        what = f"{host} is {machine}, not x86-64"
    else:
        lacking = sorted(f for f in level.cpu_flags if f not in
                         (cpu_flags() if flags is None else flags))
        what = f"{host}'s CPU lacks {', '.join(lacking)}"
    return (f"{what}: it cannot run the job's cpu kernels {level.value} (it runs at most "
            f"{best.value}); start the job with --cpu-kernels {best.value} "
            f"({ENV_CPU_KERNELS}={best.value}), a level every host runs")


# ---- a worker's own ---------------------------------------------------------------------------


def apply(numerics: Numerics) -> None:
    """Apply what can be set at run time (threads, deterministic algorithms, matmul precision)
    in this process; the kernel level is read from the environment when torch loads."""
    import torch

    if torch.get_num_threads() != numerics.threads:
        torch.set_num_threads(numerics.threads)
    if torch.are_deterministic_algorithms_enabled() != numerics.deterministic:
        torch.use_deterministic_algorithms(numerics.deterministic)
    if torch.get_float32_matmul_precision() != numerics.matmul_precision:
        torch.set_float32_matmul_precision(numerics.matmul_precision)


def observe(device=None) -> dict[str, object]:
    """What this process computes with, as it stands: the pinned settings as torch applied
    them and what the job cannot choose (the torch build, the architecture, on a GPU its
    architecture and libraries). Equal dicts are the first half of computing the same bits;
    the canary is the second."""
    import torch

    seen: dict[str, object] = {
        "torch": torch.__version__, "torch_git": torch.version.git_version,
        "machine": platform.machine().lower(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "mkldnn": torch.backends.mkldnn.enabled,
        "default_dtype": str(torch.get_default_dtype()),
        "autocast_cpu_dtype": str(torch.get_autocast_dtype("cpu")),
    }
    if device is not None and torch.device(device).type == "cuda":
        index = torch.device(device).index or 0
        major, minor = torch.cuda.get_device_capability(index)
        seen.update({
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "gpu": torch.cuda.get_device_name(index), "gpu_arch": f"sm_{major}{minor}",
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cuda_fp16_reduced_reduction":
                torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "cuda_bf16_reduced_reduction":
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "autocast_cuda_dtype": str(torch.get_autocast_dtype("cuda")),
        })
    return seen


def pin_differences(numerics: Numerics, seen: Mapping[str, object]) -> list[str]:
    """Where a worker's ``observe()`` does not show the job's pinned numerics, one phrase each
    (``threads 2 (pinned: 1)``)."""
    return [f"{key} {shown(seen.get(key))} (pinned: {shown(want)})"
            for key, want in numerics.expected().items() if seen.get(key) != want]


def setting_differences(job: Mapping[str, object], mine: Mapping[str, object]) -> list[str]:
    """What differs between the job's observed settings and a worker's, one phrase each
    (``cpu_capability DEFAULT (the job: AVX2)``)."""
    return [f"{key} {shown(mine.get(key))} (the job: {shown(job.get(key))})"
            for key in sorted(set(job) | set(mine)) if job.get(key) != mine.get(key)]


def shown(value: object) -> str:
    """A setting's value as a message shows it (``unset`` for an empty one)."""
    return "unset" if value in ("", None) else str(value)
