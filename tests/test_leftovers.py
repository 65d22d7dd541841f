"""No process of a run outlives its launcher or its worker, whatever kills it and whenever: real
launchers, workers and loader processes, real signals; each run's processes are found by a mark
in their environment (``dyntrain.testing.leftovers``) and waited for until none is left."""

import os
import signal
import subprocess

import pytest

from conftest import DYNTRAIN, ROOT, SCRIPTS, read_jsonl
from dyntrain.procstat import ProcState, read_stat
from dyntrain.testing.leftovers import children, kill_marked, marked, marked_env, new_mark
from dyntrain.testing.wait import wait_until

# A process killed by the kernel (its parent's death, a group's SIGKILL) is gone at once; this
# leaves a loaded machine room to schedule the exits. The workers of a launcher that is gone
# give up on its coordinator only after their connect timeout (30 s), and a loader process whose
# results fill the pipe to a dead worker never ends: either would be left past it.
GONE_WITHIN = 15.0
LOADER = "pt_data_worker"  # the name torch gives a DataLoader process
IMAGE = SCRIPTS / "image_train.py"
# 64x64 images: a chunk (8 of them, 128 KiB) does not fit a pipe's buffer, so a loader process
# that got ahead of its worker waits to write it
IMAGE_ARGS = ["--size", "64", "--steps", "40", "--loader-workers", "2"]


@pytest.fixture
def mark():
    mark = new_mark()
    yield mark
    kill_marked(mark)  # whatever a failed test left


def launch(mark: str, tmp_path, args, env=None) -> tuple[subprocess.Popen, object]:
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*DYNTRAIN, "run", "--out", str(tmp_path / "run"), *map(str, args)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=marked_env(mark, {**os.environ, "PYTHONUNBUFFERED": "1",
                                                      **(env or {})}))
    return proc, log


def assert_none_left(mark: str, what: str) -> None:
    wait_until(lambda: not marked(mark), f"no process of the run left {what}",
             timeout=GONE_WITHIN)


def assert_gone(pids: list[int], what: str) -> None:
    wait_until(lambda: all(read_stat(p) is None or read_stat(p).state.ended for p in pids),
             f"{what} ({pids}) gone", timeout=GONE_WITHIN)


def steps(tmp_path) -> int:
    metrics = tmp_path / "run" / "metrics.jsonl"
    return len(read_jsonl(metrics)) if metrics.exists() else 0


def with_loaders(procs, stopped: bool):
    """The training workers among ``procs`` that have loader processes, stopped or not."""
    return [p for p in procs if (p.state is ProcState.STOPPED) == stopped
            and any(c.comm == LOADER for c in children(procs, p.pid))]


@pytest.mark.parametrize("fork_server", ["1", "0"])
def test_a_launcher_killed_while_its_workers_start_leaves_no_process(tmp_path, mark,
                                                                     fork_server):
    """SIGKILL to the launcher right after it started its workers (forked by the fork server,
    or new interpreters still importing torch), still loading their script's data: they, and
    the server, die with it."""
    launcher, log = launch(mark, tmp_path, ["--workers", "1:3", "--nproc", "3", "--quiet",
                                            IMAGE, *IMAGE_ARGS],
                           env={"DYNTRAIN_FORKSERVER": fork_server})
    logs = tmp_path / "run" / "logs"
    wait_until(lambda: (logs / "worker-w2.log").exists() and len(marked(mark)) >= 4,
             "the launcher starting its three workers")
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert_none_left(mark, "after its launcher was SIGKILLed during start-up")


def test_a_launcher_killed_during_training_leaves_no_process_not_even_a_frozen_worker(
        tmp_path, mark):
    """SIGKILL to the launcher of a job whose workers train with loader processes, one of them
    frozen (SIGSTOP) and not yet declared dead (the other waits for it in the step): every
    process of the run dies with it."""
    hold = tmp_path / "hold"
    hold.touch()
    launcher, log = launch(mark, tmp_path, [
        "--workers", "1:2", "--nproc", "2", "--failure-timeout", "600",
        "--events", "step=2:hang=1", IMAGE, *IMAGE_ARGS, "--hold", hold])
    wait_until(lambda: with_loaders(marked(mark), stopped=True)
             and with_loaders(marked(mark), stopped=False),
             "a frozen worker with its loader processes, and one training with its own")
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert_none_left(mark, "after its launcher was SIGKILLed during training")


def test_the_loader_processes_of_a_killed_or_frozen_worker_die_with_it(tmp_path, mark):
    """A worker declared dead while frozen (SIGSTOP, then killed by the launcher) and a worker
    SIGKILLed from outside leave none of their loader processes; the job trains on, ends, and
    leaves no process."""
    hold = tmp_path / "hold"
    hold.touch()
    launcher, log = launch(mark, tmp_path, [
        "--workers", "1:3", "--nproc", "3", "--failure-timeout", "2",
        "--events", "step=2:hang=1", IMAGE, *IMAGE_ARGS, "--hold", hold])
    frozen = wait_until(lambda: with_loaders(marked(mark), stopped=True), "a frozen worker")[0]
    loaders = [c.pid for c in children(marked(mark), frozen.pid)]
    assert_gone([frozen.pid, *loaders], "the frozen worker, declared dead, and its loaders")

    wait_until(lambda: steps(tmp_path) >= 4 and len(with_loaders(marked(mark), False)) == 2,
             "the two others training with their loader processes")
    procs = marked(mark)
    victim = with_loaders(procs, stopped=False)[0]
    loaders = [c.pid for c in children(procs, victim.pid)]
    os.kill(victim.pid, signal.SIGKILL)
    assert_gone(loaders, "the loader processes of a SIGKILLed worker")

    hold.unlink()
    assert launcher.wait(timeout=240) == 0, log.read_text()[-3000:]
    crashes = [e for e in read_jsonl(tmp_path / "run" / "events.jsonl") if e["event"] == "crash"]
    assert len(crashes) == 2, log.read_text()[-3000:]
    assert_none_left(mark, "after the job ended")
