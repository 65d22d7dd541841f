"""What the service commands share: the connection options, the client, input parsing."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from dyntrain.errors import DyntrainError, Unreachable
from dyntrain.launch.events import parse_workers
from dyntrain.service.core.model import (
    DEFAULT_PORT,
    CapacityType,
    DependencyType,
    JobStatus,
    State,
    values,
)

# the service's own vocabulary (its enums' values), as the REST API and these commands say it
DEPENDENCY_TYPES = values(DependencyType)
CAPACITY_TYPES = values(CapacityType)
STATES = values(State)
JOB_STATUSES = values(JobStatus)
POLL_SECONDS = 0.5
MAX_ATTEMPTS = 10
_CHILD_FOLDER = re.compile(r"^(.+)_(\d+)$")  # an array child as its run folder names it
_META_URL, _META_TOKEN = "dyntrain.url", "dyntrain.token"


def conn_options(f: Callable) -> Callable:
    """``--url`` and ``--token``; on a group they apply to each of its commands."""
    f = click.option("--token", default=None, metavar="TOKEN",
                     help="API token [default: $DYNTRAIN_TOKEN].")(f)
    return click.option("--url", default=None, metavar="URL[,URL...]",
                        help="Service URL, or several replicas' URLs separated by commas (the "
                             "next is asked when one does not answer) [default: $DYNTRAIN_URL "
                             f"or http://127.0.0.1:{DEFAULT_PORT}].")(f)


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

        from dyntrain.service.client import unreachable_hint

        try:
            return f(*args, **kwargs)
        except httpx.HTTPError as e:
            raise Unreachable(f"cannot reach the dyntrain service "
                              f"({one_line(e) or type(e).__name__}): {unreachable_hint()}") \
                from None
    return wrapper


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


def resolve_job(client, ref: str) -> dict[str, Any]:
    """The job ``ref`` names: its id or a unique prefix of one (as ``status`` shows them); an
    array child as ``PARENT:N`` or, as its run folder is named, ``PARENT_N``."""
    from dyntrain.service.client import ApiError

    try:
        return client.get_job(ref)
    except ApiError as first:
        if first.status != 404:
            raise
        error = first
    parent, sep, index = ref.partition(":")
    folder = _CHILD_FOLDER.match(ref) if not sep else None
    if folder:
        parent, sep, index = folder.group(1), ":", folder.group(2)
        try:
            return client.get_job(f"{parent}:{index}")
        except ApiError as e:
            if e.status != 404:
                raise
    from dyntrain.cli.service.output import list_items

    try:
        jobs = list_items(client.list_jobs(limit=1000), "jobs", "items")
    except ApiError:
        raise error from None
    matches = [j for j in jobs if str(j.get("id", "")).startswith(parent)]
    if len(matches) > 1:
        some = ", ".join(j["id"] for j in matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise DyntrainError(f"job id {ref!r} is ambiguous: {len(matches)} job ids start "
                            f"with it ({some})")
    if len(matches) == 1:
        try:
            return client.get_job(matches[0]["id"] + sep + index)
        except ApiError as e:
            if e.status != 404:
                raise
    raise error from None


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
    return {"job_id": text, "type": DependencyType.STANDARD.value}


def attempts_from_flags(attempts: int | None, retries: int | None) -> int | None:
    """``--attempts N`` (in all, the first included) or ``--retries N`` (after the first: N+1
    attempts), checked; None when neither is given."""
    if attempts is not None and retries is not None:
        raise DyntrainError("give --attempts (in all) or --retries (after the first attempt), "
                            "not both")
    if attempts is not None and not 1 <= attempts <= MAX_ATTEMPTS:
        raise DyntrainError(f"--attempts must be 1-{MAX_ATTEMPTS} (attempts in all, the first "
                            f"included), got {attempts}")
    if retries is not None and not 0 <= retries < MAX_ATTEMPTS:
        raise DyntrainError(f"--retries must be 0-{MAX_ATTEMPTS - 1} (retries after the first "
                            f"attempt), got {retries}")
    return attempts if retries is None else retries + 1


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


def load_body(path: str, body: str) -> dict[str, Any]:
    """A YAML file of the fields of REST body ``body`` (a class in
    ``dyntrain.service.api.schemas``); unknown fields are named."""
    from dyntrain.service.api import schemas

    data = load_yaml(path)
    known = sorted(getattr(schemas, body).model_fields)
    unknown = [k for k in data if k not in known]
    if unknown:
        raise DyntrainError(f"{path}: unknown field(s) {', '.join(unknown)} (known: "
                            f"{', '.join(known)})")
    return data


def from_file(path: str | None, call: Callable[[], Any]) -> Any:
    """Run ``call``; when the fields came from ``path``, errors name the file."""
    try:
        return call()
    except DyntrainError as e:
        if path is None or str(path) in str(e):
            raise
        raise DyntrainError(f"{path}: {one_line(e)}") from None
