"""What the service commands say when the user is lost: no service running, a name that does not
exist, a command by another name. A real `dyntrain server`; the CLI's entry point in-process."""

from __future__ import annotations

import pytest

from conftest import start_server, stop_server
from dyntrain.cli.main import main


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-hints")
    proc, url = start_server(tmp / "state", tmp / "server.log")
    yield url
    assert stop_server(proc) == 0


def dyntrain(capsys, *args) -> tuple[int, str, str]:
    """``dyntrain ARGS``: (exit code, stdout, stderr)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, expected_code: int) -> str:
    assert code == expected_code and "Traceback" not in err, (code, err)
    assert err.count("\n") == 1 and err.startswith("dyntrain: error: "), err
    return err.strip()


@pytest.mark.parametrize("via_env", [False, True])
def test_no_service_says_how_to_start_one_or_point_at_another(capsys, monkeypatch, via_env):
    unreachable = "http://127.0.0.1:1"
    monkeypatch.delenv("DYNTRAIN_URL", raising=False)
    if via_env:
        monkeypatch.setenv("DYNTRAIN_URL", unreachable)
    args = ("status",) if via_env else ("status", "--url", unreachable)
    err = one_line_error(*dyntrain(capsys, *args)[::2], expected_code=3)
    said = f"dyntrain: error: cannot reach the dyntrain service at {unreachable} ("
    assert err.startswith(said), err
    assert err.endswith("start one with `dyntrain server`, or point at another with --url URL "
                        "or DYNTRAIN_URL=URL"), err
    # a usage error is another exit code
    one_line_error(*dyntrain(capsys, "submit", "--workers", "3:1", "--", "true")[::2],
                   expected_code=2)


def test_unknown_names_list_what_exists(capsys, service):
    url = ("--url", service)
    assert dyntrain(capsys, "jobdef", "register", *url, "train", "--", "true")[0] == 0
    assert dyntrain(capsys, "jobdef", "register", *url, "train", "--", "false")[0] == 0
    cases = [
        (("submit", *url, "-q", "nope", "--", "true"),
         "unknown job queue 'nope' (job queues: default)"),
        (("submit", *url, "-d", "nope"),
         "unknown job definition 'nope' (or no active revision; job definitions: train)"),
        (("submit", *url, "-d", "train:9"),
         "unknown job definition 'train:9' (train has revision(s) 1, 2)"),
        (("ce", "show", *url, "nope"),
         "unknown compute environment 'nope' (compute environments: local)"),
    ]
    for args, says in cases:
        err = one_line_error(*dyntrain(capsys, *args)[::2], expected_code=2)
        assert err == f"dyntrain: error: {says}", err


def test_jobs_lists_jobs(capsys, service):
    code, out, _ = dyntrain(capsys, "submit", "--url", service, "-n", "listed-job", "--", "true")
    assert code == 0
    job_id = out.split()[-1][:8]
    code, out, err = dyntrain(capsys, "jobs", "--url", service)
    assert code == 0, err
    assert "listed-job" in out and job_id in out, out


@pytest.mark.parametrize("typed, meant", [
    ("kill", "terminate"), ("ls", "jobs"), ("stauts", "status"), ("pack", "data pack"),
    ("sweep", "lab sweep"), ("job", "status")])
def test_a_mistyped_command_gets_the_one_meant(capsys, typed, meant):
    err = one_line_error(*dyntrain(capsys, typed)[::2], expected_code=2)
    assert err == f"dyntrain: error: No such command {typed!r}. Did you mean {meant!r}?", err
