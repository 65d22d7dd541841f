"""Output folders: every command and the trainer create theirs through ``make_out_dir``, so a
path that cannot be a folder is one line naming why (exit code 2), never an OSError traceback."""

from __future__ import annotations

import os
from pathlib import Path

from dyntrain.errors import ConfigError


def make_out_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """Create the output folder ``path`` and its parents (if missing) and return it.

    Args:
        path: the folder, absolute or relative to the working directory.
        what: where the path came from, as the user wrote it (``--out``, ``DYNTRAIN_OUT``,
            ``DST``): the error names it.

    Raises:
        ConfigError: ``path`` is a file, lies under one, or cannot be created or written (its
            message says which).
    """
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{what} {folder}: {_why(folder, exc)}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {folder}: cannot write into this folder (permission denied)")
    return folder


def _why(folder: Path, exc: OSError) -> str:
    """Why ``folder`` could not be created, naming the file in the way when there is one."""
    for part in (folder, *folder.parents):
        if part.exists() and not part.is_dir():
            return ("it is a file, not a folder" if part == folder
                    else f"{part} is a file, not a folder")
        if part.is_symlink() and not part.exists():
            return f"{part} is a broken symbolic link"
    parent = next((p for p in folder.parents if p.is_dir()), None)
    where = f" in {parent}" if parent is not None and str(parent) != "." else ""
    return f"cannot create this folder{where}: {exc.strerror or exc}"
