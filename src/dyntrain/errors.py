"""Errors that carry a one-line message meant for the user (no traceback is shown for them)."""

import sys

# The exit codes of ``dyntrain`` (see ``dyntrain.cli.main``)
EXIT_FAILED = 1  # the run or job failed
EXIT_USAGE = 2  # bad input, or a missing extra
EXIT_UNREACHABLE = 3  # the dyntrain service cannot be reached
EXIT_INTERRUPTED = 130  # Ctrl-C


class DyntrainError(Exception):
    """A problem the user can fix: bad input, an unreachable coordinator, a missing file.
    ``exit_code`` is the command's exit status when it ends one."""

    exit_code = EXIT_USAGE


class ConfigError(DyntrainError, ValueError):
    """A configuration value is invalid or inconsistent with another."""


class DataError(DyntrainError):
    """A data file is missing, unreadable or not an image; the message names the file."""


class Unreachable(DyntrainError):
    """A dyntrain service or a job's coordinator does not answer at the address given."""

    exit_code = EXIT_UNREACHABLE


def install_excepthook() -> None:
    """Print an uncaught DyntrainError as ``dyntrain: error: ...`` (one line, and its
    ``exit_code`` as the exit status, as ``dyntrain`` does) in a training script; every other
    exception keeps its full traceback."""
    previous = sys.excepthook
    if getattr(previous, "dyntrain", False):
        return

    def hook(kind, value, tb):
        if isinstance(value, DyntrainError):
            print(f"dyntrain: error: {value}", file=sys.stderr, flush=True)
            # SystemExit raised by the hook sets the exit status; the interpreter still shuts
            # down as usual (threads joined, atexit handlers run)
            raise SystemExit(value.exit_code)
        previous(kind, value, tb)

    hook.dyntrain = True
    sys.excepthook = hook
