"""A child process that dies with its parent, however the parent ends.

Linux sends a process the signal it asked for with ``prctl(PR_SET_PDEATHSIG, sig)`` when its
parent ends, SIGKILL included: nothing the parent can no longer do (it was SIGKILLed, or ran out
of memory) is needed. dyntrain asks for SIGKILL in every process it starts on behalf of a run:
the local workers of ``dyntrain run`` (tied to the launcher), its fork server (tied to the
launcher) and the workers the server forks (tied to the server), the loader processes of a
training worker (tied to that worker), and the command a Ray actor runs (tied to the actor). A
process that is stopped (SIGSTOP, a frozen worker) gets SIGKILL too.

Two details decide whether it holds:

- The request is made in the child, after the fork: a parent that ended in between would go
  unnoticed, so the child then compares its parent's pid with the one it was forked from and
  ends itself at once when they differ.
- "Parent" is the *thread* that forked the child: the signal comes when that thread ends,
  even while the rest of the process runs on. The launcher, the fork server and the training
  worker therefore start their children from their main thread (loader processes: the thread
  that builds the ``ElasticTrainer``).

Elsewhere than Linux ``die_with_parent`` does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def _find_prctl():
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux (no prctl in the C library)
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Looked up once, in the parent: between fork and exec (``subprocess``'s ``preexec_fn``) the
# child only calls it.
_PRCTL = _find_prctl()


def die_with_parent(parent: int | None) -> None:
    """Ask for SIGKILL when the thread that forked this process ends; ``parent``: the pid this
    process was forked from, whose end before the request ends this process now (None: not
    checked, for a process whose parent is not the one that asked for it)."""
    if _PRCTL is None:
        return
    if _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # refused (a sandbox): the other safeguards remain
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)  # the parent ended before the request
