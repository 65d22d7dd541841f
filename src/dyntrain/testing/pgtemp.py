"""A throw-away PostgreSQL server for tests and benchmarks.

``start_postgres()`` runs ``initdb`` into a fresh directory, starts ``postgres`` on a free port of
127.0.0.1 (trust authentication, ``fsync=off`` unless asked otherwise) and returns its URL and a
``stop`` function that shuts it down (``pg_ctl stop -m immediate``) and removes the directory.

PostgreSQL refuses to run as root. As root, the server runs as an unprivileged user (``postgres``
if it exists, else ``nobody``; ``DYNTRAIN_PG_USER`` overrides) in a directory of its own under the
system temp dir, chowned to that user, because a caller's temp dir (pytest's is 0700) may not be
reachable by it. As any other user, the binaries run directly.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from dyntrain.errors import DyntrainError

_KNOWN_BIN_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin",
                    "/opt/homebrew/opt/postgresql*/bin", "/usr/local/opt/postgresql*/bin")


class PostgresUnavailable(DyntrainError):
    """No PostgreSQL binaries, or no way to run them (root without an unprivileged user)."""


class PostgresStartError(DyntrainError, RuntimeError):
    """The binaries are there but initdb or the server failed; the message has the log's tail."""


class TempPostgres(NamedTuple):
    url: str  # postgresql+psycopg://postgres@127.0.0.1:PORT/postgres
    stop: Callable[[], None]


def find_pg_bin() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    env = os.environ.get("DYNTRAIN_PG_BIN")
    candidates: list[Path] = [Path(env)] if env else []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(os.path.realpath(found)).parent)
        candidates.append(Path(found).parent)
    for pattern in _KNOWN_BIN_GLOBS:
        # newest version first: /usr/lib/postgresql/16/bin before .../15/bin
        candidates.extend(Path(p) for p in sorted(glob.glob(pattern), key=_version_key,
                                                  reverse=True))
    for cand in candidates:
        if all(os.access(cand / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return cand
    return None


def _version_key(path: str) -> tuple:
    return tuple(int(part) if part.isdigit() else 0
                 for part in path.replace("-", "/").split("/"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> pwd.struct_passwd | None:
    """The user to run PostgreSQL as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    names = [os.environ["DYNTRAIN_PG_USER"]] if os.environ.get("DYNTRAIN_PG_USER") else []
    names += ["postgres", "nobody"]
    for name in names:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            return entry
    raise PostgresUnavailable("running as root and no unprivileged user (postgres, nobody) exists "
                              "to run PostgreSQL as; set DYNTRAIN_PG_USER")


def start_postgres(tmpdir: str | os.PathLike | None = None, *, fsync: bool = False,
                   timeout: float = 60.0, address: str = "127.0.0.1") -> TempPostgres:
    """Start a throw-away server; returns ``(url, stop)``.

    ``address``: where it listens besides 127.0.0.1 (and the URL's host): a host bed's gateway
    lets the bed's hosts reach it; clients of the networks it is on are trusted.

    Raises ``PostgresUnavailable`` when it cannot be tried, ``PostgresStartError`` when it fails.
    """
    bindir = find_pg_bin()
    if bindir is None:
        raise PostgresUnavailable("PostgreSQL binaries (initdb, pg_ctl, postgres) not found on "
                                  "PATH or in /usr/lib/postgresql/*/bin; set DYNTRAIN_PG_BIN")
    user = _run_as()
    if user is not None or tmpdir is None:
        # as root: a directory of our own that the unprivileged user can reach
        base = Path(tempfile.mkdtemp(prefix="dyntrain-pg-"))
        owned = True
    else:
        base = Path(tmpdir) / "postgres"
        base.mkdir(parents=True, exist_ok=False)
        owned = False
    if user is not None:
        os.chown(base, user.pw_uid, user.pw_gid)
    data, sock, log = base / "data", base / "sock", base / "server.log"

    def run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
        kw = {}
        if user is not None:
            kw = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        env = {"PATH": f"{bindir}:/usr/bin:/bin", "LC_ALL": "C", "LANG": "C", "TZ": "UTC",
               "HOME": str(base)}
        proc = subprocess.run(args, cwd=base, env=env, capture_output=True, text=True,
                              timeout=timeout, **kw)
        if check and proc.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise PostgresStartError(f"{Path(args[0]).name} failed ({proc.returncode}): "
                                      f"{(proc.stderr or proc.stdout).strip()[-2000:]}\n{tail}")
        return proc

    def cleanup() -> None:
        if owned:
            shutil.rmtree(base, ignore_errors=True)
        else:
            shutil.rmtree(data, ignore_errors=True)

    try:
        os.makedirs(sock, exist_ok=True)
        if user is not None:
            os.chown(sock, user.pw_uid, user.pw_gid)
        run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--no-sync"])
        listen = "127.0.0.1" if address == "127.0.0.1" else f"127.0.0.1,{address}"
        if address != "127.0.0.1":
            with open(data / "pg_hba.conf", "a") as hba:
                hba.write("host all all samenet trust\n")
        port = None
        for _ in range(5):  # another process may grab the free port before postgres does
            port = _free_port()
            opts = (f"-p {port} -k {sock} -c listen_addresses={listen} "
                    f"-c fsync={'on' if fsync else 'off'} -c max_connections=200")
            if not fsync:
                opts += " -c synchronous_commit=off -c full_page_writes=off"
            proc = run([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(log),
                        "start", "-w", "-t", str(int(timeout))], check=False)
            if proc.returncode == 0:
                break
            text = log.read_text(errors="replace") if log.exists() else ""
            if "could not bind" not in text and "already in use" not in text:
                raise PostgresStartError(f"pg_ctl start failed: {proc.stderr.strip()}\n"
                                          f"{text[-2000:]}")
        else:
            raise PostgresStartError("pg_ctl start failed: no free port after 5 tries")
    except BaseException:
        cleanup()
        raise

    stopped = False

    def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        try:
            run([str(bindir / "pg_ctl"), "-D", str(data), "stop", "-m", "immediate", "-w"],
                check=False)
        finally:
            cleanup()
            atexit.unregister(stop)

    atexit.register(stop)  # a safety net; callers should call stop() themselves
    return TempPostgres(f"postgresql+psycopg://postgres@{address}:{port}/postgres", stop)


def _admin(server_url: str, sql: str) -> None:
    import psycopg  # imported here: only the PostgreSQL paths need it

    dsn = server_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql)


def create_database(server_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``server_url``; returns its URL."""
    _admin(server_url, f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + "/" + name


def drop_database(server_url: str, name: str) -> None:
    """Drop database ``name``, closing any session still connected to it."""
    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

