"""Bad input through the real CLI: a one-line error, a non-zero exit, nothing touched. Input
refused before anything starts goes through the CLI's entry point in this process
(``run_main``); what starts a launcher or workers runs as its own command (``run_cli``)."""

import hashlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import SCRIPTS, run_cli, run_main
from dyntrain import TrainConfig
from dyntrain.errors import ConfigError, install_excepthook
from dyntrain.launch import forkserver
from dyntrain.launch.fit import first_workers_mib, worker_mib
from dyntrain.procstat import memory_available_mib


def assert_one_line_error(proc, *needles, code=2):
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert err.count("\n") == 0 and err.startswith("dyntrain: error:"), err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("workers, needle", [
    ("0:2", "1 <= MIN <= MAX"), ("3:1", "1 <= MIN <= MAX"), ("a:b", "MIN:MAX"),
    ("1:2:3", "MIN:MAX"), ("", "MIN:MAX")])
def test_invalid_workers(workers, needle, tmp_path):
    proc = run_main(["run", "--workers", workers, "--out", tmp_path / "o",
                     SCRIPTS / "ledger_train.py"])
    assert_one_line_error(proc, needle)
    assert not (tmp_path / "o").exists()


def test_missing_script(tmp_path):
    proc = run_main(["run", "--out", tmp_path / "o", tmp_path / "nope.py"])
    assert_one_line_error(proc, "script not found", "nope.py")
    assert not (tmp_path / "o").exists()


def test_bad_events_or_other_settings_leave_an_existing_run_untouched(tmp_path):
    out = tmp_path / "run"
    run_cli(["run", "--out", out, "--quiet", SCRIPTS / "ledger_train.py", "--epochs", "2"],
            check=True)

    def files():
        return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*")
                if p.is_file() and p.parent.name != "logs"}

    before = files()
    proc = run_main(["run", "--out", out, "--events", "step=3:explode=1",
                     SCRIPTS / "ledger_train.py", "--epochs", "2"])
    assert_one_line_error(proc, "step=3:explode=1")
    assert files() == before
    # the same folder with another global batch (the ledger's lr follows it) and length: refused
    # before training, naming what differs
    proc = run_cli(["run", "--out", out, SCRIPTS / "ledger_train.py", "--epochs", "3",
                    "--global-batch", "32"])
    assert proc.returncode == 2  # bad input: the folder holds another run
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith(
        f"job failed: no worker could start: {out} holds a run started with other settings: "
        f"epochs 2 -> 3, global_batch 16 -> 32, optimizer group 0 lr 16.0 -> 32.0; use another "
        f"--out, or delete {out} to start fresh (see {out / 'logs' / 'worker-w0.log'})"), last
    assert "Traceback" not in (out / "logs" / "worker-w0.log").read_text()
    assert files() == before


def test_unreachable_coordinator():
    proc = run_main(["worker", "--coordinator", "127.0.0.1:1", "--connect-timeout", "1",
                     SCRIPTS / "ledger_train.py"])
    assert_one_line_error(proc, "cannot reach the coordinator at 127.0.0.1:1", code=3)


@pytest.mark.parametrize("address", ["nohostport", "host:", ":123", "h:99999", "h:x"])
def test_malformed_coordinator_address(address):
    proc = run_main(["worker", "--coordinator", address, SCRIPTS / "ledger_train.py"])
    assert_one_line_error(proc, "HOST:PORT")


def test_a_bad_train_config_fails_the_job_in_one_line_as_bad_input(tmp_path):
    """The script's ConfigError is the job's one line (even with --quiet), exit status 2. The
    two jobs (without and with --quiet) run at once."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {quiet: pool.submit(run_cli, ["run", *quiet, "--out", tmp_path / f"o{len(quiet)}",
                                             SCRIPTS / "bad_config.py"])
                for quiet in ((), ("--quiet",))}
    for quiet, started in runs.items():
        proc = started.result()
        assert proc.returncode == 2, (quiet, proc.stdout, proc.stderr)
        last = proc.stdout.strip().splitlines()[-1]
        assert "job failed: no worker could start: global batch 30 is not a multiple of chunk " \
               "size 8: choose a chunk size that divides it (e.g. 6)" in last, proc.stdout
        if quiet:
            assert proc.stdout.strip().count("\n") == 0, proc.stdout
        log = (tmp_path / f"o{len(quiet)}" / "logs" / "worker-w0.log").read_text()
        assert "Traceback" not in log and log.strip().startswith(
            "dyntrain: error: global batch"), log


@pytest.mark.parametrize("kwargs, needle", [
    ({"global_batch": 30, "chunk_size": 8}, "global batch 30 is not a multiple of chunk size 8"),
    ({"global_batch": 0, "chunk_size": 8}, "global_batch (0) and chunk_size (8) must be positive"),
    ({"global_batch": -32, "chunk_size": 8}, "global_batch (-32)"),
    ({"global_batch": 32, "chunk_sise": 8},
     "TrainConfig has no option 'chunk_sise': did you mean 'chunk_size'?"),
    ({"global_batch": "32", "chunk_size": 8}, "global_batch must be an integer, got '32'")])
def test_a_bad_train_config_is_one_line_and_exit_2_through_the_scripts_hook(
        kwargs, needle, monkeypatch, capsys):
    """What a script's uncaught ConfigError becomes through the excepthook ``import dyntrain``
    installs (in a real script: the test below)."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    install_excepthook()
    with pytest.raises(ConfigError) as err:
        TrainConfig(**kwargs)
    with pytest.raises(SystemExit) as exit_:
        sys.excepthook(err.type, err.value, err.tb)
    said = capsys.readouterr()
    assert_one_line_error(subprocess.CompletedProcess([], exit_.value.code, *said), needle)


def test_a_bad_train_config_in_a_plain_script_is_one_line_and_exit_2():
    kwargs = {"global_batch": 32, "chunk_sise": 8}
    proc = subprocess.run([sys.executable, SCRIPTS / "bad_config.py", json.dumps(kwargs)],
                          capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, "TrainConfig has no option 'chunk_sise': did you mean "
                          "'chunk_size'?")


def test_quiet_still_says_why_the_job_failed(tmp_path):
    """A worker that raises mid-run: with --quiet the job's failure is still its one line."""
    proc = run_cli(["run", "--quiet", "--out", tmp_path / "o", SCRIPTS / "ledger_train.py",
                    "--raise-in", "all", "--raise-after", "4", "--epochs", "2"])
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    out = proc.stdout.strip()
    assert out.count("\n") == 0 and "job failed: every worker is gone (last error: " in out, out


def test_compare_reports_missing_files(tmp_path):
    proc = run_main(["compare", tmp_path / "a", tmp_path / "b"])
    assert_one_line_error(proc, "no such file")


def test_compare_rejects_a_file_that_is_not_a_state_dict(tmp_path):
    (tmp_path / "final.pt").write_bytes(b"not a checkpoint")
    proc = run_main(["compare", tmp_path, tmp_path])
    assert_one_line_error(proc, "not a loadable state dict")


@pytest.mark.parametrize("args, needle", [
    (["run", "--wrokers", "2", "x.py"], "No such option '--wrokers'. Did you mean '--workers'?"),
    (["run", "--bogus=3", "x.py"], "No such option '--bogus'."),
    (["worker", "--coordinator", "h:1", "--connect-timeot", "3", "x.py"],
     "Did you mean '--connect-timeout'?")])
def test_unknown_option_is_called_one(args, needle, capsys):
    """Not 'script not found: --wrokers': SCRIPT takes the first word that is not an option."""
    from dyntrain.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and needle in err, err
    assert err.count("\n") == 1 and err.startswith("dyntrain: error: No such option"), err


def test_compare_reports_match_and_difference(tmp_path):
    import torch

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    state = {"w": torch.ones(3), "n": torch.tensor(4)}
    torch.save(state, a / "final.pt")
    torch.save(state, b / "final.pt")
    same = run_main(["compare", a, b])
    assert same.returncode == 0 and same.stdout.startswith("match: max |a-b| = 0")
    torch.save({"w": torch.ones(3) * 1.5, "n": torch.tensor(4)}, b / "final.pt")
    differ = run_main(["compare", a, b])
    assert differ.returncode == 1 and differ.stdout.startswith("DIFFER: max |a-b| = 0.5")
    # a NaN in one run only is a difference (max() over it was 0), NaNs in the same places not
    nan = torch.tensor([1.0, float("nan"), 1.0])
    torch.save({"w": nan, "n": torch.tensor(4)}, b / "final.pt")
    differ = run_main(["compare", a, b])
    assert differ.returncode == 1, differ.stdout
    assert differ.stdout.strip().endswith("; 1 value(s) NaN in one run only"), differ.stdout
    torch.save({"w": nan, "n": torch.tensor(4)}, a / "final.pt")
    assert run_main(["compare", a, b]).returncode == 0


def test_nproc_above_max_is_refused_before_anything_starts(tmp_path):
    proc = run_main(["run", "--workers", "1:2", "--nproc", "500", "--out", tmp_path / "o",
                     SCRIPTS / "ledger_train.py"])
    assert_one_line_error(proc, "--nproc 500 is more than --workers MAX 2",
                          "at most 2 workers train at once")
    assert not (tmp_path / "o" / "logs").exists()


def test_more_local_workers_than_memory_holds_are_refused_saying_how_many_fit(tmp_path):
    forked = forkserver.wanted()
    many = 2 * memory_available_mib() // worker_mib(forked)  # twice what fits
    proc = run_main(["run", "--workers", f"1:{many + 1}", "--nproc", str(many - 1), "--standby",
                     "1", "--out", tmp_path / "o", SCRIPTS / "ledger_train.py"])
    assert_one_line_error(proc, f"{many} local workers (--nproc and --standby) need at least "
                          f"{first_workers_mib(many, forked)} MiB", "MiB available: at most")
    assert not (tmp_path / "o" / "logs").exists()
