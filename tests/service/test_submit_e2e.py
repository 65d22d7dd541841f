"""A local service as a user runs it: `.venv/bin/dyntrain server` started from its own directory
in a shell without the virtual environment on PATH, and jobs submitted from another directory in
a shell where the environment is activated."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import server_url, stop_server
from dyntrain.service.client import Client

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
PROGRESS = re.compile(r"step \d+/\d+  epoch \d+  world 1  loss \d+\.\d{4}  [\d.]+ samples/s")


def _shell(path: str, **extra: str) -> dict[str, str]:
    """A fresh shell's environment: no venv, no DYNTRAIN_* of the test run."""
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR") if k in os.environ}
    return {**keep, "PATH": path, "PYTHONUNBUFFERED": "1", "COLUMNS": "160", **extra}


ACTIVATED = _shell(f"{VENV_BIN}:{SYSTEM_PATH}", VIRTUAL_ENV=str(VENV_BIN.parent))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """(url, project dir): the server runs in its own directory with the system's PATH."""
    home, project = tmp_path_factory.mktemp("server-home"), tmp_path_factory.mktemp("project")
    log = home / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(VENV_BIN / "dyntrain"), "server", "--port", "0",
                                 "--state-dir", "state", "--grace-seconds", "2"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=home,
                                env=_shell(SYSTEM_PATH))
    url = server_url(proc, log, 90)
    (project / "shard.py").write_text(
        "import os\nprint('shard', os.environ['AWS_BATCH_JOB_ARRAY_INDEX'], 'in', os.getcwd())\n")
    yield url, project
    assert stop_server(proc) == 0
    assert "Traceback" not in log.read_text()


def dyntrain(url: str, cwd: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """`dyntrain` typed in the activated shell."""
    return subprocess.run(["dyntrain", args[0], "--url", url, *args[1:]], capture_output=True,
                          text=True, cwd=cwd, env=ACTIVATED, timeout=kw.get("timeout", 180))


def test_an_elastic_digits_job_from_an_activated_shell_shows_its_progress(service):
    url, project = service
    proc = dyntrain(url, project, "submit", "--workers", "1:1", "--wait", "--", "python", "-m",
                    "dyntrain.workloads.digits", "--max-steps", "40", "--step-delay", "0.08")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SUCCEEDED" in proc.stderr and PROGRESS.search(proc.stderr), proc.stderr
    with Client(url) as client:
        job = client.get_job(proc.stdout.split()[0])
    assert job["workdir"] == str(project) and job["progress"]["step"] == 40


def test_a_relative_script_runs_in_the_submitters_directory(service):
    url, project = service
    proc = dyntrain(url, project, "submit", "--array", "3", "--wait", "--", "python", "shard.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent = proc.stdout.split()[0]
    summary = dyntrain(url, project, "logs", parent).stdout
    assert "3 children: 3 SUCCEEDED" in summary, summary
    assert dyntrain(url, project, "logs", f"{parent}:2").stdout.strip() == \
        f"shard 2 in {project}"


def test_without_the_shells_environment_the_reason_names_the_missing_module(service):
    url, project = service
    proc = dyntrain(url, project, "submit", "--export", "NONE", "--wait", "--", "python3", "-m",
                    "dyntrain.workloads.digits")
    assert proc.returncode == 1
    assert "FAILED: exited with code 1 (attempt 1 of 1); last output:" in proc.stderr
    assert "No module named 'dyntrain'" in proc.stderr, proc.stderr


def test_ctrl_c_on_submit_wait_leaves_the_job_running_and_says_how_to_stop_it(service):
    url, project = service
    proc = subprocess.Popen(
        ["dyntrain", "submit", "--url", url, "--wait", "--", "python", "-c",
         "import time; print('started', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=project, env=ACTIVATED)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    job_id = lines.get(timeout=60).strip()
    assert lines.get(timeout=60).strip() == "started"  # the job runs and the wait follows it
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert f"job {job_id} goes on running on the service (RUNNING): stop it with " \
           f"`dyntrain terminate {job_id}`" in err, err
    with Client(url) as client:
        assert client.get_job(job_id)["status"] == "RUNNING"
        assert dyntrain(url, project, "terminate", job_id).returncode == 0
        assert client.wait(job_id, timeout=60)["status"] == "FAILED"
