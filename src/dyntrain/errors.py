"""Errors that carry a one-line message meant for the user (no traceback is shown for them)."""


class DyntrainError(Exception):
    """A problem the user can fix: bad input, an unreachable coordinator, a missing file."""


class ConfigError(DyntrainError, ValueError):
    """A configuration value is invalid or inconsistent with another."""


class DataError(DyntrainError):
    """A data file is missing, unreadable or not an image; the message names the file."""
