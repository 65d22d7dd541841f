"""``dyntrain logs``, and following a job until it ends (``logs -f``, ``submit --wait``).

A job's log lines go to stdout; what the service says about the job goes to stderr: its status
changes with their reasons (``--wait``), why it waits as soon as the scheduler knows, and, while an
elastic job trains, its step, world size, loss and samples/s; when the job has ended, its
membership changes (an elastic job's) and its final status with the reason. An array job has no
log of its own: ``logs PARENT`` prints its children's statuses and how to reach a child's log.
"""

from __future__ import annotations

import time
from typing import Any

import click

from dyntrain.cli.service.common import (
    POLL_SECONDS,
    conn_options,
    friendly,
    make_client,
    resolve_job,
)
from dyntrain.cli.service.output import list_items, reason_text, short_id
from dyntrain.elastic.runs.rows import EventRow, RowError
from dyntrain.service.core.jobtext import attempt_text, progress_text
from dyntrain.service.core.model import TERMINAL_STATUSES, JobStatus

PROGRESS_SECONDS = 2.0  # between two looks at a running job's progress
FAILED_SHOWN = 5  # failed children listed under an array job's summary
#: how long a follower asks again when the service does not answer (a loaded machine, a
#: restarted service) before it gives up
PATIENCE_SECONDS = 120.0


class _Patient:
    """A client whose reads are asked again while the service does not answer, until it has
    been silent for ``PATIENCE_SECONDS``; says once on stderr that it waits, and when the
    service answers again. Following only reads: asking again repeats nothing."""

    def __init__(self, client) -> None:
        self._client, self._silent_since = client, None

    def __getattr__(self, name: str):
        call = getattr(self._client, name)
        return lambda *args, **kwargs: self._ask(call, args, kwargs)

    def _ask(self, call, args, kwargs):
        from dyntrain.service.client import ServiceUnreachable

        while True:
            try:
                result = call(*args, **kwargs)
            except ServiceUnreachable as exc:
                now = time.monotonic()
                if self._silent_since is None:
                    self._silent_since = now
                    click.echo(f"dyntrain: {exc}; asking again for up to "
                               f"{PATIENCE_SECONDS:g} s", err=True)
                elif now - self._silent_since > PATIENCE_SECONDS:
                    raise ServiceUnreachable(
                        f"{exc} (no answer for {now - self._silent_since:.0f} s)") from None
                time.sleep(POLL_SECONDS)
                continue
            if self._silent_since is not None:
                click.echo("dyntrain: the service answers again", err=True)
                self._silent_since = None
            return result


class _LogPrinter:
    """Prints a job's log lines; when the job has (or may have) more than one attempt, each
    attempt's lines come after a header saying when it started and how it ended."""

    def __init__(self, client, job: dict[str, Any]) -> None:
        self.client, self.job_id = client, job["id"]
        self.history = [a for a in job.get("attempt_history") or [] if isinstance(a, dict)]
        allowed = (job.get("retry_strategy") or {}).get("attempts") or 1
        self.headers = len(self.history) > 1 or allowed > 1
        self.attempt: Any = None  # the attempt of the last line printed

    def page(self, after: int) -> tuple[int, dict[str, Any]]:
        """Print the lines after ``after``; returns the seq to go on from and the page."""
        page = self.client.logs(self.job_id, after_seq=after)
        for line in page.get("lines") or []:
            if not isinstance(line, dict):
                click.echo(str(line))
                continue
            attempt = line.get("attempt")
            if attempt != self.attempt and (self.headers or (attempt or 1) > 1):
                click.echo(f"=== {attempt_text(self._attempt(attempt))} ===")
            self.attempt = attempt
            click.echo(line.get("line", ""))
        return int(page.get("last_seq", after)), page

    def _attempt(self, number: Any) -> dict[str, Any]:
        found = [a for a in self.history if a.get("attempt") == number]
        if not found:  # begun since we looked
            job = self.client.get_job(self.job_id)
            self.history = [a for a in job.get("attempt_history") or [] if isinstance(a, dict)]
            found = [a for a in self.history if a.get("attempt") == number]
        return found[0] if found else {"attempt": number}


def print_log(client, job: dict[str, Any]) -> None:
    printer, after = _LogPrinter(client, job), 0
    while True:
        after, page = printer.page(after)
        if not page.get("lines"):
            return


class _Watcher:
    """Says on stderr what changed about a job since it last looked."""

    def __init__(self, job_id: str, announce: bool) -> None:
        self.tag, self.announce = f"[{short_id(job_id)}]", announce
        self.said: tuple[str, str] | None = None
        self.step: Any = None

    def look(self, job: dict[str, Any]) -> None:
        status = str(job.get("status"))
        waiting = job.get("waiting") if isinstance(job.get("waiting"), dict) else None
        # a waiting job's place in its queue moves; only a new reason is news
        key = (status, waiting.get("reason", "") if waiting else job.get("status_reason") or "")
        if self.announce and key != self.said:
            reason = reason_text(job)
            click.echo(f"{self.tag} {status}" + (f": {reason}" if reason else ""), err=True)
            self.said = key
        progress = job.get("progress")
        if status not in TERMINAL_STATUSES and isinstance(progress, dict) and \
                progress.get("step") != self.step:
            self.step = progress.get("step")
            text = progress_text(progress)
            if text:
                click.echo(f"{self.tag} {text}", err=True)

    def end(self, job: dict[str, Any], changes: list[str]) -> None:
        """The ended job's membership changes, then its final status (unless just said)."""
        if changes:
            click.echo(f"{self.tag} {len(changes)} membership change(s):", err=True)
            for text in changes:
                click.echo(f"{self.tag}   {text}", err=True)
            self.said = None  # the status, said before them, is said again as the last line
        self.announce = True
        self.look(job)


def membership_changes(client, job_id: str) -> list[str]:
    """A job's membership changes, one line each, oldest first (none for a plain job)."""
    lines, after = [], 0
    while True:
        found = client.events(job_id, after_id=after)
        if not found:
            return lines
        for event in found:
            if str(event.get("kind", "")).startswith("membership."):
                try:
                    lines.append(EventRow.from_json(event.get("payload") or {}).text())
                except RowError as exc:  # a service of another version: say what is there
                    lines.append(f"{event['kind'].removeprefix('membership.')} ({exc})")
        after = found[-1]["id"]


def follow(client, job_id: str, *, announce: bool,
           seen: dict[str, Any] | None = None) -> dict[str, Any]:
    """Print a job's log until it ends, with its progress (and, with ``announce``, its status
    changes and why it waits) on stderr; returns the finished job. ``seen["status"]``: the
    status it last saw (what a Ctrl-C reports without asking the service again). A service that
    does not answer for a while (``PATIENCE_SECONDS``) is asked again, not given up on."""
    watcher, after, seen_status, next_look = _Watcher(job_id, announce), 0, None, 0.0
    seen = {} if seen is None else seen
    client = _Patient(client)
    job = client.get_job(job_id)
    seen["status"] = job.get("status")
    printer = _LogPrinter(client, job)
    while True:
        after, page = printer.page(after)
        seen["status"] = page.get("status") or seen["status"]
        now = time.monotonic()
        if page.get("status") != seen_status or now >= next_look:
            job = client.get_job(job_id)
            seen["status"] = job.get("status")
            watcher.look(job)
            seen_status, next_look = page.get("status"), now + PROGRESS_SECONDS
        if page.get("done") and not page.get("lines"):
            job = client.get_job(job_id)
            watcher.end(job, membership_changes(client, job_id))
            return job
        if not page.get("lines"):
            time.sleep(POLL_SECONDS)


def array_summary(client, job: dict[str, Any]) -> list[str]:
    """An array job's children by status, a few failed ones, and how to read a child's log."""
    counts = (job.get("array") or {}).get("status_counts") or {}
    size = (job.get("array") or {}).get("size") or job.get("array_size")
    lines = [f"array job {job['id']} ({job.get('status')}): {size} children: "
             + (", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none yet")]
    if counts.get(JobStatus.FAILED.value):
        failed = list_items(client.list_jobs(parent=job["id"], status=JobStatus.FAILED.value,
                                             limit=FAILED_SHOWN), "jobs", "items")
        for child in failed:
            lines.append(f"  {child['id']}  FAILED: {child.get('status_reason') or ''}".rstrip())
        if counts[JobStatus.FAILED.value] > len(failed):
            lines.append(f"  ... and {counts['FAILED'] - len(failed)} more failed")
    lines.append(f"a child's log: dyntrain logs {job['id']}:INDEX (INDEX 0-{int(size) - 1}); "
                 f"its files: the service's state folder, runs/jobs/{job['id']}_INDEX/")
    return lines


def _follow_array(client, job: dict[str, Any]) -> None:
    shown = None
    while job.get("status") not in TERMINAL_STATUSES:
        counts = (job.get("array") or {}).get("status_counts")
        if counts != shown:
            click.echo(f"[{short_id(job['id'])}] children: "
                       + ", ".join(f"{n} {s}" for s, n in (counts or {}).items() if n), err=True)
            shown = counts
        time.sleep(POLL_SECONDS)
        job = client.get_job(job["id"])
    for line in array_summary(client, job):
        click.echo(line)


@click.command()
@click.option("--follow", "-f", "follow_", is_flag=True,
              help="Keep printing new lines (and the job's progress) until the job ends.")
@click.argument("job")
@conn_options
@friendly
def logs(follow_, job, url, token):
    """Print JOB's log (an array job: its children's statuses; a child is PARENT:INDEX)."""
    client = make_client(url, token)
    found = resolve_job(client, job)
    if isinstance(found.get("array"), dict):
        if follow_:
            _follow_array(client, found)
        else:
            for line in array_summary(client, found):
                click.echo(line)
        return
    try:
        if follow_:
            follow(client, found["id"], announce=False)
        else:
            print_log(client, found)
    except KeyboardInterrupt:
        click.echo(f"\ndyntrain: stopped following; job {found['id']} goes on (stop it with: "
                   f"dyntrain terminate {found['id']})", err=True)
        raise SystemExit(130) from None
