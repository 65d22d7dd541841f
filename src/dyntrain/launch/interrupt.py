"""Ctrl-C (or SIGTERM) on ``dyntrain run``: stop every worker, gracefully first, then by force.

The workers run in their own sessions, so a terminal's Ctrl-C reaches only the launcher. It turns
the signal into a request and, at a safe point of its loop (never in the middle of reading a
worker's message), sends every local worker a preemption notice (SIGTERM): each finishes its step
and leaves, and when the whole world leaves at once the leader writes a checkpoint of that step
(a worker that leaves while it waits between generations writes one if nobody has). Workers still
there after the grace period, or at a second Ctrl-C, are killed.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass

from dyntrain.elastic.membership.coordinator import Coordinator
from dyntrain.launch.local import LocalWorkers

POLL_SECONDS = 0.02
KILL_WAIT_SECONDS = 10.0


class StopSignals:
    """Counts SIGINT/SIGTERM while active instead of raising KeyboardInterrupt or dying.

    Only the main thread can install signal handlers; elsewhere (a library caller in a thread)
    the signals keep their previous behaviour and ``count`` stays 0.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.count = 0
        self.name = ""
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.count += 1
        self.name = self.name or ("Ctrl-C" if signum == signal.SIGINT else signal.Signals(
            signum).name)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass
class StopOutcome:
    stopped: int  # workers that left on their own
    killed: int  # workers killed after the grace period or a second signal
    why_killed: str  # "" or what forced it


def stop_workers(coord: Coordinator, workers: LocalWorkers, signals: StopSignals,
                 grace_seconds: float, log) -> StopOutcome:
    """Ask every worker to leave at its next step boundary; kill what is left after
    ``grace_seconds`` or at the next signal."""
    local = workers.alive()
    for worker_id in local:
        workers.signal(worker_id, "leave")
    for worker_id in coord.live_workers():
        if worker_id not in local:  # a remote worker: drain it (members) or release it (standby)
            coord.request_drain(worker_id)
            coord.release(worker_id)
    log(f"interrupted ({signals.name}): asking {len(local)} worker(s) to stop at their next "
        "step boundary (the leader writes a checkpoint); Ctrl-C again to kill them now")
    seen, deadline = signals.count, time.monotonic() + grace_seconds
    while workers.alive() and signals.count == seen and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    left = workers.alive()
    why = ""
    if left:
        why = ("a second signal" if signals.count > seen
               else f"still running after {grace_seconds:g} s")
        for worker_id in left:
            workers.signal(worker_id, "kill")
        workers.stop_all(timeout=KILL_WAIT_SECONDS)
    return StopOutcome(len(local) - len(left), len(left), why)
