"""The multi-host test bed itself (``dyntrain.testing.hosts``): addresses, names, disks, faults,
teardown. Real namespaces, links and processes; skipped where they cannot be made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, OutputLines
from dyntrain.testing import netns
from dyntrain.testing.hosts import HostBed
from dyntrain.testing.wait import wait_until

NETCHECK = [sys.executable, str(SCRIPTS / "netcheck.py")]
HOSTS = 3


def start(host, *args, **kw) -> tuple[subprocess.Popen, OutputLines]:
    proc = host.popen([*NETCHECK, *args], stdout=subprocess.PIPE, text=True, **kw)
    return proc, OutputLines(proc)


def listening_port(lines: OutputLines) -> int:
    return int(wait_until(lambda: lines.has("listening"), "the server to listen").split()[1])


def test_every_host_reaches_every_other_by_its_address(hosts):
    servers = [start(h, "serve") for h in hosts.hosts]
    targets = [f"{h.address}:{listening_port(lines)}" for h, (_, lines) in
               zip(hosts.hosts, servers, strict=True)]
    assert len({h.address for h in hosts.hosts}) == HOSTS
    for h in hosts.hosts:
        out = h.run([*NETCHECK, "reach", *targets, f"{hosts.gateway}:9"], check=True).stdout
        results = dict(line.split() for line in out.splitlines())
        assert [results[t] for t in targets] == ["ok"] * HOSTS, (h.name, out)
        # the machine outside answers too (nothing listens on port 9 there: refused, not lost)
        assert results[f"{hosts.gateway}:9"] == "ConnectionRefusedError"


def test_hostname_resolves_to_loopback_inside_like_a_stock_cloud_image(hosts):
    for h in hosts.hosts:
        out = h.run([sys.executable, "-c", "import socket; n = socket.gethostname(); "
                     "print(n, socket.gethostbyname(n))"], check=True).stdout.split()
        assert out == [h.name, "127.0.1.1"]


def test_disks_are_private_and_the_shared_folder_is_everywhere(hosts, tmp_path):
    h0, h1 = hosts.host(0), hosts.host(1)
    name = f"/tmp/private-{os.getpid()}"
    h0.run(["sh", "-c", f"echo zero > {name}; echo shm > /dev/shm/x-{os.getpid()}"], check=True)
    assert h0.path(name).read_text() == "zero\n"
    assert h1.run(["cat", name]).returncode != 0
    assert h1.run(["cat", f"/dev/shm/x-{os.getpid()}"]).returncode != 0
    assert not os.path.exists(name) and not os.path.exists(f"/dev/shm/x-{os.getpid()}")
    # the test's own tmp_path lies on the machine's /tmp: no host sees it
    assert h1.run(["ls", str(tmp_path)]).returncode != 0
    h1.run(["sh", "-c", f"echo one > {hosts.shared}/from-h1"], check=True)
    assert (hosts.shared / "from-h1").read_text() == "one\n"
    assert h0.run(["cat", f"{hosts.shared}/from-h1"], check=True).stdout == "one\n"
    # the source tree and the venv are the machine's
    assert h1.run([sys.executable, "-c", "import dyntrain"], check=True).returncode == 0


def test_hosts_can_have_fewer_cores_and_an_older_cpu_until_reset(hosts):
    """Unlike machines, as a spot fleet mixes them: a host that sees one core (every process
    started there), a host whose CPU lists no AVX2 (as dyntrain reads its instruction set)."""
    probe = [sys.executable, "-c", "import os; from dyntrain.elastic.numerics import cpu_flags; "
             "print(len(os.sched_getaffinity(0)), 'avx2' in cpu_flags())"]
    normal = hosts.host(0).run(probe, check=True).stdout.split()
    hosts.limit_cpus(1, (0,))
    hosts.hide_cpu_flags(2, ("avx2",))
    assert hosts.host(1).run(probe, check=True).stdout.split() == ["1", normal[1]]
    assert hosts.host(2).run(probe, check=True).stdout.split() == [normal[0], "False"]
    assert hosts.host(0).run(probe, check=True).stdout.split() == normal  # the others unchanged
    hosts.reset()
    assert hosts.host(1).run(probe, check=True).stdout.split() == normal
    assert hosts.host(2).run(probe, check=True).stdout.split() == normal


def test_partition_silences_an_open_connection_and_heal_resumes_it(hosts):
    h0, h1, h2 = hosts.hosts
    _, served = start(h0, "serve")
    port = listening_port(served)
    relay, relayed = start(h1, "relay", h0.address, str(port), stdin=subprocess.PIPE)
    wait_until(lambda: relayed.has("connected"), "the connection")
    relay.stdin.write("before\n")
    relay.stdin.flush()
    wait_until(lambda: served.has("got before"), "a line over the healthy link")
    hosts.partition(1)
    relay.stdin.write("during\n")
    relay.stdin.flush()
    wait_until(lambda: relayed.has("sent during"), "the line to leave the sender")
    # h1 is cut off from everyone (h2 gets no answer at all), the others still talk
    out = h2.run([*NETCHECK, "reach", f"{h1.address}:{port}", f"{h0.address}:{port}"]).stdout
    assert out.split("\n")[:2] == [f"{h1.address}:{port} TimeoutError",
                                   f"{h0.address}:{port} ok"], out
    assert not served.has("got during")  # 2 s of the partition have passed, nothing arrived
    assert relay.poll() is None  # and the sender's connection is still open
    hosts.heal(1)
    wait_until(lambda: served.has("got during"), "the line once the link is back", timeout=60)


def test_a_slow_link_limits_the_rate(hosts):
    h0, h1 = hosts.host(0), hosts.host(1)

    def rate(size: int) -> float:
        _, lines = start(h0, "sink")
        port = listening_port(lines)
        h1.run([*NETCHECK, "blast", h0.address, str(port), str(size)], check=True)
        total, seconds = wait_until(lambda: next((ln for ln in lines.lines
                                                if ln[0].isdigit()), None), "the sink").split()
        assert int(total) == size
        return int(total) * 8 / float(seconds)

    fast = rate(8 << 20)
    hosts.slow_link(1, rate="40mbit")
    slow = rate(4 << 20)
    assert slow < 40e6 * 1.15, slow  # the burst lets the start through at full speed
    assert slow > 40e6 * 0.5, slow
    assert fast > 2 * slow, (fast, slow)
    hosts.fast_link(1)
    assert rate(8 << 20) > 2 * slow


def sleeper(host, ready: Path) -> subprocess.Popen:
    """A process with a child of its own in a new session (not in the bed's process tree); it
    creates ``ready`` once that child runs. (Two pids are seen earlier, from the child's vfork
    on; a freeze then did not take at load 6, most likely because a parent waiting in the vfork
    cannot stop while its child is stopped before its exec.)"""
    return host.popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen("
                       "['sleep', '600'], start_new_session=True); open(sys.argv[1], 'w').close()"
                       "; time.sleep(600)", str(ready)])


def sleepers(hosts, folder: Path) -> list[subprocess.Popen]:
    """A ``sleeper`` on each host, returned once every one is ready (``folder``: on the bed's
    shared file system)."""
    folder.mkdir(parents=True, exist_ok=True)
    procs = [sleeper(h, folder / f"ready-{h.name}") for h in hosts]
    for h in hosts:
        wait_until(lambda h=h: (folder / f"ready-{h.name}").exists(), f"the sleeper of {h.name}")
    return procs


def test_freeze_and_lose_act_on_that_host_only(hosts, tmp_path):
    procs = sleepers(hosts.hosts, hosts.shared / tmp_path.name)
    assert all(len(h.pids()) == 2 for h in hosts.hosts)
    assert hosts.freeze(1) == 2
    assert all(netns.stopped(pid) for pid in hosts.host(1).pids())
    assert not any(netns.stopped(pid) for h in (0, 2) for pid in hosts.host(h).pids())
    hosts.thaw(1)
    assert not any(netns.stopped(pid) for pid in hosts.host(1).pids())
    assert hosts.lose(1) == 2
    assert hosts.host(1).pids() == [] and procs[1].wait(10) == -signal.SIGKILL
    assert all(len(hosts.host(h).pids()) == 2 for h in (0, 2))
    # a lost host is cut off until it is healed, then it runs commands again
    out = hosts.host(0).run([*NETCHECK, "reach", f"{hosts.host(1).address}:9"]).stdout
    assert "TimeoutError" in out
    hosts.heal(1)
    assert hosts.host(1).run(["true"]).returncode == 0


def test_teardown_leaves_nothing_even_after_an_owner_was_killed(tmp_path):
    # a bed whose owner is SIGKILLed mid-test: its processes and links stay behind ...
    code = ("import sys, time\nfrom dyntrain.testing.hosts import HostBed\nbed = HostBed(2)\n"
            "bed.host(1).popen(['sleep', '600'], start_new_session=True)\n"
            "print(bed.token, flush=True)\ntime.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    token = owner.stdout.readline().strip()
    record = next(r for r in netns.records() if r.token == token)
    wait_until(lambda: netns.pids_in(record.netns), "the orphan-to-be")
    owner.kill()
    owner.wait()
    assert netns.link_exists(f"dt{token}br")
    # ... until the next bed sweeps them
    with HostBed(1) as bed:
        assert not netns.link_exists(f"dt{token}br")
        assert not os.path.exists(record.folder)
        procs = sleepers(bed.hosts, bed.shared)
        assert len(bed.host(0).pids()) == 2
    assert bed.leftovers() == [] and procs[0].wait(10) == -signal.SIGKILL
    assert netns.pids_in(record.netns) == []
    assert token not in {r.token for r in netns.records()}


def test_beds_side_by_side_get_their_own_subnets_and_names():
    with HostBed(1) as a, HostBed(1) as b:
        assert a.record.subnet != b.record.subnet and a.token != b.token
        assert a.host(0).run(["true"]).returncode == 0
    assert a.leftovers() == [] and b.leftovers() == []


@pytest.mark.parametrize("n", [0, 201])
def test_a_bed_needs_a_sensible_size(n):
    with pytest.raises(ValueError, match="1 to 200 hosts"):
        HostBed(n)
