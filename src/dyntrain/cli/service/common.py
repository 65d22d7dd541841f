"""What the service commands share: the connection options, the client, input parsing."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from dyntrain.errors import DyntrainError
from dyntrain.launch.events import parse_workers

DEFAULT_PORT = 8642
TERMINAL = ("SUCCEEDED", "FAILED")
DEPENDENCY_TYPES = ("STANDARD", "N_TO_N", "SEQUENTIAL")
CAPACITY_TYPES = ("ON_DEMAND", "RESERVED", "SPOT")
STATES = ("ENABLED", "DISABLED")
JOB_STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
POLL_SECONDS = 0.5
_META_URL, _META_TOKEN = "dyntrain.url", "dyntrain.token"


def conn_options(f: Callable) -> Callable:
    """``--url`` and ``--token``; on a group they apply to each of its commands."""
    f = click.option("--token", default=None, metavar="TOKEN",
                     help="API token [default: $DYNTRAIN_TOKEN].")(f)
    return click.option("--url", default=None, metavar="URL",
                        help="Service URL [default: $DYNTRAIN_URL or "
                             f"http://127.0.0.1:{DEFAULT_PORT}].")(f)


def remember_conn(ctx: click.Context, url: str | None, token: str | None) -> None:
    if url:
        ctx.meta[_META_URL] = url
    if token:
        ctx.meta[_META_TOKEN] = token


def make_client(url: str | None, token: str | None):
    """A REST client; a command's own ``--url``/``--token`` win over its group's."""
    from dyntrain.service.client import Client

    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    return Client(base_url=url or meta.get(_META_URL), token=token or meta.get(_META_TOKEN))


def friendly(f: Callable) -> Callable:
    """Transport errors the client did not turn into ``ApiError`` become one-line errors."""
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import httpx

        try:
            return f(*args, **kwargs)
        except httpx.HTTPError as e:
            raise DyntrainError(f"cannot reach the dyntrain service: "
                                f"{one_line(e) or type(e).__name__}") from None
    return wrapper


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------ parsing


def parse_min_max(text: str, flag: str = "--workers") -> dict[str, int]:
    """``MIN:MAX`` or ``N`` -> {"min": .., "max": ..}."""
    low, high = parse_workers(text, flag)
    return {"min": low, "max": high}


def parse_slots(text: str) -> tuple[int, int, int]:
    """``MIN:DESIRED:MAX``, or ``N`` for a fixed N:N:N."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            values = [int(parts[0])] * 3
        elif len(parts) == 3:
            values = [int(p) for p in parts]
        else:
            raise ValueError
    except ValueError:
        raise DyntrainError(f"--slots must be MIN:DESIRED:MAX (e.g. 0:2:8), got {text!r}") \
            from None
    low, desired, high = values
    if not 0 <= low <= desired <= high:
        raise DyntrainError(f"--slots MIN:DESIRED:MAX needs 0 <= MIN <= DESIRED <= MAX, "
                            f"got {text!r}")
    return low, desired, high


def parse_kv(values: Iterable[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DyntrainError(f"{flag} must be KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def parse_dependency(text: str) -> dict[str, str]:
    """``ID`` or ``ID:TYPE``; an array child's id (``parent:3``) keeps its colon."""
    job_id, sep, kind = text.rpartition(":")
    if sep and kind.upper() in DEPENDENCY_TYPES:
        if not job_id:
            raise DyntrainError(f"--depends-on must be ID[:TYPE], got {text!r}")
        return {"job_id": job_id, "type": kind.upper()}
    if not text:
        raise DyntrainError("--depends-on must be ID[:TYPE], got ''")
    return {"job_id": text, "type": "STANDARD"}


def split_names(text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise DyntrainError(f"{flag} must be a comma-separated list of names, got {text!r}")
    return names


def resources_fields(cpus: float | None, gpus: int | None, memory: int | None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if cpus is not None:
        res["cpus"] = cpus
    if gpus is not None:
        res["gpus"] = gpus
    if memory is not None:
        res["memory_mib"] = memory
    return res


def load_yaml(path: str) -> dict[str, Any]:
    """A YAML file holding one mapping; every problem is one line naming the file."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise DyntrainError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise DyntrainError(f"cannot read {path}: not a text file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise DyntrainError(f"{path}: invalid YAML{where}: {one_line(problem)}") from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise DyntrainError(f"{path}: expected a mapping of fields, the file is {kind}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise DyntrainError(f"{path}: field names must be strings, got {bad[0]!r}")
    return data


def from_file(path: str | None, call: Callable[[], Any]) -> Any:
    """Run ``call``; when the fields came from ``path``, errors name the file."""
    try:
        return call()
    except DyntrainError as e:
        if path is None or str(path) in str(e):
            raise
        raise DyntrainError(f"{path}: {one_line(e)}") from None
