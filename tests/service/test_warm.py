"""Warm workers: which commands may take one, and a real one becoming a worker.

A warm worker is a Python process that imported torch before it knew its job; these tests check
that it then behaves like a freshly started worker of the local executor: its own script,
arguments, working directory, environment and log, its own process group, its exit code and
signal reported, and one worker per process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dyntrain.elastic.numerics import Numerics
from dyntrain.service.core.executor import WorkerSpec
from dyntrain.service.core.model import Resources
from dyntrain.service.executors.local import LocalExecutor
from dyntrain.service.executors.warm import eligible
from dyntrain.testing.wait import wait_until

PY = sys.executable
BASE = {"PATH": os.environ.get("PATH", ""), "HOME": "/root"}


@pytest.mark.parametrize("argv, extra, expected", [
    ([PY, "job.py", "--x"], {}, True),
    ([PY, "-u", "-m", "dyntrain.workloads.digits"], {}, True),
    ([PY, "job.py"], {"DYNTRAIN_COORDINATOR": "h:1", "AWS_BATCH_JOB_ID": "j",
                      "CUDA_VISIBLE_DEVICES": "0", "PYTHONUNBUFFERED": "1"}, True),
    ([PY, "-c", "print(1)"], {}, False),  # only scripts and modules
    ([PY, "-O", "job.py"], {}, False),  # interpreter options a warm process did not get
    ([PY, "missing.py"], {}, False),  # the cold start says what is missing
    (["/usr/bin/python3", "job.py"], {}, False),  # another interpreter (or environment)
    (["/bin/true"], {}, False),
    # the numerics a worker names are set by the warm worker itself (a job's, or its threads)
    ([PY, "job.py"], {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2"}, True),
    ([PY, "job.py"], {"PYTHONPATH": "/x"}, False),  # read at interpreter start-up
    ([PY, "job.py"], {"PYTHONHASHSEED": "0"}, False),  # read at interpreter start-up
    ([PY, "job.py"], {"HOME": "/home/u"}, False),  # the user's site directory, at start-up
    ([PY, "job.py"], {"LC_ALL": "C"}, False),  # the interpreter's encodings, at start-up
    ([PY, "job.py"], {"LD_PRELOAD": "/x.so"}, False),  # the dynamic loader
    ([PY, "job.py"], {"OPENBLAS_NUM_THREADS": "3"}, False),  # a math library, as imported
    ([PY, "job.py"], {"TORCH_LOGS": "+dynamo"}, False),  # torch, as it is imported
    # a submitter's shell: what no one read before the worker set its environment may differ
    ([PY, "job.py"], {"PWD": "/tmp", "SHLVL": "2", "_": "/usr/bin/dyntrain", "TERM": "xterm",
                      "PATH": f"/opt/bin:{BASE['PATH']}", "MY_SETTING": "1"}, True),
])
def test_which_commands_may_run_in_a_warm_worker(tmp_path, argv, extra, expected):
    (tmp_path / "job.py").write_text("")
    assert eligible(argv, {**BASE, **extra}, str(tmp_path), BASE, PY) is expected


JOB = """import atexit, os, signal, sys, time
class Teardown:
    def __del__(self):  # at the interpreter's teardown: module globals are finalised
        os.write(1, b"torn down\\n")
kept = Teardown()
atexit.register(lambda: print("exit handlers ran", flush=True))
print("torch already imported:", "torch" in sys.modules, flush=True)
if "torch" in sys.modules:  # what it computes with: the job's numerics, not the zygote's
    import torch
    print("numerics:", torch.get_num_threads(), torch.backends.cpu.get_cpu_capability())
print(__name__, sys.argv, os.getcwd(), sys.path[0] == os.path.dirname(__file__),
      os.environ.get("JOB_VAR"), os.getpgid(0) == os.getpid(), flush=True)
if sys.argv[1] == "wait":
    time.sleep(120)
sys.exit(int(sys.argv[1]))
"""


def exits(executor: LocalExecutor, seen: dict) -> dict:
    seen.update({e.worker_id: e for e in executor.poll()})
    return seen


@pytest.mark.slow
def test_warm_workers_become_one_worker_each(tmp_path, monkeypatch):
    job = tmp_path / "scripts" / "job.py"
    job.parent.mkdir()
    job.write_text(JOB)
    # in the executor's own environment: its warm workers start with it, its workers get it
    monkeypatch.setenv("JOB_VAR", "from-the-service")
    executor = LocalExecutor(tmp_path / "state", cpus=2, memory_mib=4096, warm_workers=2)
    ended: dict = {}

    def start(wid: str, arg: str, env: dict | None = None):
        return executor.start(WorkerSpec(
            "j", 1, wid, [PY, str(job), arg], {"DYNTRAIN_JOB_ID": "j", **(env or {})},
            Resources(0.5, 0, 256), str(tmp_path), str(tmp_path / f"{wid}.log")))

    def log(wid: str) -> list[str]:
        path = tmp_path / f"{wid}.log"
        return path.read_text().splitlines() if path.exists() else []

    try:
        start("w0", "0")  # the first that could use one starts cold, and fills the pool
        wait_until(lambda: "w0" in exits(executor, ended), "w0")
        assert log("w0")[0] == "torch already imported: False"
        assert log("w0")[-2:] == ["exit handlers ran", "torn down"]  # `python` tears down
        supervisor_log = tmp_path / "state" / "workers" / "supervisor.log"
        wait_until(lambda: supervisor_log.read_text().count("warm worker") >= 2, "the pool")
        pinned = Numerics(threads=1, cpu_kernels="default").env()
        first, second = start("w1", "3", pinned), start("w2", "wait")
        assert wait_until(lambda: exits(executor, ended).get("w1"), "w1").exit_code == 3
        # a warm worker ends as `python` does, without its teardown (seconds with torch)
        assert log("w1") == ["torch already imported: True", "numerics: 1 DEFAULT",
                             f"__main__ ['{job}', '3'] {tmp_path} True from-the-service True",
                             "exit handlers ran"]
        wait_until(lambda: log("w2"), "w2 to start")
        assert log("w2")[0] == "torch already imported: True"
        assert first.ref.split(":")[0] != second.ref.split(":")[0]  # one worker per process
        executor.signal("w2", "TERM")  # reaches the worker's process group
        gone = wait_until(lambda: exits(executor, ended).get("w2"), "w2 to end")
        assert gone.signal == 15 and gone.exit_code is None, gone
    finally:
        executor.shutdown()
    assert Path(executor.status_path("w2")).exists()
