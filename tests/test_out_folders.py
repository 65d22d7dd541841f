"""An output folder that cannot be one is one line naming why, with exit code 2, for every
command that writes one and for a plain ``python my_train.py`` given ``DYNTRAIN_OUT``."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, SCRIPTS

FIXTURE_STUDIES = ROOT / "tests" / "lab" / "fixtures" / "batch_science"

# (the path as written, relative to a folder holding the file `afile.txt`; what the error says)
BAD_FOLDERS = [
    ("afile.txt", "afile.txt: it is a file, not a folder"),
    ("afile.txt/sub", "afile.txt/sub: afile.txt is a file, not a folder"),
    ("/proc/dyntrain-out", "/proc/dyntrain-out: cannot create this folder in /proc"),
]

COMMANDS = {  # each with OUT in the place of its output folder
    "run": ["run", "--out", "OUT", str(SCRIPTS / "ledger_train.py")],
    "lab sweep": ["lab", "sweep", "--preset", "quick", "--service", "none", "--out", "OUT"],
    "lab report": ["lab", "report", str(FIXTURE_STUDIES), "--out", "OUT"],
    "lab throughput": ["lab", "throughput", "--out", "OUT", str(SCRIPTS / "ledger_train.py")],
    "data pack": ["data", "pack", "../images", "OUT"],
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The working directory: `afile.txt` in it, an image folder beside it (to pack)."""
    image = tmp_path / "images" / "cls" / "a.jpg"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"\xff\xd8 the bytes are copied as they are")
    work = tmp_path / "work"
    work.mkdir()
    (work / "afile.txt").write_text("not a folder\n")
    monkeypatch.chdir(work)
    return work


@pytest.mark.parametrize("bad, says", BAD_FOLDERS)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_refuses_an_output_folder_that_cannot_be_one(workdir, capsys, command, bad,
                                                               says):
    from dyntrain.cli.main import main

    args = [bad if a == "OUT" else a for a in COMMANDS[command]]
    flag = "DST" if command == "data pack" else "--out"
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.startswith(f"dyntrain: error: {flag} {says}"), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(os.listdir(workdir)) == ["afile.txt"]  # nothing else was written


@pytest.mark.parametrize("bad, says", BAD_FOLDERS)
def test_a_training_script_refuses_a_dyntrain_out_that_cannot_be_a_folder(workdir, bad, says):
    env = {**os.environ, "DYNTRAIN_OUT": bad}
    env.pop("DYNTRAIN_COORDINATOR", None)
    proc = subprocess.run([sys.executable, str(SCRIPTS / "ledger_train.py")], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"dyntrain: error: DYNTRAIN_OUT {says}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
