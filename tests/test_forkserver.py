"""Workers forked from the fork server behave like `python SCRIPT` / `python -m MODULE`."""

import json
import os
import signal

import pytest
import torch

from dyntrain.launch.forkserver import ENV_SWITCH, ForkServer, wanted

pytestmark = pytest.mark.slow

PROBE = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "name": __name__, "env": os.environ.get("PROBE"), "stdin": sys.stdin.read(),
                  "own_session": os.getsid(0) == os.getpid(), "file": __file__}))
if sys.argv[1:] == ["raise"]:
    raise ValueError("boom")
if sys.argv[1:] == ["wait"]:
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""


def test_forked_workers_run_like_python_script_and_report_exit_codes(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    script = tmp_path / "pkg" / "probe.py"
    script.write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    server = ForkServer(tmp_path / "server.log")
    try:
        env = {**os.environ, "PROBE": "yes"}
        runs = {"script": server.start([str(script), "3"], env, tmp_path / "a.log"),
                "module": server.start(["-m", "pkg.probe"], env, tmp_path / "b.log"),
                "raise": server.start([str(script), "raise"], env, tmp_path / "c.log"),
                "killed": server.start([str(script), "wait"], env, tmp_path / "d.log")}
        assert [runs[k].wait(60) for k in ("script", "module", "raise")] == [3, 0, 1]
        runs["killed"].send_signal(signal.SIGKILL)
        assert runs["killed"].wait(60) == -signal.SIGKILL
    finally:
        server.close()
    a = json.loads((tmp_path / "a.log").read_text())
    assert a == {"argv": [str(script), "3"], "path0": str(script.parent), "cwd": str(tmp_path),
                 "name": "__main__", "env": "yes", "stdin": "", "own_session": True,
                 "file": str(script)}
    b = json.loads((tmp_path / "b.log").read_text())
    assert b["argv"] == [str(script)] and b["path0"] == str(tmp_path) and b["name"] == "__main__"
    c = (tmp_path / "c.log").read_text()
    assert "Traceback" in c and c.strip().endswith("ValueError: boom")
    assert server.proc.returncode == 0


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
