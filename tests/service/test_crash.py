"""Exactly once across service crashes, the way a user would break it: a real `dyntrain server`
SIGKILLed twice while short jobs run, some of which finish while it is down; restarted on the
same state directory each time. Every job SUCCEEDED, and every job's command started once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from service_crash import run_trial  # noqa: E402


@pytest.mark.slow
def test_jobs_run_exactly_once_through_two_server_sigkills(tmp_path):
    r = run_trial(tmp_path, jobs=40, slots=4, kills=2, job_seconds=0.3, timeout=120)
    assert r["not_succeeded"] == [] and r["succeeded"] == 40, r
    assert r["ran_twice"] == 0 and r["never_ran"] == 0, r
    assert r["attempts_over_1"] == 0, r
    assert r["finished_while_down"] >= 1, r  # their exits were read back from their records
    assert r["recovered_notes"] >= 2, r
