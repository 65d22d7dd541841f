"""A worker that was declared dead and came back: it starts over as a new worker, or stops.

The coordinator declares a worker dead when its heartbeat stops for ``failure_timeout`` (the
process froze, or a network partition cut it off) and the others go on without it. When it
comes back (the partition heals), everything it held belongs to a generation that was
abandoned: its state, the steps it may have finished alone, its threads, sockets and buffers.
Its id is fenced for good (``reply/<id>`` says ``dead:``, its messages are refused).

It does not reset itself in place. Given the command line that started it (``ENV_WORKER_ARGV``,
set by ``dyntrain worker``) it executes that command again under a new worker id: a new
process image, so nothing of the abandoned generation survives in it, that joins like any new
worker and gets the state handed over afresh by the members. Without that command line (workers
that ``dyntrain run`` or the service started, which supervise their workers themselves) it exits
with a one-line reason.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import NoReturn

from dyntrain.elastic.protocol import ENV_WORKER_ARGV, ENV_WORKER_ID

_INCARNATION = re.compile(r"^(.*)\.r(\d+)$")


def next_worker_id(worker_id: str) -> str:
    """The id of the new worker that ``worker_id`` starts over as: ``w3`` -> ``w3.r1`` ->
    ``w3.r2``."""
    m = _INCARNATION.match(worker_id)
    return f"{m.group(1)}.r{int(m.group(2)) + 1}" if m else f"{worker_id}.r1"


def start_over(worker_id: str, reason: str) -> NoReturn:
    """Execute this worker's command line again as a new worker, or exit saying why not.

    Args:
        worker_id: the id that was declared dead.
        reason: what the coordinator said (``declared dead (no heartbeat for 10 s)``).
    """
    said = (f"dyntrain: worker {worker_id} was {reason} while it was cut off; the generation "
            "it was in was abandoned and nothing it did since counts")
    raw = os.environ.get(ENV_WORKER_ARGV)
    argv = json.loads(raw) if raw else None
    if not argv:
        raise SystemExit(f"{said}; start it again to re-join as a new worker")
    new_id = next_worker_id(worker_id)
    print(f"{said}; starting over as the new worker {new_id}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execve(argv[0], argv, {**os.environ, ENV_WORKER_ID: new_id})
