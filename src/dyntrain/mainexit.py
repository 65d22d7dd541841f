"""Ending a worker process promptly: run its script as ``python SCRIPT`` would, then exit
without the interpreter's teardown.

After ``python SCRIPT``, the interpreter joins the non-daemon threads, runs the exit handlers and
then finalises every module and object: with torch imported that last part alone took 3.5 s on a
2-core machine at load average 14 (torch, ``torch._dynamo`` and scikit-learn: 6.6 s), seconds in
which a worker that had already left its job still held its slot. The launcher's forked workers
(``dyntrain.launch.forkserver``) and the service's warm workers
(``dyntrain.service.executors.warm``) end through ``run_as_main`` instead: the same exit status,
threads and exit handlers, then ``os._exit``; ``dyntrain server`` ends through ``end_process``
once it stopped.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def run_as_main(run: Callable[[], None]) -> NoReturn:
    """Run a worker and end the process the way the interpreter ends after ``python SCRIPT``:
    the exit status ``_outcome`` gives, after non-daemon threads are joined, exit handlers run and
    the standard streams flushed; then ``os._exit``, without the teardown (module and object
    finalisation: seconds with torch imported on a loaded machine). Nothing raised here may reach
    the code below this frame (a process forked from a server): everything ends in ``os._exit``."""
    code = 1
    try:
        code = _outcome(run)
        _wind_up()
    except BaseException:
        pass
    finally:
        if code == -signal.SIGINT:  # as Python ends on an unhandled KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(1 if code == -signal.SIGINT else code)


def end_process(code: int = 0) -> NoReturn:
    """End a process whose work is done (``dyntrain server`` once it stopped) with exit status
    ``code`` as the interpreter would, after non-daemon threads are joined, exit handlers run
    and the standard streams flushed; then ``os._exit``, without the teardown (seconds of CPU
    with torch imported, many more on a loaded machine)."""
    try:
        _wind_up()
    except BaseException:
        pass
    finally:
        os._exit(code)


def _wind_up() -> None:
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


def _outcome(run: Callable[[], None]) -> int:
    """The exit status of ``run()`` as ``python`` gives it: 0; ``SystemExit``'s code (a message
    printed, and 1); for any other exception ``sys.excepthook`` (which may raise ``SystemExit``
    to choose the status, as dyntrain's does) and 1, or -SIGINT for a KeyboardInterrupt."""
    try:
        run()
        return 0
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException as exc:
        try:
            sys.excepthook(type(exc), exc, exc.__traceback__)
        except SystemExit as chosen:
            return _exit_status(chosen)
        return -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # sys.exit("message"), as Python prints it
    return 1
