"""`make demo` as a newcomer meets it: it prints the dashboard's URL, which answers while the demo
runs, and Ctrl-C ends the demo's jobs (their workers run outside the demo's process) instead of
leaving them training behind a dead service."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from dyntrain.service.store import Store
from dyntrain.testing.wait import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def demo_process(argv: list[str], cwd: Path):
    """``python -u ARGV`` with Ctrl-C as in a terminal, its output collected line by line;
    yields (process, lines) and kills the process if it is still there when the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-u", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, cwd=cwd, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)


def test_demo_prints_the_dashboard_url_and_ctrl_c_ends_its_jobs(tmp_path):
    out = tmp_path / "demo"
    with demo_process([str(ROOT / "examples" / "service_demo.py"), "--out", str(out)],
                      tmp_path) as (proc, lines):
        url = wait_for_line(proc, lines, r"dashboard: (http://127\.0\.0\.1:\d+)/").group(1)
        page = httpx.get(url + "/", timeout=30)
        assert page.status_code == 200 and "Compute environments" in page.text
        train = wait_for_line(proc, lines, r"== submitted ([0-9a-f]{8})").group(1)
        # its worker processes run
        wait_for_line(proc, lines, r"training (STARTING|RUNNING) .* workers \{'")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == 130
    text = "".join(lines)
    assert "== interrupted: terminating the demo's jobs" in text and "Traceback" not in text, text
    store = Store(f"sqlite:///{out / 'state' / 'dyntrain.db'}")
    jobs = [j for j in store.jobs.list_jobs(limit=100) if j.array_parent_id is None]
    assert any(j.id.startswith(train) for j in jobs)
    for job in jobs:  # ended, and the service saw each worker exit before it stopped
        assert job.status.is_terminal(), (job.name, job.status, job.status_reason)
        assert store.workers.list_workers(job.id) == [], job.name



def test_the_demo_ends_with_a_summary_and_keeps_its_dashboard_up_until_ctrl_c(tmp_path):
    """A short run of the whole demo: the summary (bitwise identical to the static run, the
    cost per capacity type), then the service stays up with its URL printed again; the
    finished job's page answers; Ctrl-C stops it with the demo's verdict (0)."""
    out = tmp_path / "demo"
    with demo_process([str(ROOT / "examples" / "service_demo.py"), "--out", str(out),
                       "--epochs", "1"], tmp_path) as (proc, lines):
        up = wait_for_line(proc, lines, r"== the service stays up: dashboard (http://\S+)/ \(the "
                           r"training job: (\S+)\); Ctrl-C stops it", bound=240)
        text = "".join(lines)
        assert "max |elastic - static| over all parameters = 0 (identical)" in text, text
        assert re.search(r"cost \d+\.\d{4} for \d+ worker-seconds \(.*SPOT \d+\.\d{4} \(\d+ "
                         r"worker-s\)", text), text
        page = httpx.get(up.group(2), timeout=30)
        assert page.status_code == 200 and "digits-elastic" in page.text
        assert proc.poll() is None  # still serving
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
    assert "Traceback" not in "".join(lines)


def wait_for_line(proc, lines: list[str], pattern: str, bound: float = 180) -> re.Match:
    """The first line the demo printed that matches ``pattern``, waiting up to ``bound`` s."""
    seen = wait_until(lambda: "".join(lines), f"a line matching {pattern!r}", bound, 0.1,
                      until=lambda text: re.search(pattern, text, re.M),
                      unless=lambda: proc.poll() is not None and
                      f"the demo exited with {proc.returncode}")
    return re.search(pattern, seen, re.M)

def load_demo():
    """examples/service_demo.py as a module (its functions: the demo's own setup)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("service_demo",
                                                  ROOT / "examples" / "service_demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def test_the_demo_job_spills_onto_on_demand_when_spot_and_reserved_are_gone(tmp_path):
    """What the demo promises: its training queue goes spot -> reserved -> on-demand. With the
    spot and reserved capacity taken away, the job runs on on-demand workers (not at world 1
    beside idle on-demand slots), and the summary's cost shows the on-demand spill."""

    demo = load_demo()
    service, server, url = demo.start_service(tmp_path / "state")
    client = demo.Client(url)
    job_id = None
    try:
        demo.setup(client)
        job_id = demo.submit_training(client, epochs=30)["id"]

        def running_on(envs: set[str]):
            job = client.get_job(job_id)
            on = {w["compute_environment"] for w in job.get("workers", [])
                  if w["state"] == "RUNNING"}
            return job if job["status"] == "RUNNING" and job.get("progress") and on \
                and on <= envs else None

        wait_until(lambda: running_on({"spot", "reserved"}), "the job running on spot and reserved",
                   timeout=180, poll=0.5)
        client.set_capacity_trace("spot", "offset_s,slots\n0,0\n")  # every spot slot reclaimed
        client.update_compute_environment("reserved", desired_slots=0)  # the pool taken back
        job = wait_until(lambda: running_on({"ondemand"}), "the job running on on-demand only",
                         timeout=180, poll=0.5)
        step = job["progress"]["step"]
        wait_until(lambda: (client.get_job(job_id).get("progress") or {}).get("step", 0) > step,
                   "a step on on-demand workers", timeout=120, poll=0.5)
        client.terminate(job_id)
        client.wait(job_id, timeout=180)
        line = demo.cost_line(client.cost(job_id))
        spill = re.search(r"ON_DEMAND \d+\.\d{4} \((\d+) worker-s\)", line)
        assert spill and int(spill.group(1)) > 0, line
    finally:
        if job_id is not None and client.get_job(job_id)["status"] not in ("SUCCEEDED", "FAILED"):
            client.terminate(job_id)  # its workers run outside this process
            client.wait(job_id, timeout=180)
        server.should_exit = True
        service.stop()


def test_the_serving_demo_stops_quietly_on_sigterm_as_on_ctrl_c(capsys):
    """While the demo serves its dashboard, SIGTERM (a container stopped, ``kill``) ends the
    wait as Ctrl-C does (the test above): the demo's closing line, no traceback. The demo's
    wait runs here, in this process's main thread (where signal handlers run); the signal
    comes from another thread once the demo says that it serves."""
    demo = load_demo()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    said: list[str] = []
    failed: list[BaseException] = []

    def kill_when_serving() -> None:  # the signal comes in any case: the wait always ends
        try:
            wait_until(lambda: said.append(capsys.readouterr().out) or "".join(said),
                       "the demo to say that it serves", 120, 0.05,
                       until=lambda text: "== the service stays up" in text)
        except BaseException as exc:
            failed.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=kill_when_serving, daemon=True)
    killer.start()
    try:
        demo.serve_until_interrupted("http://127.0.0.1:1", "job-1")
        killer.join(timeout=60)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if failed:
        raise failed[0]
    text = "".join(said) + capsys.readouterr().out
    assert "== the service stays up" in text and "== stopping the service" in text, text
    assert "Traceback" not in text, text
