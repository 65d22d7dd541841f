"""Run a worker and leave its exit status in a file: ``wrap.py STATUS_FILE -- ARGV...``

The local executor starts this as the leader of a new process group (session); ARGV runs as its
child in the same group. A signal sent to the group reaches the child directly, so the wrapper
itself ignores SIGTERM and SIGINT and just waits. When the child ends, the wrapper writes
``{"exit_code": int | null, "signal": int | null}`` atomically (temporary file, then rename) and
exits with the child's code (128 + N when the child was killed by signal N).

Why: workers outlive a killed service, and a restarted service cannot ``wait()`` on processes it
did not start, but it can read this file. If the whole group gets SIGKILL there is no file, and the
exit is reported as killed with unknown status.

Standard library only: the executor runs this file by path so that starting a worker does not
import the ``dyntrain`` package (and with it torch). ``python -m
dyntrain.service.executors.wrap`` works too, only slower.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

USAGE = "usage: wrap.py STATUS_FILE -- ARGV..."


def write_status(path: str, exit_code: int | None, sig: int | None, error: str | None = None
                 ) -> None:
    """Write the status file atomically: readers see the old state or the whole new one."""
    record: dict = {"exit_code": exit_code, "signal": sig}
    if error is not None:
        record["error"] = error
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _ignore(signum, frame) -> None:
    """Swallow the signal. A handler rather than SIG_IGN, because exec() resets handled
    signals to their default in the child, while ignored ones would stay ignored there."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    status_file, cmd = args[0], args[2:]
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, _ignore)
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        msg = f"cannot start {cmd[0]!r}: {e.strerror or e}"
        print(f"dyntrain wrap: {msg}", file=sys.stderr, flush=True)
        write_status(status_file, 127, None, error=msg)
        return 127
    rc = child.wait()  # retried by Python after a swallowed signal (PEP 475)
    if rc < 0:
        write_status(status_file, None, -rc)
        return 128 + (-rc)
    write_status(status_file, rc, None)
    return rc


if __name__ == "__main__":
    sys.exit(main())
