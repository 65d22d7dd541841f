"""Shared helpers for the benchmarks: free ports, process trees, JSONL tails, statistics."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from dyntrain.elastic.runs.log import read_records
from dyntrain.procstat import all_pids, read_stat


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ppid_map() -> dict[int, int]:
    """pid -> parent pid for every process we can see (from /proc)."""
    return {pid: stat.ppid for pid in all_pids() if (stat := read_stat(pid)) is not None}


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first), from a /proc snapshot."""
    children: dict[int, list[int]] = {}
    for child, parent in _ppid_map().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and not stat.state.ended


def kill_pids(pids, sig: int = signal.SIGKILL) -> None:
    """Signal each pid and, where it leads one, its process group (workers often setsid)."""
    for pid in pids:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(proc: subprocess.Popen, grace: float = 0.0, extra: set[int] | None = None) -> None:
    """End ``proc`` and everything below it (and ``extra`` pids); SIGTERM first if grace > 0."""
    pids = set(descendants(proc.pid)) | {proc.pid} | set(extra or ())
    if grace > 0 and proc.poll() is None:
        kill_pids([proc.pid], signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        pids |= set(descendants(proc.pid)) if proc.poll() is None else set()
    kill_pids(sorted(pids, reverse=True), signal.SIGKILL)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


class LineReader:
    """Reads a process's stdout in a thread and timestamps every line on arrival."""

    def __init__(self, stream, echo_to: Path | None = None) -> None:
        self.lines: list[tuple[float, str]] = []
        self._echo = open(echo_to, "a") if echo_to else None
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream) -> None:
        for raw in iter(stream.readline, ""):
            self.lines.append((time.time(), raw.rstrip("\n")))
            if self._echo:
                self._echo.write(raw)
                self._echo.flush()
        if self._echo:
            self._echo.close()

    def join(self, timeout: float = 2.0) -> None:
        self._thread.join(timeout)


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a line file (none when there is none), read as dyntrain reads its
    run files (``dyntrain.elastic.runs.log``: a line still being written waits)."""
    return [record.data for record in read_records(path.parent, path.name).records]


class JsonlTail:
    """Incrementally reads complete lines of a growing JSONL file (as ``read_jsonl``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict] = []
        self._pos = 0

    def poll(self) -> list[dict]:
        found = read_records(self.path.parent, self.path.name, offset=self._pos)
        self._pos = found.end
        new = [record.data for record in found.records]
        self.records.extend(new)
        return new


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def maximum(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def machine_info() -> dict:
    import torch

    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "hostname": socket.gethostname(),
    }


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def write_result(out: str | Path, result: dict) -> Path:
    """Write a benchmark's JSON result (creating the folder) and say where."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    total = result.get("total_seconds")
    print(f"\nwrote {out}" + (f" ({total:.0f} s)" if total is not None else ""))
    return out


def process_cpu_seconds(pids) -> float:
    """user + system CPU seconds consumed so far by the processes ``pids`` (from /proc)."""
    return sum(stat.cpu_seconds for pid in pids if (stat := read_stat(pid)) is not None)


def start_dyntrain_server(state: Path, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """`dyntrain server --port 0 EXTRA` on ``state`` (its output appended to ``log``); its
    process and URL, once it listens."""
    out = open(log, "a")
    out.write("---- server start\n")
    out.flush()
    proc = subprocess.Popen([sys.executable, "-m", "dyntrain.cli.main", "server", "--port", "0",
                             "--state-dir", str(state), "--grace-seconds", "2", *extra],
                            stdout=out, stderr=subprocess.STDOUT,
                            cwd=Path(__file__).resolve().parent.parent,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.findall(r"listening on (http://\S+)", log.read_text())
        text = log.read_text()
        if found and text.rfind("listening on") > text.rfind("---- server start"):
            return proc, found[-1]
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the server did not start:\n{log.read_text()[-2000:]}")


