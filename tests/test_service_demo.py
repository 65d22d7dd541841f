"""`make demo` as a newcomer meets it: it prints the dashboard's URL, which answers while the demo
runs, and Ctrl-C ends the demo's jobs (their workers run outside the demo's process) instead of
leaving them training behind a dead service."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from dyntrain.service.store import Store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_demo_prints_the_dashboard_url_and_ctrl_c_ends_its_jobs(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "examples" / "service_demo.py"), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()

    def wait_for(pattern: str, bound: float = 180) -> re.Match:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and proc.poll() is None:
            for line in list(lines):
                if m := re.search(pattern, line):
                    return m
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r}:\n{''.join(lines)[-3000:]}")

    try:
        url = wait_for(r"dashboard: (http://127\.0\.0\.1:\d+)/").group(1)
        page = httpx.get(url + "/", timeout=30)
        assert page.status_code == 200 and "Compute environments" in page.text
        train = wait_for(r"== submitted ([0-9a-f]{8})").group(1)
        wait_for(r"training (STARTING|RUNNING) .* workers \{'")  # its worker processes run
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    text = "".join(lines)
    assert "== interrupted: terminating the demo's jobs" in text and "Traceback" not in text, text
    store = Store(f"sqlite:///{out / 'state' / 'dyntrain.db'}")
    jobs = [j for j in store.list_jobs(limit=100) if j.array_parent_id is None]
    assert any(j.id.startswith(train) for j in jobs)
    for job in jobs:  # ended, and the service saw each worker exit before it stopped
        assert job.status.is_terminal(), (job.name, job.status, job.status_reason)
        assert store.list_workers(job.id) == [], job.name
