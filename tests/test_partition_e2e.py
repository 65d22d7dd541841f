"""A worker that was cut off and comes back changes nothing: real processes, real gloo, signals.

A member is frozen (SIGSTOP) for longer than the failure timeout while its generation sums a
step with it: the others find its heartbeat gone, abandon the generation and train on without
it. Then it wakes up (SIGCONT) in the middle of the collectives it was frozen in, while the
others train. Nothing it sends may reach them (before the fence, it changed the survivors'
gradients: max |diff| 166 and 758 against the static run in two trials), and it may write
nothing: the job ends bitwise equal to the static run with every sample applied exactly once. The
woken worker learns that it was declared dead and starts over as a new worker, re-admitted with
the state handed over afresh.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import DYNTRAIN, ROOT, SCRIPTS, read_jsonl, wait_for
from test_elastic_e2e import assert_exactly_once, max_param_diff, world_sizes

pytestmark = pytest.mark.slow

LEDGER = str(SCRIPTS / "ledger_train.py")


def rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return read_jsonl(path) if path.exists() else []


def events(out: Path) -> list[dict]:
    path = out / "events.jsonl"
    return read_jsonl(path) if path.exists() else []


@pytest.mark.parametrize("frozen", ["worker", "leader"])
def test_a_frozen_member_that_comes_back_is_fenced_and_rejoins(tmp_path, static_ledger, frozen):
    out, hold = tmp_path / "run", tmp_path / "hold"
    hold.touch()  # each chunk takes 50 ms more until the test has seen the re-admission
    script = [LEDGER, "--slow-while", str(hold)]
    # the frozen one joins with `dyntrain worker` (a local worker found dead is killed by the
    # launcher): after the local one (worker), or first and the local one then (leader)
    local = ["--nproc", "1"] if frozen == "worker" else ["--nproc", "0", "--events", "t=0:join=1"]
    launcher = subprocess.Popen(
        [*DYNTRAIN, "run", "--workers", "1:2", *local, "--failure-timeout", "2",
         "--out", str(out), *script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, cwd=ROOT)
    procs = [launcher]
    try:
        address = re.search(r"--coordinator (\S+)", launcher.stdout.readline()).group(1)
        with open(tmp_path / "cut.log", "w") as log:
            cut = subprocess.Popen([*DYNTRAIN, "worker", "--coordinator", address, *script],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        procs.append(cut)
        wait_for(lambda: any(r["world_size"] == 2 for r in rows(out)), "a step of world 2")
        leader = events(out)[0]["workers"][0]
        os.kill(cut.pid, signal.SIGSTOP)
        crash = wait_for(lambda: [e for e in events(out) if e["event"] == "crash"],
                         "the others to go on without the frozen worker")[0]
        seen = len(rows(out))
        wait_for(lambda: len(rows(out)) >= seen + 2, "two steps without it")
        os.kill(cut.pid, signal.SIGCONT)
        again = f"{crash['workers'][0]}.r1"
        wait_for(lambda: any(e["event"] == "join" and e["workers"] == [again]
                             for e in events(out)), f"{again} to be re-admitted", timeout=180)
        hold.unlink()
        rest = launcher.communicate(timeout=240)[0]
        cut.wait(timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert launcher.returncode == 0, rest[-3000:]
    woke = (tmp_path / "cut.log").read_text()
    assert cut.returncode == 0, woke[-3000:]
    assert "was declared dead (no heartbeat for 2 s) while it was cut off" in woke, woke[-2000:]
    assert f"starting over as the new worker {again}" in woke
    assert (leader == crash["workers"][0]) == (frozen == "leader")
    assert [e["event"] for e in events(out)] == ["start", "join", "crash", "join"]
    assert 2 in world_sizes(out)[2:]  # trained on together after the re-admission
    assert_exactly_once(out)
    assert max_param_diff(static_ledger, out) == 0.0
