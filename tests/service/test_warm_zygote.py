"""Warm workers forked by the supervisor's zygote: each the supervisor's own child, in its own
session, recorded like a cold worker; a dead zygote means cold starts; nothing outlives the end.

These talk to the supervisor directly (``SupervisorLink``): its "started" answers say whether a
worker started warm, which the executor does not pass on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from dyntrain.service.executors.supervisor import SupervisorLink
from dyntrain.testing.wait import wait_until

PY = sys.executable
JOB = """import json, os, sys, time
print("torch already imported:", "torch" in sys.modules, flush=True)
print(json.dumps({"ppid": os.getppid(), "session_leader": os.getsid(0) == os.getpid(),
                  "group_leader": os.getpgid(0) == os.getpid()}), flush=True)
if sys.argv[1] == "wait":
    time.sleep(120)
sys.exit(int(sys.argv[1]))
"""
ZYGOTE_READY = re.compile(r"dyntrain warm zygote (\d+) ready")
WORKER_READY = re.compile(r"dyntrain warm worker (\d+) ready")


class Supervised:
    """A supervisor with a warm pool, and what its workers wrote."""

    def __init__(self, tmp_path: Path, warm: int) -> None:
        self.dir = tmp_path
        (tmp_path / "state").mkdir()
        (tmp_path / "job.py").write_text(JOB)
        self.link = SupervisorLink(tmp_path / "state", warm=warm)
        self.supervisor_log = tmp_path / "state" / "supervisor.log"
        self.pids: list[int] = []  # of the workers started

    def request(self, args: dict[str, str]) -> dict[str, dict]:
        """Start one worker per ``id -> argument`` at once, each asking for a warm worker."""
        answers = self.link.request([
            {"op": "start", "id": wid, "argv": [PY, str(self.dir / "job.py"), arg],
             "env": dict(os.environ), "cwd": None, "log": str(self.dir / f"{wid}.log"),
             "status": str(self.dir / f"{wid}.status.json"), "warm": True}
            for wid, arg in args.items()])
        self.pids += [a["pid"] for a in answers.values() if "pid" in a]
        return answers

    def log(self, wid: str) -> list[str]:
        path = self.dir / f"{wid}.log"
        return path.read_text().splitlines() if path.exists() else []

    def said(self, pattern: re.Pattern) -> list[int]:
        text = self.supervisor_log.read_text() if self.supervisor_log.exists() else ""
        return [int(pid) for pid in pattern.findall(text)]

    def exits(self) -> dict[str, dict]:
        self.link.drain(0.1)
        return {e["id"]: e for e in self.link.exits}

    def pool_ready(self, workers: int) -> int:
        """Wait until the zygote and ``workers`` forked workers said ready; the zygote's pid."""
        wait_until(lambda: len(self.said(WORKER_READY)) >= workers and self.said(ZYGOTE_READY),
                   "the zygote and its first warm workers")
        return self.said(ZYGOTE_READY)[0]

    def close(self) -> None:
        """End the supervisor's input; a worker still waiting (a failed test) is killed."""
        self.link.close()
        for pid in filter(alive, self.pids):
            os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: self.link.proc.poll() is not None, "the supervisor to exit")


def holds_stdin_of(holder: int, pid: int) -> bool:
    """Whether process ``holder`` has an end of the pipe that is process ``pid``'s stdin."""
    def target(link: str) -> str:
        try:
            return os.readlink(link)
        except OSError:
            return ""
    stdin = target(f"/proc/{pid}/fd/0")
    held = {target(f"/proc/{holder}/fd/{fd}") for fd in os.listdir(f"/proc/{holder}/fd")}
    return stdin.startswith("pipe:") and stdin in held


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is no zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_workers_started_together_all_start_warm_as_the_supervisors_children(tmp_path):
    s = Supervised(tmp_path, warm=1)
    try:
        assert s.request({"w0": "0"})["w0"]["warm"] is False  # it starts the zygote
        s.pool_ready(1)
        answers = s.request({"w1": "1", "w2": "2", "w3": "0", "w4": "wait"})
        assert [a["op"] for a in answers.values()] == ["started"] * 4, answers
        assert all(a["warm"] for a in answers.values()), answers  # not just the ready one
        assert len({a["pid"] for a in answers.values()}) == 4
        for wid in answers:
            wait_until(lambda wid=wid: len(s.log(wid)) >= 2, f"{wid} to start")
            assert s.log(wid)[0] == "torch already imported: True"
            assert json.loads(s.log(wid)[1]) == {"ppid": s.link.proc.pid, "session_leader": True,
                                                 "group_leader": True}
        os.killpg(answers["w4"]["pid"], signal.SIGTERM)
        ended = wait_until(lambda: (lambda e: e if len(e) == 5 else None)(s.exits()), "the exits")
        assert [ended[w]["exit_code"] for w in ("w0", "w1", "w2", "w3")] == [0, 1, 2, 0]
        assert ended["w4"]["signal"] == signal.SIGTERM and ended["w4"]["exit_code"] is None
        for wid, answer in answers.items():
            status = json.loads((tmp_path / f"{wid}.status.json").read_text())
            assert (status["pid"], status["start_time"]) == (answer["pid"], answer["start_time"])
            assert status["exit_code"] == ended[wid]["exit_code"]
    finally:
        s.close()


@pytest.mark.slow
def test_a_killed_zygote_means_cold_starts_that_still_run_and_are_recorded(tmp_path):
    s = Supervised(tmp_path, warm=1)
    try:
        s.request({"w0": "0"})
        zygote = s.pool_ready(1)
        forked = s.said(WORKER_READY)[0]  # (it says so before the zygote sent it over)
        wait_until(lambda: holds_stdin_of(s.link.proc.pid, forked), "the supervisor to hold it")
        os.kill(zygote, signal.SIGKILL)
        wait_until(lambda: "start cold from now on" in s.supervisor_log.read_text(), "the log line")
        wait_until(lambda: not alive(zygote), "the zygote to be reaped")
        answers = s.request({"w1": "3", "w2": "4", "w3": "5"})
        # the one forked before stays usable; the others start cold
        assert [a["warm"] for a in answers.values()] == [True, False, False], answers
        ended = wait_until(lambda: (lambda e: e if len(e) == 4 else None)(s.exits()), "the exits")
        assert [ended[w]["exit_code"] for w in ("w1", "w2", "w3")] == [3, 4, 5]
        assert [s.log(w)[0] for w in ("w1", "w2", "w3")] == [
            "torch already imported: True"] + ["torch already imported: False"] * 2
        assert len(s.said(WORKER_READY)) == 1  # no fork after the zygote died
    finally:
        s.close()


@pytest.mark.slow
def test_a_zygote_that_cannot_import_torch_means_cold_starts(tmp_path, monkeypatch):
    broken = tmp_path / "broken" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('no torch here')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))  # the zygote's, not the supervisor's
    s = Supervised(tmp_path, warm=1)
    try:
        s.request({"w0": "0"})
        wait_until(lambda: "start cold from now on" in s.supervisor_log.read_text(), "the log line")
        assert "no torch here" in s.supervisor_log.read_text()
        answers = s.request({"w1": "1", "w2": "2"})
        assert [a["warm"] for a in answers.values()] == [False, False], answers
        ended = wait_until(lambda: (lambda e: e if len(e) == 3 else None)(s.exits()), "the exits")
        assert [ended[w]["exit_code"] for w in ("w1", "w2")] == [1, 2]
    finally:
        s.close()


@pytest.mark.slow
def test_nothing_is_left_behind_when_the_supervisors_input_ends(tmp_path):
    s = Supervised(tmp_path, warm=2)
    s.request({"w0": "0"})
    zygote = s.pool_ready(2)
    running = s.request({"w1": "wait"})["w1"]
    assert running["warm"] is True
    wait_until(lambda: len(s.said(WORKER_READY)) >= 3, "the refill")  # at once, not 2 s later
    s.link.close()
    everyone = [zygote, *s.said(WORKER_READY)]
    wait_until(lambda: not any(alive(pid) for pid in everyone if pid != running["pid"]),
               "the zygote and the idle warm workers to exit")
    assert alive(running["pid"]) and s.link.proc.poll() is None  # it still records w1
    os.killpg(running["pid"], signal.SIGKILL)
    wait_until(lambda: s.link.proc.poll() is not None, "the supervisor to exit")
    status = json.loads((tmp_path / "w1.status.json").read_text())
    assert status["signal"] == signal.SIGKILL
    assert not any(alive(pid) for pid in [s.link.proc.pid, *everyone])
