"""Workers forked from the fork server behave like `python SCRIPT` / `python -m MODULE`."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from dyntrain.errors import EXIT_UNREACHABLE
from dyntrain.launch.forkserver import ENV_SWITCH, wanted

pytestmark = pytest.mark.slow

PROBE = """
import atexit, json, os, sys, threading, time
import torch
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "name": __name__, "env": os.environ.get("PROBE"), "stdin": sys.stdin.read(),
                  "own_session": os.getsid(0) == os.getpid(), "file": __file__,
                  "threads": torch.get_num_threads()}), flush=True)
atexit.register(print, "exit handler ran")
if sys.argv[1:] == ["raise"]:
    raise ValueError("boom")
if sys.argv[1:] == ["hooked"]:  # dyntrain's hook: one line, and the error's exit status
    from dyntrain.errors import Unreachable, install_excepthook
    install_excepthook()
    raise Unreachable("nobody there")
if sys.argv[1:] == ["interrupt"]:
    raise KeyboardInterrupt
if sys.argv[1:] == ["message"]:
    sys.exit("said why")
if sys.argv[1:] == ["thread"]:  # a non-daemon thread outlives the script: it is waited for
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread ended"))).start()
    sys.exit(0)
if sys.argv[1:] == ["wait"]:
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""

# The launcher's side, run as its own process: forking the server needs no other thread.
LAUNCHER = """
import json, os, signal, sys
from pathlib import Path
import torch  # as in the launcher, which imports it for its store
from dyntrain.launch.forkserver import ForkServer
tmp, fork, script = Path(sys.argv[1]), sys.argv[2] == "fork", sys.argv[3]
open(tmp / "launcher-file", "w")  # a file of the launcher's: its fd must not reach workers
server = ForkServer(tmp / "server.log", {**os.environ, "OMP_NUM_THREADS": "1"}, fork=fork)
env = {**os.environ, "PROBE": "yes", "OMP_NUM_THREADS": "1"}
runs = {name: server.start(argv, env, tmp / f"{name}.log") for name, argv in [
    ("script", [script, "3"]), ("module", ["-m", "pkg.probe"]), ("raise", [script, "raise"]),
    ("hooked", [script, "hooked"]), ("interrupt", [script, "interrupt"]),
    ("message", [script, "message"]), ("thread", [script, "thread"]),
    ("killed", [script, "wait"])]}
codes = {k: p.wait(60) for k, p in runs.items() if k != "killed"}
fds = sorted(os.listdir(f"/proc/{runs['killed'].pid}/fd"), key=int)
runs["killed"].send_signal(signal.SIGKILL)
codes["killed"] = runs["killed"].wait(60)
server.close()
print(json.dumps({"forked": server.forked, "codes": codes, "server": server.proc.returncode,
                  "worker_fds": fds}))
"""


@pytest.mark.parametrize("how", ["fork", "start"])
def test_forked_workers_run_like_python_script_and_report_exit_codes(tmp_path, how):
    """Whether the server was forked from the launcher or started as a new interpreter, its
    workers run, exit and report as `python SCRIPT` would: arguments, path, session, exit codes
    (sys.exit, an exception, Ctrl-C, a signal), exit handlers, threads, and the launcher's
    thread setting; none holds a file of the launcher."""
    (tmp_path / "pkg").mkdir()
    script = tmp_path / "pkg" / "probe.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", LAUNCHER, str(tmp_path), how, str(script)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["forked"] is (how == "fork")
    assert result["codes"] == {"script": 3, "module": 0, "raise": 1, "hooked": EXIT_UNREACHABLE,
                               "interrupt": -signal.SIGINT,
                               "message": 1, "thread": 0, "killed": -signal.SIGKILL}
    assert result["server"] == 0 and result["worker_fds"] == ["0", "1", "2"], result
    lines = (tmp_path / "script.log").read_text().splitlines()
    assert json.loads(lines[0]) == {
        "argv": [str(script), "3"], "path0": str(script.parent), "cwd": str(tmp_path),
        "name": "__main__", "env": "yes", "stdin": "", "own_session": True, "file": str(script),
        "threads": 1}
    assert lines[1:] == ["exit handler ran"], lines
    b = json.loads((tmp_path / "module.log").read_text().splitlines()[0])
    assert b["argv"] == [str(script)] and b["path0"] == str(tmp_path) and b["name"] == "__main__"
    c = (tmp_path / "raise.log").read_text()
    assert "Traceback" in c and c.strip().endswith("exit handler ran") and "ValueError: boom" in c
    assert (tmp_path / "hooked.log").read_text().splitlines()[1:] == [
        "dyntrain: error: nobody there", "exit handler ran"]
    assert "KeyboardInterrupt" in (tmp_path / "interrupt.log").read_text()
    assert "said why" in (tmp_path / "message.log").read_text()
    assert (tmp_path / "thread.log").read_text().splitlines()[1:] == ["thread ended",
                                                                       "exit handler ran"]


# In a pid namespace of its own (only its processes fork there), a worker that exited, then one
# forked with the same pid (the kernel reuses pids: 32768 of them on many hosts).
REUSED = """
import json, os, signal, sys
from pathlib import Path
import torch
from dyntrain.launch.forkserver import ForkServer
tmp, script = Path(sys.argv[1]), sys.argv[2]
server = ForkServer(tmp / "server.log", dict(os.environ), fork=True)
first = server.start([script, "0"], dict(os.environ), tmp / "first.log")
code = first.wait(60)
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(first.pid - 1))
second = server.start([script, "wait"], dict(os.environ), tmp / "second.log")
alive = second.poll()
second.send_signal(signal.SIGKILL)
print(json.dumps({"pids": [first.pid, second.pid], "first": code, "second_alive": alive is None,
                  "second": second.wait(60)}))
server.close()
"""


def test_a_worker_given_the_pid_of_an_exited_one_is_seen_alive_and_can_be_killed(tmp_path):
    """Exit codes are the server's answer to a request, not to a pid: a worker forked with the
    pid of one that exited is alive, and a kill reaches it (it looked exited at once, so an
    event's kill went nowhere and the launcher lost track of a live worker)."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    try:
        out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                              REUSED, str(tmp_path), str(script)], capture_output=True,
                             text=True, cwd=tmp_path, timeout=240)
    except FileNotFoundError:
        pytest.skip("no unshare on this machine")
    if "unshare failed" in out.stderr or "Operation not permitted" in out.stderr:
        pytest.skip(f"no pid namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["pids"][0] == result["pids"][1], result  # the same pid, given again
    assert result["first"] == 0 and result["second_alive"], result
    assert result["second"] == -signal.SIGKILL, result


@pytest.mark.parametrize("cuda, hip, gpu, switch, expected", [
    (None, None, False, None, True),  # a CPU build
    ("13.0", None, False, None, True),  # a CUDA build on a machine without a GPU
    ("13.0", None, True, None, False),  # a GPU: workers start as new processes
    (None, "6.4", True, None, False),
    ("13.0", None, True, "1", True),  # asked for
    (None, None, False, "0", False),  # turned off
])
def test_the_fork_server_is_used_where_no_gpu_can_be(monkeypatch, cuda, hip, gpu, switch,
                                                     expected):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    if switch is None:
        monkeypatch.delenv(ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(ENV_SWITCH, switch)
    assert wanted() is expected
