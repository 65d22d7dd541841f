"""Helpers for end-to-end tests: run the real CLI in real processes."""

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from dyntrain.elastic.runs.log import read_records
from dyntrain.testing.jobs import pinned_env
from dyntrain.testing.wait import wait_until

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
DYNTRAIN = [sys.executable, "-m", "dyntrain.cli.main"]

# Tests press Ctrl-C on the commands they start (SIGINT). A suite started in the background by a
# non-interactive shell (`nohup make test &`, some CI runners) inherits SIGINT ignored, and an
# ignored signal stays ignored in every child: those commands would never see their Ctrl-C.
# Give the suite the disposition of a terminal's foreground, which its children then inherit.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _file_seconds() -> dict[str, float]:
    """``tests/durations.txt``: seconds per test file in a recent run (tests/tools/durations.py)."""
    table = Path(__file__).resolve().parent / "durations.txt"
    rows = (line.split() for line in table.read_text().splitlines() if not line.startswith("#"))
    return {name: float(seconds) for seconds, name in rows}


def pytest_collection_modifyitems(config, items):
    """The heaviest files first (``make test`` hands whole files to its processes in this order,
    ``--no-loadscope-reorder``): a long file that started last would leave the other process
    idle. A file the table does not know yet goes last; the tests of a file keep their order."""
    seconds = _file_seconds()
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))


def run_cli(args, timeout=240, check=False, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([*DYNTRAIN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=kw.pop("cwd", ROOT), **kw)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def run_main(args) -> subprocess.CompletedProcess:
    """``dyntrain ARGS`` through the CLI's entry point in this process (no interpreter to start):
    its exit status and what it printed, as ``run_cli`` gives them. For commands that start no
    processes and change nothing in this one (bad input, ``compare``, service commands)."""
    from dyntrain.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_held(log: Path, args, hold: Path, until, what: str,
             timeout: float = 240) -> subprocess.CompletedProcess:
    """``dyntrain run ARGS`` whose workload is held slow while the file ``hold`` exists (the
    test scripts' ``--slow-while``, ``gpt_held.py``): held until ``until()`` (``what``) or the
    launcher's end, then let run to its end at full speed. Its output is written to ``log``;
    returns it (stdout) and the exit status."""
    hold.touch()
    with open(log, "w") as out:
        launcher = subprocess.Popen([*DYNTRAIN, "run", *map(str, args)], stdout=out,
                                    stderr=subprocess.STDOUT, cwd=ROOT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: launcher.poll() is not None or until(), what, timeout)
        hold.unlink()
        code = launcher.wait(timeout=timeout)
    finally:
        hold.unlink(missing_ok=True)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return subprocess.CompletedProcess(launcher.args, code, log.read_text(), "")


def start_server(state_dir: Path, log: Path, *args: str, popen=subprocess.Popen,
                 env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`dyntrain server --port 0 ... ARGS`; returns the process and the URL it printed.
    ``popen``: how to start it (a bed host's ``Host.popen`` runs it on that host); ``env``: its
    environment (default: this one)."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    env.pop("DYNTRAIN_URL", None)
    env.pop("DYNTRAIN_TOKEN", None)
    with open(log, "w") as out:
        proc = popen([*DYNTRAIN, "server", "--port", "0", "--state-dir", str(state_dir),
                      "--grace-seconds", "2", *args], stdout=out, stderr=subprocess.STDOUT,
                     env=env, cwd=ROOT)
    return proc, server_url(proc, log)


def server_url(proc: subprocess.Popen, log: Path, timeout: float = 120) -> str:
    """The URL a starting ``dyntrain server`` (``proc``, its output in ``log``) printed, once
    it answers there (a loaded machine is slow; ``--executor ray`` connects to a cluster)."""

    def url() -> str | None:
        m = re.search(r"listening on (http://\S+)", log.read_text())
        try:
            if m and httpx.get(f"{m.group(1)}/health", timeout=2).status_code == 200:
                return m.group(1)
        except httpx.HTTPError:
            pass
        return None

    try:
        return wait_until(url, "the server to answer", timeout, 0.1, unless=lambda: (
            proc.poll() is not None and f"it exited with {proc.returncode}"))
    except TimeoutError as exc:
        proc.kill()
        raise AssertionError(f"{exc}\n{log.read_text()[-3000:]}") from None


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a line file, read as the product reads its run files
    (``dyntrain.elastic.runs.log``): a line still being written waits, a bad line fails."""
    return [record.data for record in read_records(path.parent, path.name).records]


@pytest.fixture
def ledger_script() -> Path:
    return SCRIPTS / "ledger_train.py"


@pytest.fixture(scope="session")
def static_ledger(tmp_path_factory) -> Path:
    """The ledger workload trained alone (``static_run``): its final.pt is what every elastic
    ledger run with the default settings must end with, bit for bit."""
    return shared_static_run(tmp_path_factory, "ledger", SCRIPTS / "ledger_train.py")


def shared_static_run(tmp_path_factory, name: str, *command) -> Path:
    """``static_run`` of ``COMMAND`` made once per test session, in a folder ``name`` that every
    test process of the session reads (``make test``'s pytest-xdist processes share their base
    temporary folder): the first to ask makes it, under a file lock, the others wait for it.
    Its users only read it. The same ``name`` must always mean the same command."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each process's own
    out, made = root / f"static-{name}", root / f"static-{name}.made"
    with FileLock(root / f"static-{name}.lock"):
        if not made.exists():
            shutil.rmtree(out, ignore_errors=True)  # what a failed attempt left
            static_run(out, *command)
            made.write_text(" ".join(map(str, command)))
        assert made.read_text() == " ".join(map(str, command)), \
            f"static reference {name!r} asked for with two commands"
    return out


def static_run(out: Path, *command, timeout: float = 300) -> Path:
    """The static reference of a job into ``out``: ``COMMAND`` (a script and its arguments, or
    ``-m MODULE ...``) trained alone by plain ``python`` (no coordinator) with a job's default
    numerics (``pinned_env``), as every job pins them."""
    env = pinned_env(DYNTRAIN_OUT=str(out))
    env.pop("DYNTRAIN_COORDINATOR", None)
    proc = subprocess.run([sys.executable, *map(str, command)], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


class OutputLines:
    """Collects a process's stdout lines in a thread, to wait on them (``has``)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def has(self, prefix: str) -> str | None:
        """The first line starting with ``prefix`` (None yet)."""
        return next((line for line in self.lines if line.startswith(prefix)), None)


@pytest.fixture(scope="module")
def hostbed(request):
    """A bed of hosts (``dyntrain.testing.hosts``) shared by a test module: as many as the
    module's ``HOSTS`` (default 3). Skipped with the reason where namespaces cannot be made."""
    from dyntrain.testing.hosts import HostBed, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with HostBed(getattr(request.module, "HOSTS", 3)) as bed:
        yield bed


@pytest.fixture
def hosts(hostbed):
    """The module's bed, with every fault undone and every process ended after the test."""
    yield hostbed
    hostbed.reset()
