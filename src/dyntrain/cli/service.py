"""``dyntrain server`` and the commands that talk to it.

``server`` runs the job service in the foreground; ``submit``, ``status``, ``logs``, ``cancel``,
``terminate`` and the ``ce``, ``queue`` and ``jobdef`` groups are thin clients of its REST API.
Every client command takes ``--url`` and ``--token`` (on the command, or on its group), which
default to ``$DYNTRAIN_URL`` (else http://127.0.0.1:8642) and ``$DYNTRAIN_TOKEN``.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
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

# ------------------------------------------------------------------------------ connection


def _conn_options(f: Callable) -> Callable:
    """``--url`` and ``--token``; on a group they apply to each of its commands."""
    f = click.option("--token", default=None, metavar="TOKEN",
                     help="API token [default: $DYNTRAIN_TOKEN].")(f)
    return click.option("--url", default=None, metavar="URL",
                        help="Service URL [default: $DYNTRAIN_URL or "
                             f"http://127.0.0.1:{DEFAULT_PORT}].")(f)


def _remember_conn(ctx: click.Context, url: str | None, token: str | None) -> None:
    if url:
        ctx.meta[_META_URL] = url
    if token:
        ctx.meta[_META_TOKEN] = token


def _client(url: str | None, token: str | None):
    """A REST client; a command's own ``--url``/``--token`` win over its group's."""
    from dyntrain.service.client import Client

    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    return Client(base_url=url or meta.get(_META_URL), token=token or meta.get(_META_TOKEN))


def _friendly(f: Callable) -> Callable:
    """Transport errors the client did not turn into ``ApiError`` become one-line errors."""
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import httpx

        try:
            return f(*args, **kwargs)
        except httpx.HTTPError as e:
            raise DyntrainError(f"cannot reach the dyntrain service: "
                                f"{_one_line(e) or type(e).__name__}") from None
    return wrapper


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------ parsing


def _parse_workers(text: str, flag: str = "--workers") -> dict[str, int]:
    """``MIN:MAX`` or ``N`` -> {"min": .., "max": ..}."""
    low, high = parse_workers(text, flag)
    return {"min": low, "max": high}


def _parse_slots(text: str) -> tuple[int, int, int]:
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


def _parse_kv(values: Iterable[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DyntrainError(f"{flag} must be KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _parse_dependency(text: str) -> dict[str, str]:
    """``ID`` or ``ID:TYPE``; an array child's id (``parent:3``) keeps its colon."""
    job_id, sep, kind = text.rpartition(":")
    if sep and kind.upper() in DEPENDENCY_TYPES:
        if not job_id:
            raise DyntrainError(f"--depends-on must be ID[:TYPE], got {text!r}")
        return {"job_id": job_id, "type": kind.upper()}
    if not text:
        raise DyntrainError("--depends-on must be ID[:TYPE], got ''")
    return {"job_id": text, "type": "STANDARD"}


def _split_names(text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise DyntrainError(f"{flag} must be a comma-separated list of names, got {text!r}")
    return names


def _resources(cpus: float | None, gpus: int | None, memory: int | None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if cpus is not None:
        res["cpus"] = cpus
    if gpus is not None:
        res["gpus"] = gpus
    if memory is not None:
        res["memory_mib"] = memory
    return res


def _load_yaml(path: str) -> dict[str, Any]:
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
        raise DyntrainError(f"{path}: invalid YAML{where}: {_one_line(problem)}") from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise DyntrainError(f"{path}: expected a mapping of fields, the file is {kind}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise DyntrainError(f"{path}: field names must be strings, got {bad[0]!r}")
    return data


def _from_file(path: str | None, call: Callable[[], Any]) -> Any:
    """Run ``call``; when the fields came from ``path``, errors name the file."""
    try:
        return call()
    except DyntrainError as e:
        if path is None or str(path) in str(e):
            raise
        raise DyntrainError(f"{path}: {_one_line(e)}") from None


# ------------------------------------------------------------------------------ output


def _console():
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # piped or redirected: do not squeeze tables into 80 columns
        console = Console(highlight=False, width=200)
    return console


def _table(*columns: str):
    """A plain table; only the last column wraps when the terminal is narrow."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, col in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(col, no_wrap=not last, overflow="fold" if last else "ellipsis")
    return table


def _short(job_id: str) -> str:
    """The first 8 characters of a job id; an array child keeps its index."""
    parent, sep, index = job_id.partition(":")
    return (parent[:8] + sep + index) if len(parent) > 8 else job_id


def _when(ts: Any) -> str:
    if ts is None:
        return "-"
    try:
        return datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OSError, OverflowError):
        return str(ts)


def _workers_text(job: dict[str, Any]) -> str:
    cur = job.get("current_workers") or 0
    elastic = job.get("elastic") if isinstance(job.get("elastic"), dict) else job
    low, high = elastic.get("min_workers"), elastic.get("max_workers")
    if low is not None and high is not None:
        return f"{cur} ({low}-{high})"
    return str(cur)


def _reason_text(job: dict[str, Any]) -> str:
    waiting = job.get("waiting")
    if job.get("status") == "RUNNABLE" and isinstance(waiting, dict):
        pos = waiting.get("position")
        reason = waiting.get("reason") or ""
        return f"waiting: #{pos} {reason}".rstrip() if pos is not None else \
            f"waiting: {reason}".rstrip()
    return job.get("status_reason") or ""


def _items(answer: Any, *keys: str) -> list[Any]:
    """A list answer, or the list under one of ``keys`` of a mapping answer."""
    if isinstance(answer, list):
        return answer
    if isinstance(answer, dict):
        for key in keys:
            if isinstance(answer.get(key), list):
                return answer[key]
    return []


def _print_record(record: dict[str, Any], order: Iterable[str] = ()) -> None:
    """``key: value`` lines, ``order`` first; nested mappings indented."""
    keys = [k for k in order if k in record] + [k for k in record if k not in order]
    width = max((len(k) for k in keys), default=0)

    def show(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return " ".join(str(v) for v in value) if all(
                not isinstance(v, (dict, list)) for v in value) else str(value)
        return "-" if value is None else str(value)

    for key in keys:
        value = record[key]
        if key.endswith("_at") and isinstance(value, (int, float)):
            value = _when(value)
        if key == "trace" and isinstance(value, dict):  # a capacity trace: not its whole CSV
            rows = [ln for ln in str(value.get("csv", "")).splitlines()
                    if ln.split("#", 1)[0].strip()]
            value = (f"{max(0, len(rows) - 1)} rows{', looping' if value.get('loop') else ''}, "
                     f"started {_when(value.get('started_at'))}")
        if isinstance(value, dict) and value:
            click.echo(f"{key + ':':<{width + 1}}")
            for k, v in value.items():
                click.echo(f"  {k}: {show(v)}")
        else:
            click.echo(f"{key + ':':<{width + 1}} {show(value)}")


# ------------------------------------------------------------------------------ server


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise DyntrainError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise DyntrainError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(False)
    return sock


def _url_for(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@click.command()
@click.option("--state-dir", default=".dyntrain", show_default=True,
              type=click.Path(file_okay=False), help="Database, run folders and worker logs.")
@click.option("--db", "db_url", default=None,
              help="Database URL (sqlite:///... or postgresql+psycopg://...) "
                   "[default: sqlite in the state dir].")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --token.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int,
              help="Port to listen on (0: any free port).")
@click.option("--token", default=None, help="Token clients must send [default: $DYNTRAIN_TOKEN].")
@click.option("--grace-seconds", default=120.0, show_default=True, type=float,
              help="Seconds a preempted worker gets between SIGTERM and SIGKILL.")
def server(state_dir, db_url, host, port, token, grace_seconds):
    """Run the job service (REST API and scheduler) in the foreground; Ctrl-C stops it."""
    import uvicorn

    from dyntrain.service.api.app import create_app
    from dyntrain.service.server import Service, ServiceConfig

    if not 0 <= port <= 65535:
        raise DyntrainError(f"--port must be 0-65535, got {port}")
    if grace_seconds < 0:
        raise DyntrainError(f"--grace-seconds must be >= 0, got {grace_seconds}")
    token = token or os.environ.get("DYNTRAIN_TOKEN") or None
    config = ServiceConfig(Path(state_dir), db_url=db_url, host=host, port=port, token=token,
                           grace_seconds=grace_seconds)
    sock = _bind(host, port)
    config.port = sock.getsockname()[1]
    try:
        try:
            service = Service(config)
        except DyntrainError:
            raise
        except Exception as e:  # a bad --db URL, an unreadable state dir, ...
            raise DyntrainError(f"cannot start the service: {_one_line(e)[:300]}") from None
        try:
            app = create_app(service)
            userver = uvicorn.Server(uvicorn.Config(
                app, log_level="warning", access_log=False, timeout_graceful_shutdown=5))
            service.start()
            url = _url_for(host, config.port)
            click.echo(f"dyntrain service listening on {url} (state: {config.state_dir})")
            for note in service.recovered:
                click.echo(f"recovered: {note}")
            click.echo("Press Ctrl-C to stop.", err=True)
            _serve(userver, sock)
        finally:
            service.stop()
    finally:
        sock.close()
    click.echo("dyntrain service stopped")


def _serve(userver, sock: socket.socket) -> None:
    """Run uvicorn until SIGINT/SIGTERM; the signal stops it instead of killing the process."""
    if threading.current_thread() is not threading.main_thread():
        userver.run(sockets=[sock])
        return
    # uvicorn handles both signals while it serves and re-raises them once it has stopped;
    # these handlers catch the re-raised ones, so the service below still shuts down cleanly.
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: caught.append(s))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        userver.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------------------ jobs


def _resolve_job(client, ref: str) -> dict[str, Any]:
    """The job ``ref`` names: its id, or a unique prefix of one (as ``status`` shows them)."""
    from dyntrain.service.client import ApiError

    try:
        return client.get_job(ref)
    except ApiError as first:
        if first.status != 404:
            raise
        parent, sep, index = ref.partition(":")
        try:
            jobs = _items(client.list_jobs(limit=1000), "jobs", "items")
        except ApiError:
            raise first from None
        matches = [j for j in jobs if str(j.get("id", "")).startswith(parent)]
        if len(matches) == 1:
            return client.get_job(matches[0]["id"] + sep + index)
        if len(matches) > 1:
            some = ", ".join(j["id"] for j in matches[:3]) + (", ..." if len(matches) > 3 else "")
            raise DyntrainError(f"job id {ref!r} is ambiguous: {len(matches)} job ids start "
                                f"with it ({some})") from None
        raise


def _print_log_page(client, job_id: str, after: int) -> tuple[int, dict[str, Any]]:
    """Print the lines after ``after``; returns the seq to go on from and the page."""
    page = client.logs(job_id, after_seq=after)
    for line in page.get("lines") or []:
        click.echo(line.get("line", "") if isinstance(line, dict) else str(line))
    return int(page.get("last_seq", after)), page


def _print_log(client, job_id: str) -> None:
    after = 0
    while True:
        after, page = _print_log_page(client, job_id, after)
        if not page.get("lines"):
            return


def _follow(client, job_id: str, *, announce: bool) -> dict[str, Any]:
    """Print a job's log (and, with ``announce``, its status changes) until it ends."""
    after, shown = 0, None
    while True:
        after, page = _print_log_page(client, job_id, after)
        if announce and page.get("status") != (shown or {}).get("status"):
            job = client.get_job(job_id)
            reason = _reason_text(job)
            click.echo(f"[{_short(job_id)}] {job['status']}" + (f": {reason}" if reason else ""),
                       err=True)
            shown = job
        if page.get("done") and not page.get("lines"):
            return client.get_job(job_id)
        if not page.get("lines"):
            time.sleep(POLL_SECONDS)


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--queue", "-q", default="default", show_default=True, help="Job queue.")
@click.option("--name", "-n", default=None, help="Job name [default: the definition's].")
@click.option("--definition", "-d", default=None, metavar="NAME[:REV]",
              help="Job definition (latest revision unless :REV).")
@click.option("--workers", default=None, metavar="MIN:MAX",
              help="Run elastically with MIN to MAX workers.")
@click.option("--array", "array_size", type=int, default=None, metavar="N",
              help="An array job of N children.")
@click.option("--depends-on", multiple=True, metavar="ID[:TYPE]",
              help="Wait for another job (TYPE: STANDARD, N_TO_N, SEQUENTIAL); repeatable.")
@click.option("--retries", type=int, default=None, metavar="N", help="Attempts in all (1-10).")
@click.option("--timeout", type=float, default=None, metavar="S", help="Seconds per attempt.")
@click.option("--param", "params", multiple=True, metavar="K=V",
              help="A parameter for Ref::K in the command; repeatable.")
@click.option("--env", "envs", multiple=True, metavar="K=V",
              help="An environment variable; repeatable.")
@click.option("--cpus", type=float, default=None, help="CPUs per worker.")
@click.option("--gpus", type=int, default=None, help="GPUs per worker.")
@click.option("--memory", type=int, default=None, metavar="MiB", help="Memory per worker.")
@click.option("--wait", is_flag=True,
              help="Follow status and logs until the job ends; exit 1 if it failed.")
@_conn_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_friendly
def submit(queue, name, definition, workers, array_size, depends_on, retries, timeout,
           params, envs, cpus, gpus, memory, wait, url, token, command):
    """Submit a job: a COMMAND (after --), or a job definition; prints the job id.

    \b
    dyntrain submit -- python train.py --epochs 3
    dyntrain submit --definition train:2 --workers 1:4 --param epochs=3 --wait
    """
    body: dict[str, Any] = {"queue": queue}
    if not command and definition is None:
        raise click.UsageError("submit needs a COMMAND (after --) or --definition")
    if definition is not None:
        body["definition"] = definition
    if command:
        body["command"] = list(command)
    if name is not None:
        body["name"] = name
    if workers is not None:
        body["workers"] = _parse_workers(workers)
    if array_size is not None:
        body["array_size"] = array_size
    if retries is not None:
        body["retry_attempts"] = retries
    if timeout is not None:
        body["timeout_seconds"] = timeout
    if params:
        body["parameters"] = _parse_kv(params, "--param")
    if envs:
        body["environment"] = _parse_kv(envs, "--env")
    res = _resources(cpus, gpus, memory)
    deps = [_parse_dependency(d) for d in depends_on]
    client = _client(url, token)
    if res and definition is not None and len(res) < 3:
        # what is not given comes from the definition, not from the service's defaults
        dname, _, drev = definition.partition(":")
        if drev and not drev.isdigit():
            raise DyntrainError(f"--definition {definition!r}: revision must be a number")
        spec = client.get_job_definition(dname, int(drev) if drev else None)
        res = {**(spec.get("resources") or {}), **res}
    if res:
        body["resources"] = res
    for dep in deps:
        parent, sep, index = dep["job_id"].partition(":")
        dep["job_id"] = _resolve_job(client, parent)["id"] + sep + index
    if deps:
        body["depends_on"] = deps
    job = client.submit(**body)
    click.echo(job["id"])
    if not wait:
        return
    final = _follow(client, job["id"], announce=True)
    sys.exit(0 if final["status"] == "SUCCEEDED" else 1)


def _jobs_table(jobs: list[dict[str, Any]]):
    table = _table("ID", "NAME", "QUEUE", "STATUS", "WORKERS", "REASON")
    for job in jobs:
        table.add_row(_short(str(job.get("id", ""))), str(job.get("name", "")),
                      str(job.get("queue", "")), str(job.get("status", "")),
                      _workers_text(job), _reason_text(job))
    return table


def _job_cost_lines(answer: Any) -> list[str] | None:
    """``format_cost`` of a ``cost`` answer; None when it is not a full cost record."""
    from dyntrain.service.cost import JobCost, StaticBaseline, format_cost
    from dyntrain.service.model import CapacityType

    if not isinstance(answer, dict):
        return None
    if isinstance(answer.get("lines"), list):
        return [str(x) for x in answer["lines"]]
    data = answer.get("cost", answer) if isinstance(answer.get("cost"), dict) else answer
    try:
        base = data["static_on_demand"]
        cost = JobCost(
            total=float(data["total"]),
            worker_seconds=float(data["worker_seconds"]),
            cost_by_compute_environment=dict(data["cost_by_compute_environment"]),
            cost_by_capacity_type={CapacityType(k): float(v)
                                   for k, v in data["cost_by_capacity_type"].items()},
            worker_seconds_by_compute_environment=dict(
                data["worker_seconds_by_compute_environment"]),
            worker_seconds_by_capacity_type={
                CapacityType(k): float(v)
                for k, v in data["worker_seconds_by_capacity_type"].items()},
            wasted_worker_seconds=float(data["wasted_worker_seconds"]),
            wasted_cost=float(data["wasted_cost"]),
            wall_seconds=float(data["wall_seconds"]),
            static_on_demand=StaticBaseline(int(base["workers"]),
                                            float(base["price_per_slot_hour"]),
                                            float(base["wall_seconds"]), float(base["cost"])),
            saving_percent=None if data.get("saving_percent") is None
            else float(data["saving_percent"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return format_cost(cost)


def _job_details(client, job: dict[str, Any]) -> list[str]:
    lines = [f"job:          {job.get('id')}",
             f"name:         {job.get('name')}",
             f"queue:        {job.get('queue')}",
             f"status:       {job.get('status')}"]
    reason = _reason_text(job)
    if reason:
        lines.append(f"reason:       {reason}")
    lines += [f"attempts:     {job.get('attempts', 0)}",
              f"preemptions:  {job.get('preemptions', 0)}",
              f"workers:      {_workers_text(job)}"]
    for w in job.get("workers") or []:
        if isinstance(w, dict):
            leaving = f", leaving: {w['leave_reason']}" if w.get("leave_reason") else ""
            lines.append(f"  {w.get('id')}  {w.get('state')} on {w.get('compute_environment')} "
                         f"({w.get('capacity_type')}, {w.get('price_per_slot_hour')}/slot-h)"
                         f"{leaving}")
    array = job.get("array")
    if isinstance(array, dict):
        counts = array.get("status_counts") or {}
        lines.append(f"array:        {array.get('size', job.get('array_size'))} children: "
                     + (", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none yet"))
    elif job.get("array_index") is not None:
        lines.append(f"array child:  {job['array_index']} of {job.get('array_parent_id')}")
    deps = job.get("depends_on") or []
    if deps:
        lines.append("depends on:   " + ", ".join(
            f"{_short(str(d.get('job_id')))} ({d.get('type', 'STANDARD')})"
            if isinstance(d, dict) else str(d) for d in deps))
    lines += [f"created:      {_when(job.get('created_at'))}",
              f"started:      {_when(job.get('started_at'))}",
              f"stopped:      {_when(job.get('stopped_at'))}"]
    cost_lines = _job_cost_lines(client.cost(job["id"]))
    if cost_lines:
        lines += ["", "cost", *cost_lines]
    return lines


@click.command()
@click.argument("job", required=False)
@click.option("--queue", "-q", default=None, help="Only this queue's jobs.")
@click.option("--status", "-s", "status_filter", default=None,
              type=click.Choice(JOB_STATUSES, case_sensitive=False),
              help="Only jobs in this status.")
@click.option("--watch", "-w", is_flag=True, help="Refresh every second (Ctrl-C to stop).")
@_conn_options
@_friendly
def status(job, queue, status_filter, watch, url, token):
    """A table of jobs, or JOB's details (status, workers, attempts, cost)."""
    client = _client(url, token)
    console = _console()
    if job is not None:
        job_id = _resolve_job(client, job)["id"]

        def render():
            from rich.text import Text

            current = client.get_job(job_id)
            return Text("\n".join(_job_details(client, current))), current
    else:
        filters: dict[str, Any] = {}
        if queue:
            filters["queue"] = queue
        if status_filter:
            filters["status"] = status_filter.upper()

        def render():
            jobs = _items(client.list_jobs(**filters), "jobs", "items")
            if not jobs:
                from rich.text import Text

                return Text("no jobs"), None
            return _jobs_table(jobs), None

    if not watch:
        console.print(render()[0])
        return
    from rich.live import Live

    try:
        with Live(render()[0], console=console, auto_refresh=False) as live:
            while True:
                time.sleep(1.0)
                renderable, current = render()
                live.update(renderable, refresh=True)
                if current is not None and current.get("status") in TERMINAL:
                    break
    except KeyboardInterrupt:
        pass
    if not console.is_terminal:
        console.line()  # Live ends a redirected render without a newline


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
@click.argument("job")
@_conn_options
@_friendly
def logs(follow, job, url, token):
    """Print JOB's log."""
    client = _client(url, token)
    job_id = _resolve_job(client, job)["id"]
    if follow:
        _follow(client, job_id, announce=False)
    else:
        _print_log(client, job_id)


@click.command()
@click.argument("job")
@_conn_options
@_friendly
def cancel(job, url, token):
    """Cancel JOB before it starts (SUBMITTED, PENDING or RUNNABLE)."""
    client = _client(url, token)
    job_id = _resolve_job(client, job)["id"]
    answer = client.cancel(job_id)
    _report_stop("cancelled", job_id, answer)


@click.command()
@click.argument("job")
@_conn_options
@_friendly
def terminate(job, url, token):
    """Stop JOB, running or not; it ends FAILED."""
    client = _client(url, token)
    job_id = _resolve_job(client, job)["id"]
    answer = client.terminate(job_id)
    _report_stop("terminated", job_id, answer)


def _report_stop(verb: str, job_id: str, answer: Any) -> None:
    status = answer.get("status") if isinstance(answer, dict) else None
    click.echo(f"{verb} {job_id}" + (f" ({status})" if status else ""))


# ------------------------------------------------------------------------------ ce


@click.group("ce")
@_conn_options
@click.pass_context
def ce(ctx, url, token):
    """Compute environments: pools of worker slots."""
    _remember_conn(ctx, url, token)


def _ce_table(envs: list[dict[str, Any]]):
    table = _table("NAME", "TYPE", "PRICE/SLOT-H", "SLOT", "MIN:DESIRED:MAX", "AVAILABLE",
                   "IN USE", "STATE", "STATUS")
    for env in envs:
        slot = env.get("slot") or {}
        status = str(env.get("status") or "")
        if env.get("status_reason"):
            status += f" ({env['status_reason']})"
        table.add_row(
            str(env.get("name", "")), str(env.get("capacity_type", "")),
            f"{float(env.get('price_per_slot_hour') or 0):.4g}",
            f"{slot.get('cpus', '?')} cpu, {slot.get('gpus', 0)} gpu, "
            f"{slot.get('memory_mib', '?')} MiB",
            f"{env.get('min_slots')}:{env.get('desired_slots')}:{env.get('max_slots')}",
            f"{env.get('available_slots', '-')}{' (trace)' if env.get('trace') else ''}",
            str(env.get("slots_in_use", "-")), str(env.get("state", "")), status)
    return table


def _slot_fields(cpus, gpus, memory) -> dict[str, Any]:
    return _resources(cpus, gpus, memory)


@ce.command("create")
@click.argument("name", required=False)
@click.option("-f", "--file", "path", default=None, metavar="FILE.yaml",
              help="Fields of the environment (flags override them).")
@click.option("--type", "capacity_type", default=None,
              type=click.Choice(CAPACITY_TYPES, case_sensitive=False),
              help="Capacity type [default: ON_DEMAND].")
@click.option("--price", type=float, default=None, help="Price per slot-hour.")
@click.option("--slots", default=None, metavar="MIN:DESIRED:MAX", help="Slot counts.")
@click.option("--slot-cpus", type=float, default=None, help="CPUs of one slot.")
@click.option("--slot-gpus", type=int, default=None, help="GPUs of one slot.")
@click.option("--slot-memory", type=int, default=None, metavar="MiB", help="Memory of one slot.")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@_conn_options
@_friendly
def ce_create(name, path, capacity_type, price, slots, slot_cpus, slot_gpus, slot_memory, state,
              url, token):
    """Create compute environment NAME from flags or -f FILE.yaml."""
    body = _load_yaml(path) if path else {}
    if name:
        body["name"] = name
    if not body.get("name"):
        raise click.UsageError("ce create needs a NAME (or a name in -f FILE)")
    if capacity_type:
        body["capacity_type"] = capacity_type.upper()
    if price is not None:
        body["price_per_slot_hour"] = price
    if slots is not None:
        body["min_slots"], body["desired_slots"], body["max_slots"] = _parse_slots(slots)
    slot = _slot_fields(slot_cpus, slot_gpus, slot_memory)
    if slot:
        base = body.get("slot") if isinstance(body.get("slot"), dict) else {}
        body["slot"] = {**base, **slot}
    if state:
        body["state"] = state.upper()
    client = _client(url, token)
    env = _from_file(path, lambda: client.create_compute_environment(**body))
    click.echo(f"created compute environment {env.get('name', body['name'])}"
               if isinstance(env, dict) else f"created compute environment {body['name']}")


@ce.command("list")
@_conn_options
@_friendly
def ce_list(url, token):
    """List compute environments."""
    envs = _items(_client(url, token).list_compute_environments(), "compute_environments",
                  "items")
    _console().print(_ce_table(envs) if envs else "no compute environments")


@ce.command("show")
@click.argument("name")
@_conn_options
@_friendly
def ce_show(name, url, token):
    """Show compute environment NAME."""
    _print_record(_client(url, token).get_compute_environment(name),
                  ("name", "capacity_type", "price_per_slot_hour", "slot", "min_slots",
                   "desired_slots", "max_slots", "state", "status", "status_reason"))


@ce.command("update")
@click.argument("name")
@click.option("--min", "min_slots", type=int, default=None, help="Minimum slots.")
@click.option("--desired", type=int, default=None, help="Desired slots.")
@click.option("--max", "max_slots", type=int, default=None, help="Maximum slots.")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@click.option("--price", type=float, default=None, help="Price per slot-hour.")
@_conn_options
@_friendly
def ce_update(name, min_slots, desired, max_slots, state, price, url, token):
    """Change compute environment NAME's capacity, state or price (takes effect now)."""
    fields: dict[str, Any] = {}
    if min_slots is not None:
        fields["min_slots"] = min_slots
    if desired is not None:
        fields["desired_slots"] = desired
    if max_slots is not None:
        fields["max_slots"] = max_slots
    if state:
        fields["state"] = state.upper()
    if price is not None:
        fields["price_per_slot_hour"] = price
    if not fields:
        raise click.UsageError("ce update needs at least one of --min, --desired, --max, "
                               "--state, --price")
    _client(url, token).update_compute_environment(name, **fields)
    click.echo(f"updated compute environment {name}")


@ce.command("delete")
@click.argument("name")
@_conn_options
@_friendly
def ce_delete(name, url, token):
    """Delete compute environment NAME (no queue may use it)."""
    _client(url, token).delete_compute_environment(name)
    click.echo(f"deleted compute environment {name}")


@ce.command("trace")
@click.argument("name")
@click.argument("csv_file", required=False, metavar="FILE.csv")
@click.option("--loop", is_flag=True, help="Repeat the trace when it ends.")
@click.option("--clear", is_flag=True, help="Stop replaying a trace.")
@_conn_options
@_friendly
def ce_trace(name, csv_file, loop, clear, url, token):
    """Replay FILE.csv as NAME's capacity from now (offset_s,slots[,price]), or --clear it."""
    from dyntrain.service.capacity import load_trace

    if clear:
        if csv_file or loop:
            raise click.UsageError("ce trace --clear takes no FILE and no --loop")
        _client(url, token).clear_capacity_trace(name)
        click.echo(f"cleared the capacity trace of {name}")
        return
    if not csv_file:
        raise click.UsageError("ce trace needs a FILE.csv (or --clear)")
    trace = load_trace(csv_file, loop=loop)  # errors name the file and line
    text = Path(csv_file).read_text()
    client = _client(url, token)
    _from_file(csv_file, lambda: client.set_capacity_trace(name, text, loop=loop))
    click.echo(f"replaying {csv_file} on {name}: {len(trace.rows)} rows over "
               f"{trace.duration:g} s{' (looping)' if loop else ''}")


# ------------------------------------------------------------------------------ queue


@click.group("queue")
@_conn_options
@click.pass_context
def queue(ctx, url, token):
    """Job queues: a priority over an ordered list of compute environments."""
    _remember_conn(ctx, url, token)


@queue.command("create")
@click.argument("name", required=False)
@click.option("-f", "--file", "path", default=None, metavar="FILE.yaml",
              help="Fields of the queue (flags override them).")
@click.option("--priority", type=int, default=None, help="Higher runs first [default: 1].")
@click.option("--ce", "envs", default=None, metavar="A,B",
              help="Compute environments, in order of preference.")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@_conn_options
@_friendly
def queue_create(name, path, priority, envs, state, url, token):
    """Create job queue NAME from flags or -f FILE.yaml."""
    body = _load_yaml(path) if path else {}
    if name:
        body["name"] = name
    if not body.get("name"):
        raise click.UsageError("queue create needs a NAME (or a name in -f FILE)")
    if priority is not None:
        body["priority"] = priority
    if envs is not None:
        body["compute_environments"] = _split_names(envs, "--ce")
    if state:
        body["state"] = state.upper()
    if not path and "compute_environments" not in body:
        raise click.UsageError("queue create needs --ce A[,B...]")
    client = _client(url, token)
    _from_file(path, lambda: client.create_job_queue(**body))
    click.echo(f"created job queue {body['name']}")


@queue.command("list")
@_conn_options
@_friendly
def queue_list(url, token):
    """List job queues."""
    queues = _items(_client(url, token).list_job_queues(), "job_queues", "queues", "items")
    if not queues:
        _console().print("no job queues")
        return
    table = _table("NAME", "PRIORITY", "COMPUTE ENVIRONMENTS", "STATE")
    for q in queues:
        table.add_row(str(q.get("name", "")), str(q.get("priority", "")),
                      ",".join(q.get("compute_environments") or []), str(q.get("state", "")))
    _console().print(table)


@queue.command("update")
@click.argument("name")
@click.option("--priority", type=int, default=None)
@click.option("--ce", "envs", default=None, metavar="A,B")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@_conn_options
@_friendly
def queue_update(name, priority, envs, state, url, token):
    """Change job queue NAME's priority, environments or state."""
    fields: dict[str, Any] = {}
    if priority is not None:
        fields["priority"] = priority
    if envs is not None:
        fields["compute_environments"] = _split_names(envs, "--ce")
    if state:
        fields["state"] = state.upper()
    if not fields:
        raise click.UsageError("queue update needs at least one of --priority, --ce, --state")
    _client(url, token).update_job_queue(name, **fields)
    click.echo(f"updated job queue {name}")


@queue.command("delete")
@click.argument("name")
@_conn_options
@_friendly
def queue_delete(name, url, token):
    """Delete job queue NAME."""
    _client(url, token).delete_job_queue(name)
    click.echo(f"deleted job queue {name}")


# ------------------------------------------------------------------------------ jobdef


@click.group("jobdef")
@_conn_options
@click.pass_context
def jobdef(ctx, url, token):
    """Job definitions: named, revisioned job templates."""
    _remember_conn(ctx, url, token)


@jobdef.command("register")
@click.argument("name", required=False)
@click.option("-f", "--file", "path", default=None, metavar="FILE.yaml",
              help="Fields of the definition (flags override them).")
@click.option("--workers", default=None, metavar="MIN:MAX", help="Elastic between MIN and MAX.")
@click.option("--retries", type=int, default=None, metavar="N", help="Attempts in all (1-10).")
@click.option("--timeout", type=float, default=None, metavar="S", help="Seconds per attempt.")
@click.option("--param", "params", multiple=True, metavar="K=V", help="Default of Ref::K.")
@click.option("--env", "envs", multiple=True, metavar="K=V", help="Environment variable.")
@click.option("--cpus", type=float, default=None, help="CPUs per worker.")
@click.option("--gpus", type=int, default=None, help="GPUs per worker.")
@click.option("--memory", type=int, default=None, metavar="MiB", help="Memory per worker.")
@_conn_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_friendly
def jobdef_register(name, path, workers, retries, timeout, params, envs, cpus, gpus, memory,
                    url, token, command):
    """Register job definition NAME (a new revision if it exists) from flags or -f FILE.yaml.

    \b
    dyntrain jobdef register train --workers 1:4 --param epochs=3 -- python t.py Ref::epochs
    """
    body = _load_yaml(path) if path else {}
    if name:
        body["name"] = name
    if not body.get("name"):
        raise click.UsageError("jobdef register needs a NAME (or a name in -f FILE)")
    if command:
        body["command"] = list(command)
    if "command" not in body:
        raise click.UsageError("jobdef register needs a COMMAND (after --) or -f FILE")
    if workers is not None:
        w = _parse_workers(workers)
        body["elastic"] = {"min_workers": w["min"], "max_workers": w["max"]}
    if retries is not None:
        base = body.get("retry_strategy") if isinstance(body.get("retry_strategy"), dict) else {}
        body["retry_strategy"] = {**base, "attempts": retries}
    if timeout is not None:
        body["timeout_seconds"] = timeout
    if params:
        base = body.get("parameters") if isinstance(body.get("parameters"), dict) else {}
        body["parameters"] = {**base, **_parse_kv(params, "--param")}
    if envs:
        base = body.get("environment") if isinstance(body.get("environment"), dict) else {}
        body["environment"] = {**base, **_parse_kv(envs, "--env")}
    res = _resources(cpus, gpus, memory)
    if res:
        base = body.get("resources") if isinstance(body.get("resources"), dict) else {}
        body["resources"] = {**base, **res}
    client = _client(url, token)
    answer = _from_file(path, lambda: client.register_job_definition(**body))
    rev = answer.get("revision") if isinstance(answer, dict) else None
    click.echo(f"registered job definition {body['name']}" + (f":{rev}" if rev else ""))


@jobdef.command("list")
@_conn_options
@_friendly
def jobdef_list(url, token):
    """List job definitions."""
    defs = _items(_client(url, token).list_job_definitions(), "job_definitions", "definitions",
                  "items")
    if not defs:
        _console().print("no job definitions")
        return
    table = _table("NAME", "REV", "STATUS", "WORKERS", "COMMAND")
    for d in defs:
        elastic = d.get("elastic") or {}
        workers = f"{elastic.get('min_workers')}-{elastic.get('max_workers')}" \
            if elastic else "1"
        table.add_row(str(d.get("name", "")), str(d.get("revision", "")),
                      str(d.get("status", "")), workers, " ".join(d.get("command") or []))
    _console().print(table)


@jobdef.command("show")
@click.argument("ref", metavar="NAME[:REV]")
@_conn_options
@_friendly
def jobdef_show(ref, url, token):
    """Show job definition NAME (its latest revision, or REV)."""
    name, _, rev = ref.partition(":")
    if rev and not rev.isdigit():
        raise DyntrainError(f"job definition {ref!r}: revision must be a number")
    answer = _client(url, token).get_job_definition(name, int(rev) if rev else None)
    _print_record(answer, ("name", "revision", "status", "command", "environment",
                           "parameters", "resources", "retry_strategy", "timeout_seconds",
                           "elastic"))


COMMANDS = (server, submit, status, logs, cancel, terminate, ce, queue, jobdef)
