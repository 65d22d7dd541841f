"""The dashboard in a real browser (Debian's Chromium through Playwright) against a real
``dyntrain server`` process (with a token) running a real elastic training job.

One server, one elastic digits job and one browser are shared by the module's tests, which run
in order: a wrong token is refused, the overview lists the job, its page follows the world size
through a capacity change made on the overview and shows its logs, and cancel and terminate work
from the pages. Skipped, with the reason, where no Chromium or Playwright can be found (the
Makefile's test set-up installs Debian's ``chromium`` when it can).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import server_url
from dyntrain.service.client import Client
from dyntrain.testing.screenshots import find_chromium

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "browser-test-token"
SLOT = {"cpus": 0.25, "gpus": 0, "memory_mib": 512}
WAIT_MS = 90_000  # bound on each awaited condition; met in seconds on a quiet machine

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright for Python is not installed (pip install -e .[dev])")
if find_chromium() is None:
    pytest.skip("no Chromium: `apt-get install -y chromium` (make test does it when it can), or "
                "set DYNTRAIN_CHROMIUM", allow_module_level=True)
expect = playwright_api.expect
expect.set_options(timeout=WAIT_MS)


def spawn_server(state: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("DYNTRAIN_URL", "DYNTRAIN_TOKEN")}
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dyntrain.cli.main", "server", "--port", "0", "--state-dir",
             str(state), "--token", TOKEN, "--grace-seconds", "2"],
            stdout=out, stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=ROOT)


def setup_jobs(url: str) -> tuple[str, str]:
    """A SPOT environment with 1 of 2 slots and an elastic digits job on it (1-2 workers); a
    job in a queue whose environment has no slot, which waits."""
    with Client(url, token=TOKEN) as client:
        client.create_compute_environment(
            name="spot", capacity_type="SPOT", price_per_slot_hour=0.35, slot=SLOT,
            min_slots=0, desired_slots=1, max_slots=2)
        client.create_compute_environment(
            name="none", capacity_type="ON_DEMAND", price_per_slot_hour=1.0, slot=SLOT,
            min_slots=0, desired_slots=0, max_slots=1)
        client.create_job_queue(name="train", priority=10, compute_environments=["spot"])
        client.create_job_queue(name="idle", priority=1, compute_environments=["none"])
        train = client.submit(
            queue="train", name="digits-elastic", resources=SLOT, workers=(1, 2),
            command=["sh", "-c", f"echo hello from $DYNTRAIN_WORKER_ID; exec "
                     f"{sys.executable} -m dyntrain.workloads.digits --epochs 200 "
                     "--global-batch 64 --chunk-size 8 --step-delay 0.02"])
        waiting = client.submit(queue="idle", name="waits-forever", resources=SLOT,
                                command=["true"])
    return train["id"], waiting["id"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from dyntrain.testing.screenshots import chromium

    tmp = tmp_path_factory.mktemp("browser")
    log = tmp / "server.log"
    proc = spawn_server(tmp / "state", log)
    try:
        with chromium() as browser:  # starts while the server starts
            url = server_url(proc, log)
            train, waiting = setup_jobs(url)
            with Client(url, token=TOKEN) as client:
                yield {"url": url, "browser": browser, "train": train, "waiting": waiting,
                       "client": client, "log": log}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@pytest.fixture
def page(site):
    p = site["browser"].new_page()
    p.set_default_timeout(WAIT_MS)
    yield p
    p.close()


def test_a_wrong_token_is_refused_and_the_right_one_opens_the_dashboard(site, page):
    assert f"dashboard: {site['url']}/" in site["log"].read_text()  # the server says where
    page.goto(site["url"] + "/")
    assert "/ui/login" in page.url  # no session: the login page, not the dashboard
    status = page.evaluate("fetch('/jobs', {headers: {Authorization: 'Bearer nope'}})"
                           ".then(r => r.status)")
    assert status == 401
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("wrong token")
    assert "/ui/login" in page.url
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(site["url"] + "/")
    expect(page.locator("h2", has_text="Compute environments")).to_be_visible()


def test_overview_lists_the_running_job_and_why_the_other_waits(site, page):
    page.goto(site["url"] + "/")
    row = page.locator(f'tr[data-job="{site["train"]}"]')
    expect(row).to_contain_text("digits-elastic")
    expect(row.locator(".status")).to_have_text("RUNNING")  # live: no reload needed
    waiting = page.locator(f'tr[data-job="{site["waiting"]}"]')
    expect(waiting).to_contain_text("RUNNABLE")
    expect(waiting.locator("td.reason")).to_contain_text("#1")


def test_job_page_follows_the_world_size_after_a_capacity_change_and_shows_logs(site, page):
    page.goto(f"{site['url']}/ui/jobs/{site['train']}")
    changes = page.locator("#membership tbody tr")
    expect(changes.first).to_contain_text("start")
    expect(page.locator("#log")).to_contain_text("hello from")
    expect(page.locator("#world-chart canvas")).to_have_count(1)
    page.evaluate("window.notReloaded = true")

    overview = site["browser"].new_page()
    overview.set_default_timeout(WAIT_MS)
    overview.goto(site["url"] + "/")
    form = overview.locator('form[data-env="spot"]')
    form.locator("input").fill("2")
    form.locator("button").click()
    expect(overview.locator("#flash")).to_contain_text("spot: desired 2")
    overview.close()

    join = page.locator("#membership tbody tr", has_text="join")
    expect(join).to_contain_text("1 → 2")
    expect(page.locator("#world-now")).to_have_text("2")
    # the joiner's first line is followed into the open page's log
    page.wait_for_function("document.getElementById('log').textContent"
                           ".split('hello from').length > 2")
    assert page.evaluate("window.notReloaded") is True  # it changed without a reload
    assert site["client"].get_job(site["train"])["current_workers"] == 2


def test_cancel_works_from_the_page(site, page):
    page.goto(f"{site['url']}/ui/jobs/{site['waiting']}")
    page.click("button[data-action=cancel]")
    expect(page.locator("#job-status")).to_have_text("FAILED")
    expect(page.locator("#status-reason")).to_contain_text("cancelled by user")
    assert site["client"].get_job(site["waiting"])["status"] == "FAILED"


def test_terminate_works_from_the_page(site, page):
    page.goto(f"{site['url']}/ui/jobs/{site['train']}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button[data-action=terminate]")
    expect(page.locator("#job-status")).to_have_text("FAILED")
    expect(page.locator("#status-reason")).to_contain_text("terminated")
