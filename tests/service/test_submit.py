"""`dyntrain submit`, `logs` and `status` as a user meets them: working directory and environment,
-f FILE, --attempts, array jobs, a worker's error in the reason, jobs that can never run."""

from __future__ import annotations

import sys

import pytest
import yaml

from dyntrain.cli.main import main
from dyntrain.cli.service.follow import _Watcher
from dyntrain.elastic.numerics import KernelLevel, host_levels
from dyntrain.service.client import Client
from dyntrain.service.core.jobtext import progress_text
from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.submitter import ExportSpec, exported, parse_export
from dyntrain.service.engine.worker_log import error_line
from dyntrain.testing.wait import wait_until

from .test_api import serve

PY = sys.executable


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """An in-process service with the embedded default: queue `default` over `local` (price 0)."""
    with serve(tmp_path_factory.mktemp("submit")) as (_service, url):
        yield url


@pytest.fixture
def dyntrain(url, capsys):
    """Run `dyntrain ARGS --url URL` in this process: (exit code, stdout, stderr)."""
    def run(*args):
        cut = 2 if args[0] in ("jobdef",) else 1
        argv = [*map(str, args[:cut]), "--url", url, *map(str, args[cut:])]
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def one_line_error(result, *needles) -> str:
    code, _, err = result
    assert code == 2 and err.count("\n") == 1 and err.startswith("dyntrain: error:"), result
    for needle in needles:
        assert needle in err, err
    return err


# ------------------------------------------------------------------------------- pure parts


def test_error_line_of_a_worker_log():
    tb = ("step 1\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
          "    import dyntrain\nModuleNotFoundError: No module named 'dyntrain'\n")
    assert error_line(tb) == "error: ModuleNotFoundError: No module named 'dyntrain'"
    chained = tb + "\nDuring handling of the above exception, another exception occurred:\n\n" \
        "Traceback (most recent call last):\n  File \"y\", line 2\nValueError: boom\n"
    assert error_line(chained) == "error: ValueError: boom"
    assert error_line("python: can't open file '/w/shard.py': [Errno 2] No such file\n\n") == \
        "last output: python: can't open file '/w/shard.py': [Errno 2] No such file"
    assert error_line("") == ""
    assert len(error_line("x" * 1000)) < 320


def test_export_spec_like_sbatch():
    shell = {"PATH": "/venv/bin:/usr/bin", "HOME": "/h", "DYNTRAIN_COORDINATOR": "h:1",
             "AWS_BATCH_JOB_ID": "parent", "BASH_FUNC_f%%": "() { :; }"}
    assert exported(shell) == {"PATH": "/venv/bin:/usr/bin", "HOME": "/h"}
    assert exported(shell, parse_export("NONE")) == {}
    assert exported(shell, parse_export("PATH,X=1,MISSING")) == {"PATH": "/venv/bin:/usr/bin",
                                                                 "X": "1"}
    assert parse_export("all,X=1") == ExportSpec(True, (), (("X", "1"),))
    for bad, needle in (("NONE,PATH", "cannot be combined"), ("A,,B", "comma-separated"),
                        ("1X", "not an environment variable name")):
        with pytest.raises(ValidationError, match=needle):
            parse_export(bad)


def test_progress_and_reasons_are_said_once_each(capsys):
    watcher = _Watcher("0123456789abcdef", announce=True)
    waiting = {"status": "RUNNABLE", "waiting": {"reason": "no free slot", "position": 2}}
    moved = {"status": "RUNNABLE", "waiting": {"reason": "no free slot", "position": 1}}
    progress = {"step": 12, "total_steps": 40, "epoch": 1, "world_size": 2, "loss": 0.51234,
                "samples_per_s": 812.34}
    running = {"status": "RUNNING", "status_reason": "training with 2 worker(s)",
               "progress": progress}
    for job in (waiting, moved, running, running, {**running, "progress": {**progress,
                                                                           "step": 13}}):
        watcher.look(job)
    assert capsys.readouterr().err.splitlines() == [
        "[01234567] RUNNABLE: waiting: #2 no free slot",
        "[01234567] RUNNING: training with 2 worker(s)",
        "[01234567] step 12/40  epoch 1  world 2  loss 0.5123  812.3 samples/s",
        "[01234567] step 13/40  epoch 1  world 2  loss 0.5123  812.3 samples/s"]
    assert progress_text(None) == progress_text({"loss": 1.0}) == ""


# ------------------------------------------------------------------- against a real service


def test_a_job_runs_where_it_was_submitted_with_the_shells_environment(
        dyntrain, url, tmp_path, monkeypatch):
    proj, other = tmp_path / "proj", tmp_path / "other"
    proj.mkdir()
    other.mkdir()
    (proj / "shard.py").write_text(
        "import os\nprint('cwd', os.getcwd())\nprint('var', os.environ.get('MY_VAR'))\n"
        "print('only', os.environ.get('ONLY'))\n")
    monkeypatch.chdir(proj)
    monkeypatch.setenv("MY_VAR", "from-shell")
    monkeypatch.setenv("DYNTRAIN_COORDINATOR", "127.0.0.1:1")  # as if inside another job
    # (the in-process server shares this environment: its export is checked on the job)
    code, out, err = dyntrain("submit", "--wait", "--", PY, "shard.py")  # a relative path
    assert code == 0, err
    assert f"cwd {proj}" in out and "var from-shell" in out
    job_id = out.splitlines()[0]
    with Client(url) as client:
        job = client.get_job(job_id)
    assert job["workdir"] == str(proj)
    assert job["exported_environment"]["MY_VAR"] == "from-shell"
    assert "DYNTRAIN_COORDINATOR" not in job["exported_environment"]

    code, out, err = dyntrain("submit", "--workdir", "../other", "--export", "MY_VAR,ONLY=1",
                              "--wait", "--", PY, proj / "shard.py")
    assert code == 0 and f"cwd {other}" in out and "only 1" in out, (out, err)
    one_line_error(dyntrain("submit", "--workdir", "nowhere", "--", "true"),
                   f"workdir {proj / 'nowhere'}: no such directory")


def test_submit_from_a_yaml_file_flags_over_it_and_attempts(dyntrain, url, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({
        "queue": "default", "name": "from-file", "retry_attempts": 2,
        "command": [PY, "-c", "import os; print(os.environ['GREETING'])"],
        "environment": {"GREETING": "hi", "KEEP": "1"}}))
    code, out, err = dyntrain("submit", "-f", job_file, "--attempts", "3", "--env",
                              "GREETING=hello", "--wait")
    # more than one attempt may run: the log heads each attempt's lines
    assert code == 0 and out.splitlines()[1].startswith("=== attempt 1: "), (out, err)
    assert out.splitlines()[2] == "hello", (out, err)
    code, retried, _ = dyntrain("submit", "--retries", "2", "--", "true")
    with Client(url) as client:
        job = client.get_job(out.splitlines()[0])
        assert (job["name"], job["retry_strategy"]["attempts"]) == ("from-file", 3)
        assert job["environment"] == {"GREETING": "hello", "KEEP": "1"}
        assert client.get_job(retried.strip())["retry_strategy"]["attempts"] == 3  # 1 + 2

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncmd: [true]\nretries: 3\n")
    one_line_error(dyntrain("submit", "-f", bad), "bad.yaml: unknown field(s) cmd, retries",
                   "retry_attempts")
    one_line_error(dyntrain("jobdef", "register", "-f", bad),
                   "bad.yaml: unknown field(s) cmd, retries", "retry_strategy")
    one_line_error(dyntrain("submit", "--attempts", "3", "--retries", "2", "--", "true"),
                   "not both")
    one_line_error(dyntrain("submit", "--attempts", "0", "--", "true"), "--attempts must be 1-10")
    one_line_error(dyntrain("submit", "--array", "1", "--", "true"), "--array must be 2-10000")


def test_array_logs_show_the_children_and_reach_one(dyntrain, url):
    code, out, _ = dyntrain(
        "submit", "--array", "3", "--", PY, "-c",
        "import os, sys; i = int(os.environ['AWS_BATCH_JOB_ARRAY_INDEX']); print('child', i); "
        "sys.exit(4 if i == 1 else 0)")
    parent = out.strip()
    with Client(url) as client:
        client.wait(parent, timeout=60)
    code, out, _ = dyntrain("logs", parent[:8])
    assert code == 0
    assert f"array job {parent} (FAILED): 3 children: 2 SUCCEEDED, 1 FAILED" in out, out
    assert f"{parent}:1  FAILED: exited with code 4 (attempt 1 of 1); last output: child 1" in out
    assert f"dyntrain logs {parent}:INDEX (INDEX 0-2)" in out and f"{parent}_INDEX" in out
    assert dyntrain("logs", f"{parent}_2")[1].strip() == "child 2"  # as the run folder names it
    assert dyntrain("logs", f"{parent[:8]}:0")[1].strip() == "child 0"


def test_a_failing_worker_s_error_is_the_reason(dyntrain):
    code, out, err = dyntrain("submit", "--wait", "--", PY, "-c", "import no_such_module_xyz")
    assert code == 1
    assert ("FAILED: exited with code 1 (attempt 1 of 1); error: ModuleNotFoundError: No module "
            "named 'no_such_module_xyz'") in err, err


def test_a_job_that_can_never_run_is_refused_naming_the_largest_slot(dyntrain):
    one_line_error(dyntrain("submit", "--cpus", "64", "--", "true"),
                   "needs cpus=64, gpus=0, memory_mib=1024 per worker, but the largest slot of "
                   "queue default's compute environments is cpus=1, gpus=0, memory_mib=1024 "
                   "(local): it can never run")


def test_status_of_a_running_job(dyntrain, url):
    job_id = dyntrain("submit", "--attempts", "2", "--", PY, "-c",
                      "import time; print('up', flush=True); time.sleep(60)")[1].strip()
    with Client(url) as client:
        wait_until(lambda: client.get_job(job_id)["status"], "the job to run", 60,
                   until=lambda status: status == "RUNNING")
        code, out, _ = dyntrain("status", job_id)
        assert "attempts:     1 of 2 (running)" in out, out
        assert "saving n/a: the on-demand price is 0" in out
        assert "dyntrain ce update local --price" in out
        client.terminate(job_id)
        assert client.wait(job_id, timeout=60)["status"] == "FAILED"
    # the terminated attempt ran, so it counts, with how it ended
    assert "attempts:     1 of 2" in dyntrain("status", job_id)[1]


def test_a_job_pinned_to_the_top_kernels_is_taken_exactly_where_this_machine_runs_them(dyntrain):
    """The service's hosts are this machine, whose CPU decides (``host_levels``): a job pinned
    to the highest level runs here when its CPU has it and is refused at submit, in one line
    naming what this machine runs, when it has not."""
    top, here = KernelLevel.AVX512_BF16, host_levels()
    result = dyntrain("submit", "--env", f"DYNTRAIN_CPU_KERNELS={top.value}", "--wait", "--",
                      PY, "-c", "import os; print('kernels', os.environ['ATEN_CPU_CAPABILITY'])")
    if top in here:
        code, out, err = result
        assert code == 0 and "kernels avx512" in out, result
    else:
        one_line_error(result, f"its cpu kernels {top.value} run on none of this service's "
                               f"hosts (they run {', '.join(k.value for k in here)})")
