"""Waiting on a condition: the one way the tests and the benchmarks wait for something.

A test never sleeps a fixed time to let something happen; it polls what it waits for with
``wait_until``, which returns as soon as that is true and fails naming it (and what it saw last)
when it does not come. A quiet machine returns at once; the generous bounds are for a loaded one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_SHOWN = 600  # characters of the last value a failure shows


def wait_until(probe: Callable[[], T], what: str, timeout: float = 120.0, poll: float = 0.02,
               max_poll: float = 0.25, *, until: Callable[[T], object] | None = None,
               unless: Callable[[], object] | None = None) -> T:
    """Poll ``probe`` until its value is what is waited for, and return that value.

    Args:
        probe: called once per poll; what it returns is the value looked at.
        what: what is waited for, as a failure names it ("the job to end").
        timeout: seconds before giving up with ``TimeoutError``.
        poll: seconds between the first polls; later ones come ever further apart up to
            ``max_poll``, and never closer than three times what one ``probe`` took (up to a
            second): a probe that re-reads a growing file (a run's whole metrics.jsonl) would
            otherwise take a core of its own while a test waits on a loaded machine.
        until: whether a value is the one waited for (default: the value is true).
        unless: asked after each poll that did not succeed; something true in return ends the
            wait at once, as failed, naming it (``lambda: proc.poll() is not None and
            f"the server exited with {proc.returncode}"``): what was waited for cannot come.

    Raises:
        TimeoutError: ``what`` did not come within ``timeout`` seconds, or ``unless`` said it
            cannot come; the message names ``what``, the reason and the last value seen.
    """
    deadline = time.monotonic() + timeout
    pause = poll
    while True:
        started = time.monotonic()
        value = probe()
        if until(value) if until is not None else value:
            return value
        reason = unless() if unless is not None else None
        now = time.monotonic()
        if reason or now > deadline:
            why = f"gave up ({reason})" if reason else f"timed out after {timeout:g} s"
            raise TimeoutError(f"{why} waiting for {what}; last seen: {_shown(value)}")
        gap = max(pause, min(3 * (now - started), 1.0))
        time.sleep(min(gap, deadline - now + 0.01))
        pause = min(max_poll, pause * 1.25)


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _SHOWN else f"...{text[-_SHOWN:]}"
