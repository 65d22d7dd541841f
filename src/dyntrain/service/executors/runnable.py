"""Whether a command can be executed where it is about to start (standard library only: the
Ray executor's actor runs this check on the node itself)."""

from __future__ import annotations

import os
import shutil


def start_problem(argv: list[str], cwd: str | None, env: dict[str, str]) -> str | None:
    """Why ``argv`` cannot be executed here (no such directory or executable), else None."""
    if cwd is not None and not os.path.isdir(cwd):
        return f"no working directory {cwd}"
    exe = argv[0]
    if "/" in exe:
        path = os.path.join(cwd or os.getcwd(), exe)
        if not os.path.isfile(path):
            return f"no executable {exe!r}: no such file"
        if not os.access(path, os.X_OK):
            return f"{exe!r} is not executable (permission denied)"
    elif shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
        return f"no executable {exe!r} on PATH"
    return None
