"""A throw-away Ray cluster on this machine: a head and worker "nodes", each its own `ray start`.

For tests, benchmarks and trying the Ray executor without a cluster. Each node is a separate
``ray start --block`` process in a session of its own, with its own CPUs and custom resources
(stand-ins for hosts of different compute environments), so that one node can be lost abruptly
(its raylet SIGKILLed: a spot reclaim) or stopped, and the cluster ends by killing exactly the
processes it started (nothing is found by name). Made for a small, shared machine: a small
object store, no dashboard, no usage stats, no log monitor, every port chosen free, the head's
port outside the worker port range, ``RAY_AUTH_MODE`` set explicitly, node deaths noticed within
about 2 s.

Every node is on 127.0.0.1 unless it is given a host of a ``dyntrain.testing.hosts`` bed
(anything with ``address`` and ``popen``): it then runs inside that host with the host's address
as its node address (``--node-ip-address``), as a user starts Ray on separate machines.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

OBJECT_STORE_BYTES = 80 * 1024 * 1024
HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "1000",
          "RAY_health_check_failure_threshold": "3"}


#: what `ray start` says when the raylet did not register with the GCS in its fixed 30 s
REGISTRATION_TIMEOUT = "The current node timed out during startup"
NODE_START_TRIES = 3

class NodeHost(Protocol):
    """Where a node runs: a host of a bed (``dyntrain.testing.hosts.Host``)."""

    address: str

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` different free ports (held together while chosen: never the same one twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class RayNode:
    name: str
    proc: subprocess.Popen
    log: Path

    def raylet_pid(self) -> int | None:
        """The pid of this node's raylet (a child of its `ray start`)."""
        out = subprocess.run(["pgrep", "-g", str(self.proc.pid), "-f", "raylet/raylet"],
                             capture_output=True, text=True).stdout.split()
        return int(out[0]) if out else None


class LocalRayCluster:
    """Start with ``start()``, add nodes with ``add_node()``, end with ``close()``."""

    def __init__(self, head_cpus: int = 0, worker_ports: tuple[int, int] = (20000, 20999),
                 start_timeout: float = 120.0, head_host: NodeHost | None = None,
                 health: dict[str, str] | None = None) -> None:
        """``head_host``: where the head runs (default: this machine, on 127.0.0.1);
        ``health``: Ray's ``RAY_health_check_*`` settings for every node (default
        ``HEALTH``)."""
        self.dir = Path(tempfile.mkdtemp(prefix="dtray-", dir="/tmp"))  # short: socket paths
        self.head_cpus, self.worker_ports, self.start_timeout = head_cpus, worker_ports, \
            start_timeout
        self.head_host, self.health = head_host, HEALTH if health is None else health
        self.port = free_port()
        while self.worker_ports[0] <= self.port <= self.worker_ports[1]:
            self.port = free_port()
        self.address = f"{head_host.address if head_host else '127.0.0.1'}:{self.port}"
        self.nodes: dict[str, RayNode] = {}

    def env(self) -> dict[str, str]:
        """The environment of every node (and of a driver): this Python's bin first on PATH."""
        bin_dir = os.path.dirname(sys.executable)
        return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
                "PYTHONUNBUFFERED": "1", **self.health}

    def _common(self, host: NodeHost | None) -> list[str]:
        lo, hi = self.worker_ports
        ports = [str(port) for port in free_ports(6)]
        return ["--node-ip-address", host.address if host else "127.0.0.1",
                "--object-store-memory",
                str(OBJECT_STORE_BYTES), "--disable-usage-stats", "--include-log-monitor=false",
                "--min-worker-port", str(lo), "--max-worker-port", str(hi),
                "--node-manager-port", ports[0], "--object-manager-port", ports[1],
                "--dashboard-agent-listen-port", ports[2], "--dashboard-agent-grpc-port", ports[3],
                "--runtime-env-agent-port", ports[4], "--metrics-export-port", ports[5]]

    def start(self) -> str:
        """Start the head; returns its address."""
        # the client server (default 10001) and the dashboard's process (8265, started even
        # without the dashboard) get free ports too: two clusters side by side (two test
        # processes, two suites) would otherwise contend for the same ones
        client_port, dashboard_port = free_ports(2)
        self._launch("head", ["--head", "--port", str(self.port), "--num-cpus",
                              str(self.head_cpus), "--include-dashboard=false",
                              "--ray-client-server-port", str(client_port),
                              "--dashboard-port", str(dashboard_port),
                              "--temp-dir", str(self.dir)], self.head_host)
        return self.address

    def add_node(self, name: str, cpus: int, resources: dict[str, float],
                 host: NodeHost | None = None) -> RayNode:
        """Start a worker node with ``cpus`` and custom ``resources`` (inside ``host`` if
        given); returns once it runs."""
        return self._launch(name, ["--address", self.address, "--num-cpus", str(cpus),
                                   "--resources", json.dumps(resources)], host)

    def _launch(self, name: str, args: list[str], host: NodeHost | None = None) -> RayNode:
        """Start one node; once more when Ray gave up on its own registration (``ray start``
        waits a fixed 30 s for the raylet to register with the GCS, which a loaded 2-core
        machine can exceed), within ``start_timeout`` in all."""
        ray = shutil.which("ray", path=self.env()["PATH"])
        if ray is None:
            raise RuntimeError("no `ray` command: pip install 'dyntrain[ray]'")
        log = self.dir / f"{name}.out"
        argv = [ray, "start", "--block", *args, *self._common(host)]
        popen = subprocess.Popen if host is None else host.popen

        def start() -> RayNode:
            with open(log, "w") as out:
                proc = popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                             start_new_session=True)
            node = self.nodes[name] = RayNode(name, proc, log)
            return node

        deadline, attempt, node = time.monotonic() + self.start_timeout, 1, start()
        while "block forever" not in (said := log.read_text(errors="replace")):
            if node.proc.poll() is not None or time.monotonic() > deadline:
                self.stop_node(name)
                if (REGISTRATION_TIMEOUT not in said or attempt == NODE_START_TRIES
                        or time.monotonic() > deadline):
                    tail = said.strip().splitlines()[-3:]
                    raise RuntimeError(f"ray node {name} did not start (try {attempt}): "
                                       f"{' | '.join(tail)}")
                attempt, node = attempt + 1, start()  # Ray's own wait ran out: again
            time.sleep(0.1)
        return node

    def kill_raylet(self, name: str) -> None:
        """Lose a node abruptly: SIGKILL its raylet (its workers die with it)."""
        pid = self.nodes[name].raylet_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    def stop_node(self, name: str) -> None:
        """Kill every process of the node's session."""
        node = self.nodes.pop(name, None)
        if node is None:
            return
        try:
            os.killpg(node.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        node.proc.wait()

    def close(self) -> None:
        """Stop every node, then whatever process still runs from this cluster's folder."""
        for name in [n for n in self.nodes if n != "head"] + ["head"]:
            self.stop_node(name)
        mine = str(self.dir)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if mine in cmdline:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
