"""``dyntrain run --chaos``: strikes at the worst moments, through the real CLI, real signals."""

import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SCRIPTS, read_jsonl, run_held
from dyntrain.procstat import read_stat
from test_elastic_e2e import assert_exactly_once, max_param_diff

pytestmark = pytest.mark.slow

# 4 MB of optimizer state that only travels: hand-overs and checkpoint writes last a while
LEDGER = [SCRIPTS / "ledger_train.py", "--step-delay", "0.002", "--ballast-mb", "4"]


def worker_pids(stdout: str) -> dict[str, int]:
    return {w: int(pid) for w, pid in
            re.findall(r"worker (w\d+) \(\S+ pid (\d+)\) wants to join", stdout)}


def assert_no_stray_process(stdout: str) -> None:
    pids = worker_pids(stdout)
    assert pids, stdout[-2000:]
    for worker, pid in pids.items():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        stat = read_stat(pid)  # None: reaped since
        assert stat is None or stat.state.ended, \
            f"worker {worker} (pid {pid}) still runs after the job ended"


def strikes(out) -> int:
    """How many strikes the launcher made so far."""
    chaos = out / "chaos.jsonl"
    return len(read_jsonl(chaos)) if chaos.exists() else 0


def assert_like_static(out, static_ledger, proc) -> None:
    assert "job finished" in proc.stdout, proc.stdout[-3000:]
    assert_exactly_once(out)
    assert max_param_diff(static_ledger, out) == 0.0
    assert_no_stray_process(proc.stdout)


@pytest.mark.parametrize("aim", ["sender", "receiver"])
def test_kill_the_sender_or_the_joiner_during_the_state_hand_over(tmp_path, static_ledger, aim):
    # w0 trains alone; w1 joins at step 20 and w0 hands it the state (model, optimizer with the
    # ballast): the sender (then w1 has nothing and the job resumes from the newest
    # checkpoint) or the joiner (then w0 goes on alone) is SIGKILLed in the middle
    # (32 MB of ballast and chunks held slow: the hand-over and the new world's first step, the
    # window the launcher must see, last a few of its ticks even on a loaded machine; once the
    # strike is made the job finishes at full speed)
    out, hold = tmp_path / "run", tmp_path / "hold"
    proc = run_held(tmp_path / "launcher.log", [
        "--workers", "1:2", "--nproc", "1", "--out", out, "--events", "step=20:join=1",
        "--chaos", f"0:1:{aim}", LEDGER[0], "--step-delay", "0.002", "--ballast-mb", "32",
        "--checkpoint-every", "20", "--slow-while", hold], hold,
        lambda: strikes(out) >= 1, "the strike")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "chaos: 1 of 1 strikes made" in proc.stdout, proc.stdout[-3000:]
    [strike] = read_jsonl(out / "chaos.jsonl")
    assert (strike["action"], strike["aim"]) == ("kill", aim)
    assert strike["workers"] == (["w0"] if aim == "sender" else ["w1"]), proc.stdout
    events = read_jsonl(out / "events.jsonl")
    crash = next(e for e in events if e["event"] == "crash")
    assert crash["workers"] == strike["workers"]
    if aim == "sender":  # nobody held the state: the newest checkpoint carried it
        assert any(e["event"] == "resume" and e["start_step"] >= 20 for e in events), events
    assert_like_static(out, static_ledger, proc)


# one seed per run of the suite (a new one each time: the bench runs 100 strikes)
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(min_value=0, max_value=2**16))
def test_random_strikes_without_waiting_end_like_the_static_run(tmp_path_factory, static_ledger,
                                                               seed):
    out = tmp_path_factory.mktemp("chaos")
    # chunks held slow until three strikes were made: the job lasts long enough for them even
    # on a quiet machine, then goes on at full speed (the launcher says how many it made when
    # the job ends first)
    proc = run_held(out.parent / f"{out.name}.log", [
        "--workers", "1:3", "--nproc", "2", "--failure-timeout", "2", "--out", out, "--chaos",
        f"{seed}:5", LEDGER[0], "--step-delay", "0.002", "--ballast-mb", "4", "--slow-while",
        out.parent / f"{out.name}.hold"], out.parent / f"{out.name}.hold",
        lambda: strikes(out) >= 3, "three strikes")
    assert proc.returncode == 0, proc.stdout[-3000:]
    made = len(read_jsonl(out / "chaos.jsonl"))
    assert made >= 3, proc.stdout[-3000:]
    assert f"chaos: {made} of 5 strikes made" in proc.stdout
    assert_like_static(out, static_ledger, proc)
