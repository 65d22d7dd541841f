"""Optional dependencies: which extra of ``pip install 'dyntrain[EXTRA]'`` brings a module.

``pip install dyntrain`` gives the trainer, ``dyntrain run``/``worker``/``compare`` and the chunk
loader (torch, numpy, click, fsspec). Everything else is an extra: ``service`` (the job service,
its dashboard and the commands that talk to it), ``data`` (image decoding for the input pipeline
and the recipes), ``workloads`` (the bundled workloads: scikit-learn's digits), ``lab``,
``ray``, ``postgres``, ``tensorboard`` (TensorBoard event files in run folders),
``lightning`` (``dyntrain.adapters.lightning``), ``transformers``
(``dyntrain.adapters.transformers``). A command that needs a missing extra stops with
one line naming it (``MissingExtra``), never an ImportError traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dyntrain.errors import DyntrainError

# top-level module -> (the extra that installs it, the distribution's name on PyPI)
MODULES: dict[str, tuple[str, str]] = {
    "fastapi": ("service", "fastapi"),
    "starlette": ("service", "fastapi"),
    "pydantic": ("service", "fastapi"),
    "sqlalchemy": ("service", "SQLAlchemy"),
    "uvicorn": ("service", "uvicorn"),
    "httpx": ("service", "httpx"),
    "jinja2": ("service", "Jinja2"),
    "prometheus_client": ("service", "prometheus-client"),
    "botocore": ("service", "botocore"),
    "yaml": ("service", "PyYAML"),
    "rich": ("service", "rich"),
    "PIL": ("data", "pillow"),
    "simplejpeg": ("data", "simplejpeg"),
    "sklearn": ("workloads", "scikit-learn"),
    "matplotlib": ("lab", "matplotlib"),
    "ray": ("ray", "ray"),
    "psycopg": ("postgres", "psycopg"),
    "torchvision": ("vision", "torchvision"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "lightning": ("lightning", "lightning"),
    "transformers": ("transformers", "transformers"),
    "accelerate": ("transformers", "accelerate"),
}


class MissingExtra(DyntrainError):
    """A module of an optional extra is not installed; the message says what to install.

    Args:
        module: the missing top-level module (a key of ``MODULES``).
        what: what needs it, as the user knows it; None: "this".
        extra: the extra to name instead of the module's own (one that also brings it).
    """

    def __init__(self, module: str, what: str | None = None, extra: str | None = None) -> None:
        default, dist = MODULES[module]
        self.module, self.extra = module, extra or default
        needs = f"{what} needs" if what else "this needs"
        super().__init__(f"{needs} {dist}, which is not installed: pip install "
                         f"'dyntrain[{self.extra}]'")


def missing_extra(exc: BaseException, what: str | None = None,
                  extra: str | None = None) -> MissingExtra | None:
    """The ``MissingExtra`` that ``exc`` (a ModuleNotFoundError) stands for, or None when the
    missing module belongs to no extra (a real bug, or the user's own import). An ImportError
    of a module that is there (a name it lacks) is a bug, not a missing extra: None.

    Args:
        exc: the exception an import raised.
        what: what needs the module, as the user knows it (a command, a workload).
        extra: the extra to name, when ``what`` needs one that brings the module (the lab's
            commands: ``lab``) rather than the module's own extra.
    """
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.partition(".")[0]
    return MissingExtra(top, what, extra) if top in MODULES else None


@contextmanager
def needs_extra(what: str) -> Iterator[None]:
    """Imports inside the block that fail for a module of an extra raise ``MissingExtra``
    naming ``what`` (e.g. "the digits workload") and the extra to install.

    Args:
        what: what needs the modules, as the user knows it.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        found = missing_extra(exc, what)
        if found is None:
            raise
        raise found from None
