"""Several hosts on one Linux machine, for tests and benchmarks that need real networks.

``HostBed(n)`` makes n hosts. Each is a long-lived holder process started by ``unshare`` in new
network, UTS and mount namespaces; commands run inside a host through ``nsenter -t HOLDER``
(so ``Host.popen`` returns the real process, whose pid signals and ``/proc`` work on). Each
host has:

- its own address on a bridge (a veth pair; ``eth0`` inside, 10.213.S.(10+i)/24, the bridge
  itself has 10.213.S.1: the machine outside, where the test runs, reaches every host);
- its own hostname (``host0``, ``host1``...) that resolves to 127.0.1.1 through its own
  ``/etc/hosts``, as on stock Debian/Ubuntu cloud images;
- its own disk: a private ``/tmp`` (a folder of the bed, ``Host.disk`` from outside) and a
  private ``/dev/shm``; the bed's ``shared`` folder is at the same path on every host and
  outside: the shared file system a test may give the product on purpose.

The rest of the file system (the source tree, the venv) is the machine's, visible everywhere;
a checkout or venv that lies under ``/tmp`` is bound at its own path into every host's ``/tmp``
(the software installed on each host, not shared data).
Processes of a host are found by their network namespace, so ``freeze``/``lose`` reach
everything a host started, however deep.

Why a holder process and not ``ip netns``: ``ip netns exec`` makes a new mount namespace per
command, so a host's private ``/tmp`` would not outlive one command, and it has no UTS
namespace; the holder keeps all three namespaces for the bed's lifetime. Its stdin is a pipe
from the bed's owner: should the owner be killed, the holders exit, and the next bed sweeps what
is left (``dyntrain.testing.netns``).

Faults: ``partition(i)``/``heal(i)`` take the host's link down and up (open TCP connections
stay open and silent, as in a real partition), ``slow_link(i)`` puts a token bucket (``tbf``)
both ways, ``freeze(i)``/``thaw(i)`` SIGSTOP/SIGCONT every process of the host, ``lose(i)``
cuts its link and SIGKILLs every process at once (``heal`` brings it back like a rebooted
machine, disk kept).
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dyntrain.testing import netns
from dyntrain.testing.netns import BedError

__all__ = ["Host", "HostBed", "unavailable"]

#: where hosts have their private disk; the bed's folder lies under it (hidden inside hosts)
PRIVATE_ROOT = Path("/tmp")
TOOLS = ("ip", "tc", "unshare", "nsenter")
CPUINFO = ".cpuinfo"  # a host's /proc/cpuinfo with flags hidden, on its own disk

# $1 hostname, $2 hosts file, $3 shared folder, $4 its mount point on the host's disk, $5 disk,
# then pairs: a folder of the installation under /tmp, its mount point on the host's disk
_HOLDER = """set -e
hostname "$1"
mount --bind "$2" /etc/hosts
mount --bind "$3" "$4"
disk="$5"
shift 5
while [ $# -gt 0 ]; do mount --bind "$1" "$2"; shift 2; done
mount --rbind "$disk" /tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
ip link set lo up
echo ready
exec cat >/dev/null
"""

_unavailable: list[str | None] = []


def _installation_under_private_root() -> list[Path]:
    """The folders of this installation (the interpreter's prefix, the package's checkout) that
    lie under the hosts' private root and would be hidden inside them (a clone in /tmp)."""
    import dyntrain

    found: list[Path] = []
    package = Path(dyntrain.__file__).resolve().parent
    checkout = package.parents[1] if package.parent.name == "src" else package.parent
    for folder in (Path(sys.prefix).resolve(), checkout):
        if folder.is_relative_to(PRIVATE_ROOT) and \
                not any(folder.is_relative_to(f) for f in found):
            found = [f for f in found if not f.is_relative_to(folder)] + [folder]
    return found


def unavailable() -> str | None:
    """Why host beds cannot be made on this machine (one line), or None when they can."""
    if not _unavailable:
        _unavailable.append(_probe())
    return _unavailable[0]


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return "host beds need Linux network namespaces"
    if os.geteuid() != 0:
        return "host beds need root (network namespaces, veth pairs, mounts)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"host beds need {', '.join(missing)} (iproute2, util-linux): not found"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make network namespaces here: {probe.stderr.strip()[:200]}"
    return None


@dataclass
class Host:
    """One host of a bed. ``disk`` is its private ``/tmp`` seen from outside.

    Made by ``HostBed``, not by hand.

    Args:
        index: Its index in the bed.
        name: Its hostname.
        address: Its address on the bed's bridge.
        disk: Its private ``/tmp``, seen from outside.
        link: The bridge-side end of its veth pair (down: partitioned).
        holder: The process that holds its namespaces.
        netns: Its network namespace's inode: how its processes are found.
        cpus: The cores its processes may run on (None: every core of the machine).
    """

    index: int
    name: str
    address: str
    disk: Path
    link: str  # the bridge-side end of its veth pair (down: partitioned)
    holder: subprocess.Popen
    netns: int  # its network namespace's inode: how its processes are found
    cpus: tuple[int, ...] | None = None  # ``HostBed.limit_cpus``: its processes' affinity

    def popen(self, argv: list[str], *, env: dict | None = None, cwd: str | Path | None = None,
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside this host (its network, hostname and disk).

        Args:
            argv: The command line.
            env: Its environment (default: this process's).
            cwd: Its working folder, a path as the host sees it (default: the current folder
                unless it lies on the private disk, else /).
            **kwargs: Passed to ``subprocess.Popen`` (stdout, stderr, text...).
        """
        if cwd is None:
            here = Path.cwd()
            cwd = "/" if here.is_relative_to(PRIVATE_ROOT) else here
        argv = ["nsenter", "-t", str(self.holder.pid), "--net", "--uts", "--mount",
                f"--wd={cwd}", "--", *self._affinity(), *map(str, argv)]
        return subprocess.Popen(argv, env=dict(os.environ) if env is None else env, **kwargs)

    def _affinity(self) -> list[str]:
        return [] if self.cpus is None else ["taskset", "--cpu-list",
                                             ",".join(map(str, self.cpus))]

    def run(self, argv: list[str], *, timeout: float = 120.0, check: bool = False,
            **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` inside this host to the end; output captured as text unless told.

        Args:
            argv: The command line.
            timeout: Seconds before it is killed (``subprocess.TimeoutExpired`` is raised).
            check: Raise ``BedError`` (with its output) when it exits non-zero.
            **kwargs: Passed to ``popen``.
        """
        if kwargs.pop("capture_output", "stdout" not in kwargs and "stderr" not in kwargs):
            kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        kwargs.setdefault("text", True)
        proc = self.popen(argv, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise BedError(f"{' '.join(map(str, argv))} on {self.name} failed "
                           f"({proc.returncode}): {err or out}")
        return done

    def pids(self) -> list[int]:
        """Every process running on this host (its holder aside)."""
        return netns.pids_in([self.netns], exclude=[self.holder.pid])

    def path(self, inside: str | Path) -> Path:
        """Where a file of this host's private ``/tmp`` lies from outside.

        Args:
            inside: A path under ``/tmp`` as the host sees it.
        """
        return self.disk / Path(inside).relative_to(PRIVATE_ROOT)


class HostBed:
    """``n`` hosts on a bridge; see the module docstring. Use as a context manager or call
    ``close()``: every namespace, link, qdisc, process and file of the bed goes.

    Args:
        n: How many hosts (1 to 200).

    Raises:
        BedError: This machine cannot make network namespaces (not root, no ``ip`` or
            ``unshare``): the reason, in one line.
    """

    def __init__(self, n: int) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"a bed has 1 to 200 hosts, not {n}")
        reason = unavailable()
        if reason:
            raise BedError(reason)
        self.hosts: list[Host] = []
        self._holders: list[subprocess.Popen] = []
        self._closed = False
        with netns.registry_lock():
            netns.sweep_stale()
            self.record = netns.new_record(PRIVATE_ROOT)
            try:
                self._build(n)
            except BaseException:
                self._remove()
                raise
        atexit.register(self.close)

    # ---- building -------------------------------------------------------------------------------

    @property
    def token(self) -> str:
        return self.record.token

    @property
    def folder(self) -> Path:
        return Path(self.record.folder)

    @property
    def shared(self) -> Path:
        """A folder at the same path on every host and outside (a shared file system)."""
        return self.folder / "shared"

    @property
    def gateway(self) -> str:
        """The bridge's address: the machine outside, as the hosts reach it."""
        return str(self._net[1])

    @property
    def _net(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(self.record.subnet)

    def _build(self, n: int) -> None:
        rec = self.record
        self.shared.mkdir(parents=True)
        bridge = f"dt{rec.token}br"
        rec.links.append(bridge)
        rec.save()
        netns.ip(f"link add {bridge} type bridge", f"link set {bridge} up",
                 f"addr add {self.gateway}/24 dev {bridge}")
        for i in range(n):
            self.hosts.append(self._add_host(i, bridge))

    def _add_host(self, i: int, bridge: str) -> Host:
        rec, name = self.record, f"host{i}"
        disk = self.folder / f"h{i}"
        mount_point = disk / self.shared.relative_to(PRIVATE_ROOT)
        mount_point.mkdir(parents=True)
        installed: list[str] = []
        for folder in _installation_under_private_root():
            point = disk / folder.relative_to(PRIVATE_ROOT)
            point.mkdir(parents=True, exist_ok=True)
            installed += [str(folder), str(point)]
        hosts_file = self.folder / f"hosts.h{i}"
        hosts_file.write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n"
                              "::1\tlocalhost ip6-localhost ip6-loopback\n")
        holder = subprocess.Popen(
            ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "--",
             "sh", "-c", _HOLDER, "holder", name, str(hosts_file), str(self.shared),
             str(mount_point), str(disk), *installed],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._holders.append(holder)
        if holder.stdout.readline().strip() != "ready":
            holder.kill()
            raise BedError(f"host {name} did not start: {holder.stderr.read().strip()[:500]}")
        holder.stdout.close()
        holder.stderr.close()
        inode = netns.netns_inode(holder.pid)
        link, peer = f"dt{rec.token}h{i}", f"dt{rec.token}p{i}"
        rec.links.append(link)
        rec.netns.append(inode)
        rec.save()
        address = str(self._net[10 + i])
        netns.ip(f"link add {link} type veth peer name {peer} netns {holder.pid}",
                 f"link set {link} master {bridge} up")
        netns.ip(f"link set {peer} name eth0", f"addr add {address}/24 dev eth0",
                 "link set eth0 up", netns_pid=holder.pid)
        return Host(i, name, address, disk, link, holder, inode)

    # ---- faults ---------------------------------------------------------------------------------

    def host(self, i: int) -> Host:
        """Host ``i`` (as ``hosts[i]``).

        Args:
            i: The host's index in ``hosts`` (0-based).
        """
        return self.hosts[i]

    def partition(self, i: int) -> None:
        """Cut host i off: its link goes down; open connections stay open and silent.

        Args:
            i: The host's index in ``hosts`` (0-based).
        """
        netns.ip(f"link set {self.hosts[i].link} down")

    def heal(self, i: int) -> None:
        """Bring host i's link back up.

        Args:
            i: The host's index in ``hosts`` (0-based).
        """
        netns.ip(f"link set {self.hosts[i].link} up")

    def slow_link(self, i: int, rate: str = "100mbit", latency: str = "50ms",
                  burst: str = "64kb") -> None:
        """Put host i behind a token bucket both ways.

        ``netem`` (delay, loss) is not in every kernel; tbf is.

        Args:
            i: The host's index in ``hosts`` (0-based).
            rate: The link's rate, in tc units (``100mbit``).
            latency: The longest a packet may queue (tbf's limit; more is dropped).
            burst: Bytes sent at once.
        """
        h = self.hosts[i]
        for dev, pid in ((h.link, None), ("eth0", h.holder.pid)):
            netns.tc("qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst",
                     burst, "latency", latency, netns_pid=pid)

    def fast_link(self, i: int) -> None:
        """Take host i's token buckets away again (if it has any).

        Args:
            i: The host's index in ``hosts`` (0-based).
        """
        h = self.hosts[i]
        for dev, pid in ((h.link, None), ("eth0", h.holder.pid)):
            netns.tc("qdisc", "del", "dev", dev, "root", netns_pid=pid, check=False)

    def limit_cpus(self, i: int, cpus: tuple[int, ...] | None) -> None:
        """Host i sees only ``cpus`` (the affinity of every process started there from now
        on), as a machine with fewer cores would; None: every core again.

        Args:
            i: The host's index in ``hosts`` (0-based).
            cpus: Core numbers of this machine.
        """
        self.hosts[i].cpus = None if cpus is None else tuple(cpus)

    def hide_cpu_flags(self, i: int, flags: tuple[str, ...]) -> None:
        """Host i's ``/proc/cpuinfo`` lists its CPU without ``flags`` (an older instruction
        set, as dyntrain reads it), until ``reset``.

        Args:
            i: The host's index in ``hosts`` (0-based).
            flags: The flags to leave out (``avx2``, ``avx512f``, ...).
        """
        h = self.hosts[i]
        lines = []
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() in ("flags", "Features"):
                line = f"{name}:{' '.join(f for f in value.split() if f not in flags)}"
            lines.append(line)
        (h.disk / CPUINFO).write_text("\n".join(lines) + "\n")  # its disk: /tmp inside
        netns.run(["nsenter", "-t", str(h.holder.pid), "--mount", "--", "mount", "--bind",
                   str(PRIVATE_ROOT / CPUINFO), "/proc/cpuinfo"])

    def freeze(self, i: int) -> int:
        """SIGSTOP every process of host i (again for any forked meanwhile); how many.

        Args:
            i: The host's index in ``hosts`` (0-based).
        """
        h = self.hosts[i]
        return netns.signal_all([h.netns], signal.SIGSTOP, exclude=[h.holder.pid],
                                settled=netns.stopped)

    def thaw(self, i: int) -> int:
        """SIGCONT every process of host i; how many.

        Args:
            i: The host's index in ``hosts`` (0-based).
        """
        h = self.hosts[i]
        return netns.signal_all([h.netns], signal.SIGCONT, exclude=[h.holder.pid],
                                settled=lambda pid: not netns.stopped(pid))

    def lose(self, i: int) -> int:
        """Host i vanishes at once; returns how many processes were killed.

        Its link goes down (peers hear nothing more, no resets), then every process of it is
        SIGKILLed. ``heal(i)`` brings the machine back empty, its disk kept.

        Args:
            i: The host's index in ``hosts`` (0-based).
        """
        self.partition(i)
        h = self.hosts[i]
        return netns.signal_all([h.netns], signal.SIGKILL, exclude=[h.holder.pid])

    def reset(self) -> None:
        """Undo every fault and end every process on every host (between tests sharing a bed);
        the disks are kept."""
        for h in self.hosts:
            netns.signal_all([h.netns], signal.SIGKILL, exclude=[h.holder.pid])
            self.heal(h.index)
            self.fast_link(h.index)
            h.cpus = None
            if (h.disk / CPUINFO).exists():
                netns.run(["nsenter", "-t", str(h.holder.pid), "--mount", "--", "umount",
                           "/proc/cpuinfo"], check=False)
                (h.disk / CPUINFO).unlink()

    # ---- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove everything of the bed (idempotent; also run at interpreter exit)."""
        if self._closed:
            return
        with netns.registry_lock():
            self._remove()
        atexit.unregister(self.close)

    def _remove(self) -> None:
        self._closed = True
        netns.remove(self.record)
        for holder in self._holders:
            if holder.stdin is not None:
                holder.stdin.close()
            holder.kill()
            holder.wait()

    def leftovers(self) -> list[str]:
        """What of this bed still exists (after ``close``: nothing, or a bug)."""
        found = [f"link {name}" for name in self.record.links if netns.link_exists(name)]
        found += [f"process {pid} of a host" for pid in netns.pids_in(self.record.netns)]
        found += [f"file {path}" for path in (self.folder, self.record.path) if path.exists()]
        return found

    def __enter__(self) -> HostBed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
