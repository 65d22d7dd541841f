"""Screenshots of the dashboard's main pages, and the headless Chromium the browser tests use.

    python -m dyntrain.testing.screenshots http://127.0.0.1:8642 --out docs/screenshots \\
        [--token T] [--job JOB_ID]

writes ``overview.png``, ``job.png`` (the given job, else the newest elastic job), ``array.png``
(the newest array job, when there is one) and ``lab.png``. It drives Debian's ``chromium``
through Playwright (``pip install playwright``; Playwright's own browser download is not
needed): the flags below keep Chromium from reaching for the network, which a closed network
answers by refusing its connections.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 900}


def find_chromium() -> str | None:
    """Debian's Chromium, or $DYNTRAIN_CHROMIUM; None when there is none."""
    for path in (os.environ.get("DYNTRAIN_CHROMIUM"), *CHROMIUM_CANDIDATES,
                 shutil.which("chromium")):
        if path and os.access(path, os.X_OK):
            return path
    return None


@contextmanager
def chromium(viewport: dict[str, int] | None = None):
    """A Playwright browser context on Debian's Chromium with a fresh profile; yields it."""
    from playwright.sync_api import sync_playwright

    path = find_chromium()
    if path is None:
        raise RuntimeError("no Chromium found: apt-get install -y chromium "
                           "(or set DYNTRAIN_CHROMIUM to its path)")
    with tempfile.TemporaryDirectory(prefix="dyntrain-chromium-") as profile, \
            sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=path, args=CHROMIUM_ARGS, headless=True,
            viewport=viewport or VIEWPORT)
        try:
            yield context
        finally:
            context.close()


def log_in(page: Any, url: str, token: str | None) -> None:
    """Open the dashboard; when the service asks for its token, give it on the login page."""
    page.goto(url + "/")
    if token and "/ui/login" in page.url:
        page.fill("#token", token)
        page.click("button[type=submit]")
        page.wait_for_url(url + "/")


def _newest_job(url: str, token: str | None, want) -> str | None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    jobs = httpx.get(f"{url}/jobs", params={"limit": 1000}, headers=headers, timeout=10).json()
    for job in reversed(jobs):
        if want(job):
            return job["id"]
    return None


def shoot(page: Any, out: Path, name: str, settle_ms: int = 2500) -> Path:
    """A full-page screenshot once the page's charts and live sections have had a poll."""
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(settle_ms)  # a screenshot, not a test: one poll of the live parts
    path = out / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def take(url: str, out: Path, token: str | None = None, job: str | None = None) -> list[Path]:
    """Screenshots of the overview, a job, an array job and the lab; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    url = url.rstrip("/")
    job = job or _newest_job(url, token, lambda j: j.get("elastic"))
    array = _newest_job(url, token, lambda j: j.get("array_size") and not j.get("array_parent_id"))
    taken = []
    with chromium() as context:
        page = context.new_page()
        log_in(page, url, token)
        taken.append(shoot(page, out, "overview"))
        if job:
            page.goto(f"{url}/ui/jobs/{job}")
            taken.append(shoot(page, out, "job"))
        if array:
            page.goto(f"{url}/ui/jobs/{array}")
            taken.append(shoot(page, out, "array"))
        page.goto(f"{url}/ui/lab")
        taken.append(shoot(page, out, "lab"))
    return taken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="the service, e.g. http://127.0.0.1:8642")
    ap.add_argument("--out", default="docs/screenshots", help="folder for the PNGs")
    ap.add_argument("--token", default=os.environ.get("DYNTRAIN_TOKEN"))
    ap.add_argument("--job", help="the job to show (default: the newest elastic job)")
    args = ap.parse_args(argv)
    try:
        for path in take(args.url, Path(args.out), args.token, args.job):
            print(path)
    except Exception as e:  # one line, never a traceback
        print(f"screenshots: error: {type(e).__name__}: {str(e).splitlines()[0]}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
