"""What a host bed needs from the machine: processes by network namespace, ``ip``, a registry.

Every bed on the machine (pytest-xdist workers, other sessions, benchmarks) records itself in
``/run/dyntrain-hostbed/<token>.json`` while it exists: its owner process, its subnet, its bridge
and veth names, its hosts' namespaces and its folder. Beds are made and removed under one file
lock, so two beds never pick the same subnet or token, and a bed whose owner died (killed before
its teardown ran) is swept by the next one: its processes killed, its links deleted, its folder
removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dyntrain.procstat import all_pids, read_stat

REGISTRY = Path("/run/dyntrain-hostbed")
#: beds take /24 subnets of this range, one each
SUBNETS = ipaddress.ip_network("10.213.0.0/16")


class BedError(RuntimeError):
    """A host bed could not be made or a command on it failed (with the command's output)."""


def ip(*commands: str, netns_pid: int | None = None) -> None:
    """Run ``ip`` commands (one ``ip -batch``), in the namespace of ``netns_pid`` if given."""
    argv = ["ip", "-batch", "-"]
    if netns_pid is not None:
        argv = ["nsenter", "-t", str(netns_pid), "--net", "--", *argv]
    run(argv, stdin="\n".join(commands) + "\n")


def tc(*args: str, netns_pid: int | None = None, check: bool = True) -> None:
    """Run ``tc``, in the namespace of ``netns_pid`` if given."""
    argv = ["tc", *args]
    if netns_pid is not None:
        argv = ["nsenter", "-t", str(netns_pid), "--net", "--", *argv]
    run(argv, check=check)


def run(argv: list[str], stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise BedError(f"{' '.join(argv)} failed ({proc.returncode}): "
                       f"{(proc.stderr or proc.stdout).strip()[:500]}")
    return proc.stdout


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_inode(pid: int) -> int | None:
    """The inode of ``pid``'s network namespace (None once it is gone)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def pids_in(inodes: Iterable[int], exclude: Iterable[int] = ()) -> list[int]:
    """Every live process whose network namespace is one of ``inodes`` (from /proc)."""
    wanted, skip = set(inodes), set(exclude)
    return [pid for pid in all_pids()
            if pid not in skip and netns_inode(pid) in wanted and not _ended(pid)]


def _ended(pid: int) -> bool:
    """Gone, or a zombie (a process that has exited)."""
    stat = read_stat(pid)
    return stat is None or stat.state.ended


def stopped(pid: int) -> bool:
    """Stopped by a signal, or gone (nothing left to stop)."""
    stat = read_stat(pid)
    return stat is None or stat.state.stopped


def signal_all(inodes: Iterable[int], sig: int, exclude: Iterable[int] = (),
               settled=None, timeout: float = 10.0) -> int:
    """Send ``sig`` to every process in these namespaces, again to any that appear meanwhile
    (forked by one not signalled yet), until a scan finds none unsettled. ``settled(pid)`` says
    a process needs no more signals (default: it is gone). Returns how many were signalled."""
    inodes, sent = list(inodes), set()
    deadline = time.monotonic() + timeout
    while True:
        todo = [p for p in pids_in(inodes, exclude) if not (settled and settled(p))]
        if not todo:
            return len(sent)
        if time.monotonic() > deadline:
            raise BedError(f"processes {todo} did not take signal {sig} within {timeout:g} s")
        for pid in todo:
            if pid not in sent or sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                sent.add(pid)
        time.sleep(0.01)


def process_start(pid: int) -> int | None:
    """A process's start time (clock ticks after boot): with the pid, it names one process."""
    stat = read_stat(pid)
    return None if stat is None else stat.start_ticks


@dataclass
class BedRecord:
    """What the registry keeps of one bed, enough to remove it after its owner died."""

    token: str
    subnet: str
    owner: int
    owner_start: int | None
    folder: str
    links: list[str] = field(default_factory=list)
    netns: list[int] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return REGISTRY / f"{self.token}.json"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, self.path)

    def owner_alive(self) -> bool:
        return process_start(self.owner) == self.owner_start


@contextlib.contextmanager
def registry_lock() -> Iterator[None]:
    """Held while a bed is made or removed (and while stale beds are swept)."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with open(REGISTRY / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def records() -> list[BedRecord]:
    found = []
    for path in sorted(REGISTRY.glob("*.json")):
        try:
            found.append(BedRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)  # half-written by an owner killed at that moment
    return found


def new_record(folder_root: Path) -> BedRecord:
    """Reserve a token and a free /24 for a new bed (call under ``registry_lock``)."""
    known = records()
    used = {r.subnet for r in known} | _subnets_in_use()
    free = [str(s) for s in SUBNETS.subnets(new_prefix=24) if str(s) not in used]
    if not free:
        raise BedError(f"every /24 of {SUBNETS} is taken by host beds or this machine")
    tokens = {r.token for r in known}
    token = secrets.token_hex(3)
    while token in tokens:
        token = secrets.token_hex(3)
    record = BedRecord(token=token, subnet=free[0], owner=os.getpid(),
                       owner_start=process_start(os.getpid()),
                       folder=str(folder_root / f"dyntrain-bed-{token}"))
    record.save()
    return record


def _subnets_in_use() -> set[str]:
    """The /24s of SUBNETS that an address or route of this machine already uses."""
    used = set()
    for line in run(["ip", "-4", "-o", "addr", "show"], check=False).splitlines() + \
            run(["ip", "-4", "route", "show"], check=False).splitlines():
        for word in line.split():
            try:
                net = ipaddress.ip_network(word, strict=False)
            except ValueError:
                continue
            if net.overlaps(SUBNETS):
                used.add(str(ipaddress.ip_network(f"{net.network_address}/24", strict=False)))
    return used


def remove(record: BedRecord) -> None:
    """Kill every process of the bed's hosts, delete its links and folder, forget it (call under
    ``registry_lock``). Namespace inodes of live beds are left alone: a dead namespace's inode
    can be reused by a new one."""
    live = {i for r in records() if r.token != record.token and r.owner_alive() for i in r.netns}
    inodes = [i for i in record.netns if i not in live]
    if inodes:
        signal_all(inodes, signal.SIGKILL)
    for name in record.links:
        if link_exists(name):
            run(["ip", "link", "del", name], check=False)
    shutil.rmtree(record.folder, ignore_errors=True)
    record.path.unlink(missing_ok=True)


def sweep_stale() -> list[str]:
    """Remove the beds whose owner process is gone; returns their tokens (call under
    ``registry_lock``)."""
    swept = []
    for record in records():
        if not record.owner_alive():
            remove(record)
            swept.append(record.token)
    return swept
