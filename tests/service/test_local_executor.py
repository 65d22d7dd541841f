"""The local executor with real processes: exits, signals, process groups, accounting, adoption.

No sleeps as synchronisation: tests poll with a deadline (``wait_until``), and workers announce
readiness in their log before they are signalled.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dyntrain.elastic.numerics import KernelLevel, host_levels
from dyntrain.procstat import read_stat
from dyntrain.service.assembly import LocalExecutorSetup
from dyntrain.service.core.executor import (
    ExecutorError,
    StartError,
    WorkerExit,
    WorkerHandle,
    WorkerSpec,
)
from dyntrain.service.core.model import Resources
from dyntrain.service.executors.local import LocalExecutor
from dyntrain.testing.wait import wait_until

PY = sys.executable
LONG = "import time\nprint('ready', flush=True)\ntime.sleep(60)"
TRAP_TERM = (
    "import signal, sys, time\n"
    "def on_term(*a):\n"
    "    print('got TERM', flush=True)\n"
    "    sys.exit(CODE)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.05)\n"
)
GRANDCHILD = (
    "import subprocess, time\n"
    "p = subprocess.Popen(['sleep', '60'])\n"
    "print('grandchild', p.pid, flush=True)\n"
)
PRINT_GPUS = "import os\nprint('CVD=' + repr(os.environ['CUDA_VISIBLE_DEVICES']), flush=True)"


def make_spec(tmp_path: Path, wid: str, code: str, cpus: float = 1, gpus: int = 0,
              memory_mib: int = 64, env: dict | None = None) -> WorkerSpec:
    return WorkerSpec(job_id="job", attempt=1, worker_id=wid, argv=[PY, "-c", code],
                      env=env or {}, resources=Resources(cpus=cpus, gpus=gpus,
                                                         memory_mib=memory_mib),
                      cwd=None, log_path=str(tmp_path / "logs" / f"{wid}.log"))


def log_of(spec: WorkerSpec) -> str:
    try:
        return Path(spec.log_path).read_text()
    except FileNotFoundError:
        return ""


def wait_log(spec: WorkerSpec, text: str) -> str:
    return wait_until(lambda: text in log_of(spec) and log_of(spec), f"{text!r} in the log")


def wait_grandchild(spec: WorkerSpec) -> int:
    """The pid the worker printed, once its whole line is in the log (a print may reach the
    file piece by piece: "grandchild" before its pid)."""
    found = wait_until(lambda: re.search(r"grandchild (\d+)\n", log_of(spec)),
                       "the grandchild's pid in the log")
    return int(found.group(1))


def collect(ex, *wids: str, timeout: float = 60.0) -> dict[str, WorkerExit]:
    """Poll until every one of ``wids`` was reported; fail on a second report of any worker."""
    seen: dict[str, WorkerExit] = {}

    def step() -> bool:
        for e in ex.poll():
            assert e.worker_id not in seen, f"{e.worker_id} reported twice"
            seen[e.worker_id] = e
        return all(w in seen for w in wids)

    wait_until(step, f"exits of {wids}", timeout)
    return seen


def running(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and not st.state.ended


def cleanup(ex: LocalExecutor) -> None:
    for wid in list(ex._workers):
        try:
            ex.signal(wid, "KILL")
        except ExecutorError:
            pass
    wait_until(lambda: (ex.poll(), not ex._workers)[1], "cleanup")


@pytest.fixture
def state(tmp_path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def executor(state):
    ex = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    yield ex
    cleanup(ex)
    ex.shutdown()


def test_exit_code_reported_once_with_log_and_resources_freed(executor, tmp_path):
    spec = make_spec(tmp_path, "j1-a1-w0", "print('hello from worker')\nraise SystemExit(3)",
                     cpus=2, memory_mib=1000)
    handle = executor.start(spec)
    assert handle.executor == "local" and handle.worker_id == spec.worker_id
    assert re.fullmatch(r"\d+:\d+", handle.ref) and handle.gpus == ()
    assert executor.free() == Resources(cpus=2, gpus=0, memory_mib=3096)
    exits = collect(executor, spec.worker_id)
    assert exits[spec.worker_id].exit_code == 3
    assert exits[spec.worker_id].signal is None
    assert "3" in exits[spec.worker_id].reason
    assert executor.poll() == []
    assert "hello from worker" in log_of(spec)
    assert executor.free() == executor.capacity()
    assert not executor.alive(spec.worker_id)
    status = executor.status_path(spec.worker_id)
    assert status.exists() and not list(status.parent.glob("*.tmp*"))


def test_term_reaches_the_worker(executor, tmp_path):
    spec = make_spec(tmp_path, "j2-a1-w0", TRAP_TERM.replace("CODE", "0"))
    executor.start(spec)
    wait_log(spec, "ready")
    assert executor.alive(spec.worker_id)
    executor.signal(spec.worker_id, "TERM")
    e = collect(executor, spec.worker_id)[spec.worker_id]
    assert (e.exit_code, e.signal) == (0, None)
    assert "got TERM" in log_of(spec)


def test_kill_is_reported_as_killed(executor, tmp_path):
    spec = make_spec(tmp_path, "j3-a1-w0", LONG)
    executor.start(spec)
    wait_log(spec, "ready")
    executor.signal(spec.worker_id, "KILL")
    e = collect(executor, spec.worker_id)[spec.worker_id]
    assert (e.exit_code, e.signal) == (None, 9)
    assert "SIGKILL" in e.reason
    with pytest.raises(ExecutorError, match="unknown worker"):
        executor.signal(spec.worker_id, "KILL")


def test_worker_killed_by_a_signal_of_its_own(executor, tmp_path):
    spec = make_spec(tmp_path, "j3b-a1-w0", "import os, signal\nos.kill(os.getpid(), 9)")
    executor.start(spec)
    e = collect(executor, spec.worker_id)[spec.worker_id]
    assert (e.exit_code, e.signal) == (None, 9)


def test_kill_takes_the_whole_process_group(executor, tmp_path):
    spec = make_spec(tmp_path, "j4-a1-w0", GRANDCHILD + "time.sleep(60)\n")
    executor.start(spec)
    pid = wait_grandchild(spec)
    assert running(pid)
    executor.signal(spec.worker_id, "KILL")
    collect(executor, spec.worker_id)
    wait_until(lambda: not running(pid), "the grandchild to die")


def test_leftover_processes_are_killed_when_the_exit_is_reported(executor, tmp_path):
    spec = make_spec(tmp_path, "j5-a1-w0", GRANDCHILD)  # exits 0, leaves `sleep 60` behind
    executor.start(spec)
    pid = wait_grandchild(spec)
    e = collect(executor, spec.worker_id)[spec.worker_id]
    assert e.exit_code == 0
    wait_until(lambda: not running(pid), "the leftover grandchild to die")


def test_cpu_accounting(state, tmp_path):
    ex = LocalExecutor(state, cpus=2, gpus=[], memory_mib=4096)
    try:
        a, b, c = (make_spec(tmp_path, f"j6-a1-w{i}", LONG) for i in range(3))
        ex.start(a)
        ex.start(b)
        with pytest.raises(ExecutorError) as err:
            ex.start(c)
        msg = str(err.value)
        assert "\n" not in msg
        assert "needs cpus=1 gpus=0 memory=64 MiB" in msg
        assert "free: cpus=0 gpus=0 memory=3968 MiB" in msg
        assert not ex.alive(c.worker_id) and not Path(c.log_path).exists()
        big = make_spec(tmp_path, "j6-a1-big", LONG, cpus=0.5, memory_mib=5000)
        with pytest.raises(ExecutorError, match="memory=5000 MiB"):
            ex.start(big)
        ex.signal(a.worker_id, "KILL")
        collect(ex, a.worker_id)
        ex.start(c)  # fits again once the exit was reported
        assert ex.free().cpus == 0
    finally:
        cleanup(ex)


def test_gpu_accounting_and_cuda_visible_devices(state, tmp_path):
    ex = LocalExecutor(state, cpus=8, gpus=[0, 1], memory_mib=4096)
    try:
        assert ex.capacity() == Resources(cpus=8, gpus=2, memory_mib=4096)
        g0, g1, g2 = (make_spec(tmp_path, f"j7-a1-g{i}", PRINT_GPUS, gpus=1,
                                env={"CUDA_VISIBLE_DEVICES": "7"}) for i in range(3))
        h0, h1 = ex.start(g0), ex.start(g1)
        assert (h0.gpus, h1.gpus) == ((0,), (1,))
        assert ex.free().gpus == 0
        with pytest.raises(ExecutorError, match=r"needs cpus=1 gpus=1 .*free: cpus=6 gpus=0"):
            ex.start(g2)  # both still hold their GPU until their exit is reported
        cpu = make_spec(tmp_path, "j7-a1-cpu", PRINT_GPUS)
        assert ex.start(cpu).gpus == ()
        collect(ex, g0.worker_id, g1.worker_id, cpu.worker_id)
        assert "CVD='0'" in log_of(g0)
        assert "CVD='1'" in log_of(g1)
        assert "CVD=''" in log_of(cpu)
        assert ex.start(g2).gpus == (0,)
        collect(ex, g2.worker_id)
        assert ex.free() == ex.capacity()
    finally:
        cleanup(ex)


def test_adopt_running_worker_after_restart(state, tmp_path):
    a = LocalExecutor(state, cpus=4, gpus=[0], memory_mib=4096)
    b = None
    try:
        spec = make_spec(tmp_path, "j8-a1-w0", TRAP_TERM.replace("CODE", "7"), gpus=1)
        stored = a.start(spec).to_dict()  # what the service keeps in its database
        wait_log(spec, "ready")
        a.shutdown()  # the "old service" stops watching; the worker keeps running
        b = LocalExecutor(state, cpus=4, gpus=[0], memory_mib=4096)
        handle = WorkerHandle.from_dict(stored)
        assert b.adopt(handle, spec) is True
        assert b.adopt(handle, spec) is True  # idempotent
        assert b.alive(spec.worker_id)
        assert b.free() == Resources(cpus=3, gpus=0, memory_mib=4032)
        assert b.poll() == []
        b.signal(spec.worker_id, "TERM")
        e = collect(b, spec.worker_id)[spec.worker_id]
        assert (e.exit_code, e.signal) == (7, None)
        assert "got TERM" in log_of(spec)
        assert b.free() == b.capacity()
    finally:
        if b is not None:
            cleanup(b)


def test_adopt_of_a_finished_worker_reports_its_recorded_exit(state, tmp_path):
    a = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    spec = make_spec(tmp_path, "j9-a1-w0", "print('done')")
    handle = a.start(spec)
    collect(a, spec.worker_id)  # reaped: the pid is gone
    b = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    assert b.adopt(handle, spec) is False
    assert not b.alive(spec.worker_id)
    assert b.free() == b.capacity()
    [e] = b.poll()
    assert (e.worker_id, e.exit_code, e.signal, e.reason) == (spec.worker_id, 0, None,
                                                              "exited with code 0")
    assert b.poll() == []


def test_a_worker_that_exits_while_no_service_watches_is_read_from_its_status(state, tmp_path):
    a = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    spec = make_spec(tmp_path, "j10-a1-w0", TRAP_TERM.replace("CODE", "5"))
    handle = a.start(spec)
    wait_log(spec, "ready")
    a.shutdown()  # the service dies; the worker and its supervisor live on
    os.killpg(int(handle.ref.split(":")[0]), 15)  # it ends while nobody watches
    status = a.status_path(spec.worker_id)
    wait_until(lambda: status.exists() and '"exit_code": 5' in status.read_text(),
               "the exit in the status file")
    b = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    ended = json.loads(status.read_text())["ended_at"]
    assert b.adopt(handle, spec) is False
    assert b.poll() == [WorkerExit(spec.worker_id, 5, None, "exited with code 5", ended)]


def test_a_worker_whose_handle_was_never_stored_is_found_by_its_id(state, tmp_path):
    a = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    spec = make_spec(tmp_path, "j10b-a1-w0", LONG)
    handle = a.start(spec)
    wait_log(spec, "ready")
    a.shutdown()
    b = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    try:
        assert b.find("j10b-a1-w1") is None  # never started
        assert b.find(spec.worker_id) == WorkerHandle(spec.worker_id, "local", handle.ref)
        assert b.adopt(b.find(spec.worker_id), spec) is True
        b.signal(spec.worker_id, "KILL")
        assert collect(b, spec.worker_id)[spec.worker_id].signal == 9
    finally:
        cleanup(b)


def test_exit_status_is_unknown_only_when_the_supervisor_died_too(state, tmp_path):
    a = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    spec = make_spec(tmp_path, "j10c-a1-w0", LONG)
    handle = a.start(spec)
    wait_log(spec, "ready")
    supervisor = a._link.proc
    supervisor.kill()
    supervisor.wait()
    a.signal(spec.worker_id, "KILL")
    [e] = collect(a, spec.worker_id).values()
    assert (e.exit_code, e.signal) == (None, None)
    assert "exit status unknown" in e.reason
    b = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
    assert b.adopt(handle, spec) is False
    assert "exit status unknown" in b.poll()[0].reason
    again = make_spec(tmp_path, "j10c-a2-w0", "print('fine')")
    a.start(again)  # a new supervisor takes over
    assert collect(a, again.worker_id)[again.worker_id].exit_code == 0


def test_adopt_refuses_a_reused_pid(state, tmp_path):
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        real_start = wait_until(lambda: read_stat(other.pid), "stat of sleep").start_ticks
        ex = LocalExecutor(state, cpus=4, gpus=[], memory_mib=4096)
        spec = make_spec(tmp_path, "j11-a1-w0", LONG)
        handle = WorkerHandle(spec.worker_id, "local", f"{other.pid}:{real_start + 1}")
        assert ex.adopt(handle, spec) is False
        assert not ex.alive(spec.worker_id)
        [e] = ex.poll()
        assert e.exit_code is None and "unknown" in e.reason
        assert other.poll() is None and running(other.pid)  # the unrelated process is untouched
    finally:
        other.kill()
        other.wait()


def test_adopt_rejects_foreign_or_malformed_handles(executor, tmp_path):
    spec = make_spec(tmp_path, "j12-a1-w0", LONG)
    with pytest.raises(ExecutorError, match="belongs to executor 'ray'"):
        executor.adopt(WorkerHandle(spec.worker_id, "ray", "x"), spec)
    with pytest.raises(ExecutorError, match="bad local ref"):
        executor.adopt(WorkerHandle(spec.worker_id, "local", "nonsense"), spec)


def test_start_errors_are_one_line_and_leave_nothing(executor, tmp_path):
    spec = make_spec(tmp_path, "j13-a1-w0", LONG)
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    for argv, cause in [(["no-such-program-xyz"], "no executable 'no-such-program-xyz' on PATH"),
                        (["/nonexistent/cmd"], "no executable '/nonexistent/cmd': no such file"),
                        ([str(script)], "is not executable"),
                        (["/bin/echo", "x" * 200_000] * 20, "Argument list too long")]:
        with pytest.raises(StartError, match=cause) as err:
            executor.start(WorkerSpec(**{**spec.__dict__, "argv": argv}))
        assert "\n" not in str(err.value)
    bad_cwd = WorkerSpec(**{**spec.__dict__, "cwd": str(tmp_path / "missing")})
    with pytest.raises(StartError, match="no working directory"):
        executor.start(bad_cwd)
    with pytest.raises(ExecutorError, match="worker id"):
        executor.start(WorkerSpec(**{**spec.__dict__, "worker_id": "../evil"}))
    assert executor.free() == executor.capacity() and executor.poll() == []
    executor.start(spec)
    with pytest.raises(ExecutorError, match="already exists"):
        executor.start(spec)
    with pytest.raises(ExecutorError, match="unknown signal"):
        executor.signal(spec.worker_id, "HUP")


def test_start_many_starts_what_it_can_and_says_why_not_for_the_rest(executor, tmp_path):
    specs = [make_spec(tmp_path, f"j16-a1-w{i}", "print('hi')") for i in range(3)]
    specs[1] = WorkerSpec(**{**specs[1].__dict__, "argv": ["/nonexistent/cmd"]})
    specs.append(make_spec(tmp_path, "j16-a1-big", LONG, cpus=8))
    first, missing, third, big = executor.start_many(specs)
    assert isinstance(first, WorkerHandle) and isinstance(third, WorkerHandle)
    assert isinstance(missing, StartError) and "/nonexistent/cmd" in str(missing)
    assert isinstance(big, ExecutorError) and "needs cpus=8" in str(big)
    exits = collect(executor, specs[0].worker_id, specs[2].worker_id)
    assert all(e.exit_code == 0 for e in exits.values())


def test_sent_starts_are_handed_over_once_before_their_exits_and_signals_wait(executor,
                                                                             tmp_path):
    # send_starts does not wait for the children to exec: until started() hands a worker over,
    # poll() keeps its exit back, and a signal waits for its pid (never killpg(0)).
    quick = WorkerSpec(**{**make_spec(tmp_path, "j18-a1-w0", "").__dict__, "argv": ["/bin/true"]})
    missing = WorkerSpec(**{**quick.__dict__, "worker_id": "j18-a1-w1",
                            "argv": ["/nonexistent/cmd"]})
    long = make_spec(tmp_path, "j18-a1-w2", LONG)
    executor.send_starts([quick, missing, long])
    executor.signal(long.worker_id, "TERM")
    wait_until(executor.status_path(quick.worker_id).exists, "the quick worker's exit recorded")
    assert executor.poll() == []
    executor.wait(60)  # an answer is there: returns at once
    results: dict = {}
    wait_until(lambda: results.update(executor.started()) or len(results) == 3, "the answers")
    assert isinstance(results[quick.worker_id], WorkerHandle)
    assert isinstance(results[missing.worker_id], StartError)
    assert results[long.worker_id].ref.partition(":")[0] != "0"
    assert executor.started() == {}
    exits = collect(executor, quick.worker_id, long.worker_id)
    assert exits[quick.worker_id].exit_code == 0
    assert exits[long.worker_id].signal == 15  # the TERM sent while it was pending


def test_wait_returns_at_once_for_an_exit_read_while_starting_another(executor, tmp_path):
    # The exit of the first worker reaches the service while it waits for the second's start
    # answer: wait() must hand it over now, not sleep on a pipe with nothing more to come.
    quick = WorkerSpec(**{**make_spec(tmp_path, "j17-a1-w0", "").__dict__, "argv": ["/bin/true"]})
    executor.start(quick)
    wait_until(executor.status_path(quick.worker_id).exists, "the first worker's exit recorded")
    executor.start(make_spec(tmp_path, "j17-a1-w1", LONG))
    started = time.monotonic()
    executor.wait(60)
    assert time.monotonic() - started < 10
    assert [e.worker_id for e in executor.poll()] == [quick.worker_id]


def test_cwd_and_env_are_applied(executor, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    spec = WorkerSpec(job_id="job", attempt=2, worker_id="j14-a2-w0",
                      argv=[PY, "-c", "import os\nprint(os.getcwd(), os.environ['FOO'])"],
                      env={"FOO": "bar"}, resources=Resources(), cwd=str(work),
                      log_path=str(tmp_path / "logs" / "j14.log"))
    executor.start(spec)
    assert collect(executor, spec.worker_id)[spec.worker_id].exit_code == 0
    assert f"{work} bar" in log_of(spec)


def test_defaults_come_from_this_machine(state):
    ex = LocalExecutor(state)
    cap = ex.capacity()
    assert cap.cpus == os.cpu_count()
    assert cap.memory_mib > 0 and cap.gpus >= 0


def test_the_assembly_builds_the_local_executor_with_its_options(state):
    setup = LocalExecutorSetup(warm_workers=0, coordinator_host="10.0.0.5")
    ex = setup.build(state)
    try:
        assert isinstance(ex, LocalExecutor) and ex.name == "local"
        assert ex.coordinator_host == "10.0.0.5"
    finally:
        ex.shutdown()
    default = setup.default_environment()
    assert default.name == "local" and default.desired_slots == default.max_slots == os.cpu_count()


def test_term_kills_a_worker_that_does_not_trap_it(executor, tmp_path):
    # the supervisor swallows TERM, but the worker must still get the default action
    spec = make_spec(tmp_path, "j15-a1-w0", LONG)
    executor.start(spec)
    wait_log(spec, "ready")
    executor.signal(spec.worker_id, "TERM")
    e = collect(executor, spec.worker_id)[spec.worker_id]
    assert (e.exit_code, e.signal) == (None, 15)
    assert "SIGTERM" in e.reason


def test_a_worker_pinned_to_kernels_its_host_cannot_run_is_refused_at_start(tmp_path):
    """An executor whose host runs only the baseline kernels (as a CPU without AVX2 does)
    refuses a worker pinned to avx2 in one line before anything starts, and starts one pinned
    to the baseline; left to itself, an executor's levels are what this machine's CPU runs."""
    old = LocalExecutor(tmp_path / "old", cpus=1, gpus=[], memory_mib=1024,
                        kernel_levels=[KernelLevel.DEFAULT])
    try:
        assert old.kernel_levels() == (KernelLevel.DEFAULT,)
        spec = dataclasses.replace(make_spec(tmp_path, "k1-a1-w0", LONG),
                                   cpu_kernels=KernelLevel.AVX2)
        with pytest.raises(StartError) as err:
            old.start(spec)
        assert str(err.value) == (
            f"host {socket.gethostname()} runs cpu kernels up to default, not the job's avx2: "
            "start the job with --cpu-kernels default (DYNTRAIN_CPU_KERNELS=default), a level "
            "every host runs")
        assert old.free() == old.capacity() and old.poll() == []
        baseline = dataclasses.replace(spec, worker_id="k1-a1-w1",
                                       cpu_kernels=KernelLevel.DEFAULT)
        old.start(baseline)
        old.signal(baseline.worker_id, "KILL")
        assert baseline.worker_id in collect(old, baseline.worker_id)
    finally:
        old.shutdown()
    here = LocalExecutor(tmp_path / "here", cpus=1, gpus=[], memory_mib=1024)
    assert here.kernel_levels() == tuple(host_levels())
    here.shutdown()
