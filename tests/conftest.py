"""Helpers for end-to-end tests: run the real CLI in real processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
DYNTRAIN = [sys.executable, "-m", "dyntrain.cli.main"]


def run_cli(args, timeout=240, check=False, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([*DYNTRAIN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=kw.pop("cwd", ROOT), **kw)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def ledger_script() -> Path:
    return SCRIPTS / "ledger_train.py"


@pytest.fixture(scope="session")
def static_ledger(tmp_path_factory) -> Path:
    """The ledger workload trained alone (plain ``python``, no coordinator): its final.pt is
    what every elastic ledger run with the default settings must end with, bit for bit."""
    out = tmp_path_factory.mktemp("static-ledger")
    env = {**os.environ, "DYNTRAIN_OUT": str(out)}
    env.pop("DYNTRAIN_COORDINATOR", None)
    subprocess.run([sys.executable, str(SCRIPTS / "ledger_train.py")], env=env, check=True,
                   timeout=240, cwd=ROOT, capture_output=True)
    return out
