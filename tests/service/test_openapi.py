"""The OpenAPI document tells the truth: schemathesis, with every check, against the real API
served by uvicorn on 127.0.0.1 (with a token) finds nothing: no 5xx, every status code and error
body declared, every schema-violating request refused and every schema-valid one accepted (but
for the 400s that ``schemathesis.toml`` explains).

The service's scheduler does not run: the fuzzer's jobs stay queued, so no generated command is
ever executed. The coverage phase (boundary and schema-violating values of every parameter of
every operation, deterministic) keeps the test within the CI budget; the fuzzing and stateful
phases run by hand with the command in ``schemathesis.toml``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .test_api import serve

HERE = Path(__file__).resolve().parent
TOKEN = "schemathesis-token"


@pytest.mark.slow
def test_schemathesis_finds_no_failure(tmp_path):
    with serve(tmp_path / "state", token=TOKEN, scheduler=False, warm_workers=0) as (_, url):
        run = subprocess.run(
            [str(Path(sys.executable).parent / "st"), "--config-file",
             str(HERE / "schemathesis.toml"), "run", f"{url}/openapi.json",
             "-H", f"Authorization: Bearer {TOKEN}", "--checks", "all",
             "--phases", "examples,coverage", "--seed", "8", "--generation-database", "none",
             "--request-timeout", "30", "--no-color"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    summary = run.stdout[run.stdout.rfind("SUMMARY"):]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "Tested: 31" in summary, summary  # every operation of the API
