"""Errors that carry a one-line message meant for the user (no traceback is shown for them)."""

import sys


class DyntrainError(Exception):
    """A problem the user can fix: bad input, an unreachable coordinator, a missing file."""


class ConfigError(DyntrainError, ValueError):
    """A configuration value is invalid or inconsistent with another."""


class DataError(DyntrainError):
    """A data file is missing, unreadable or not an image; the message names the file."""


def install_excepthook() -> None:
    """Print an uncaught DyntrainError as ``dyntrain: error: ...`` (one line, exit code 1) in a
    training script; every other exception keeps its full traceback."""
    previous = sys.excepthook
    if getattr(previous, "dyntrain", False):
        return

    def hook(kind, value, tb):
        if isinstance(value, DyntrainError):
            print(f"dyntrain: error: {value}", file=sys.stderr, flush=True)
        else:
            previous(kind, value, tb)

    hook.dyntrain = True
    sys.excepthook = hook
