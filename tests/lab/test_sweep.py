"""The sweep: search spaces, the trial loop, planning, resumable runs inline and on a service."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import DYNTRAIN, SCRIPTS, run_cli, run_main
from dyntrain.lab.results import LabError, best_steps, read_studies, steps_to_result
from dyntrain.lab.search import (
    LOG,
    ONE_MINUS_LOG,
    Param,
    parse_range,
    search_space,
    sobol_points,
    trial_points,
)
from dyntrain.lab.sweep import describe, run_sweep
from dyntrain.lab.sweep_files import prepare, read_outcome, write_trial
from dyntrain.lab.sweep_plan import (
    SweepConfig,
    TrialTask,
    config_from,
    geometric_grid,
    parse_batch_sizes,
    plan,
)
from dyntrain.lab.trial import TrialSpec, run_trial
from dyntrain.lab.workload import LabWorkload, load_workload
from dyntrain.testing.wait import wait_until

# ------------------------------------------------------------------------------ search space


def test_param_maps_the_unit_interval_onto_its_scale():
    lr = Param("learning_rate", 1e-3, 10.0, LOG)
    assert lr.value(0) == pytest.approx(1e-3) and lr.value(1) == pytest.approx(10.0)
    assert lr.value(0.5) == pytest.approx(0.1)  # the geometric middle
    mom = Param("momentum", 0.5, 0.999, ONE_MINUS_LOG)
    assert mom.value(0) == pytest.approx(0.5) and mom.value(1) == pytest.approx(0.999)
    # uniform in log(1 - m): the middle of [0.5, 0.999] is 1 - sqrt(0.5 * 0.001)
    assert mom.value(0.5) == pytest.approx(1 - math.sqrt(0.5 * 0.001))


@pytest.mark.parametrize("low,high,scale,needle", [
    (1.0, 0.5, LOG, "low < high"), (0.0, 1.0, LOG, "positive"),
    (0.5, 1.0, ONE_MINUS_LOG, "[0, 1)"), (1.0, 2.0, "cubic", "unknown scale")])
def test_param_rejects_bad_ranges(low, high, scale, needle):
    with pytest.raises(LabError, match=None) as e:
        Param("x", low, high, scale)
    assert needle in str(e.value)


def test_sobol_points_are_deterministic_in_range_and_prefix_stable():
    a = sobol_points(8, 2, seed=3)
    b = sobol_points(16, 2, seed=3)
    assert a == b[:8]  # extending a sweep keeps the trials already run
    assert sobol_points(8, 2, seed=4) != a
    assert all(0 <= u < 1 for p in b for u in p)
    # quasi-random: every half of each axis gets exactly half of the first 16 points
    for dim in range(2):
        assert sum(p[dim] < 0.5 for p in b) == 8


def test_search_spaces_per_optimizer():
    assert [p.name for p in search_space("sgd", (1e-3, 1), (0.5, 0.99))] == ["learning_rate"]
    space = search_space("nesterov", (1e-3, 1), (0.5, 0.99))
    assert [p.name for p in space] == ["learning_rate", "momentum"]
    for hp in trial_points(space, 10, seed=0):
        assert 1e-3 <= hp["learning_rate"] <= 1 and 0.5 <= hp["momentum"] <= 0.99
    with pytest.raises(LabError, match="unknown optimizer 'adam'"):
        search_space("adam", (1e-3, 1), (0.5, 0.99))
    with pytest.raises(LabError, match="LOW:HIGH"):
        parse_range("0.1-1", "--lr-range")


# ------------------------------------------------------------------------------ config


def test_batch_size_grids_and_config_validation():
    assert geometric_grid(4, 64) == (4, 8, 16, 32, 64)
    assert parse_batch_sizes("8:32") == (8, 16, 32)
    assert parse_batch_sizes("32,8, 16") == (32, 8, 16)
    assert SweepConfig(batch_sizes=(32, 8, 8)).batch_sizes == (8, 32)
    for text in ("", "a:b", "8,x"):
        with pytest.raises(LabError):
            parse_batch_sizes(text)
    with pytest.raises(LabError, match="grid is empty"):
        SweepConfig(batch_sizes=())
    with pytest.raises(LabError, match="positive integers"):
        SweepConfig(batch_sizes=(0, 8))
    with pytest.raises(LabError, match="eval_every"):
        SweepConfig(batch_sizes=(8,), budget_steps=10, eval_every=11)
    with pytest.raises(LabError, match="trials must be positive"):
        SweepConfig(batch_sizes=(8,), trials=0)
    with pytest.raises(LabError, match="unknown preset"):
        config_from("huge")
    with pytest.raises(LabError, match="--batch-sizes"):
        config_from(None)
    quick = config_from("quick", trials=3)
    assert quick.trials == 3 and quick.batch_sizes[0] == 4 and quick.optimizers == ("sgd",
                                                                                    "nesterov")


# ------------------------------------------------------------------------------ a toy workload


TOY = f"{SCRIPTS / 'toy_workload.py'}:toy_workload"


def toy_workload(n: int = 256) -> LabWorkload:
    return load_workload(TOY, {"n": str(n)})


def spec(**kw) -> TrialSpec:
    base = {"optimizer": "sgd", "batch_size": 16, "hyperparameters": {"learning_rate": 0.5},
            "seed": 0, "budget_steps": 200, "eval_every": 1, "target": 0.1,
            "higher_is_better": False}
    return TrialSpec(**{**base, **kw})


def test_trial_stops_at_the_first_evaluation_past_the_target():
    out = run_trial(toy_workload(), spec())
    assert not out.diverged and out.reason == "reached target"
    assert out.steps_to_result == out.steps_run == out.measurements[-1].step
    assert out.measurements[-1].metric_value < 0.1
    assert all(m.metric_value >= 0.1 for m in out.measurements[:-1])


def test_trial_evaluates_every_k_steps_and_is_deterministic():
    a = run_trial(toy_workload(), spec(eval_every=5, stop_at_target=False, budget_steps=40))
    b = run_trial(toy_workload(), spec(eval_every=5, stop_at_target=False, budget_steps=40))
    assert [m.step for m in a.measurements] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert [m.metric_value for m in a.measurements] == [m.metric_value for m in b.measurements]
    assert a.steps_to_result is not None and a.steps_to_result % 5 == 0
    assert a.steps_run == 40  # kept training past the target


def test_trial_marks_divergence_and_budget_exhaustion():
    diverged = run_trial(toy_workload(), spec(
        optimizer="nesterov", hyperparameters={"learning_rate": 1e4, "momentum": 0.99}))
    assert diverged.diverged and diverged.steps_to_result is None
    assert "training loss" in diverged.reason
    slow = run_trial(toy_workload(), spec(hyperparameters={"learning_rate": 1e-6},
                                          budget_steps=30))
    assert not slow.diverged and slow.steps_to_result is None
    assert slow.reason == "budget exhausted" and slow.steps_run == 30


def test_trial_rejects_a_batch_larger_than_the_data():
    with pytest.raises(LabError, match="larger than the training set"):
        run_trial(toy_workload(n=32), spec(batch_size=64))


# ------------------------------------------------------------------------------ plan and files


def test_plan_gives_each_trial_the_same_setting_at_every_batch_size(tmp_path):
    cfg = SweepConfig(batch_sizes=(8, 32), optimizers=("sgd", "nesterov"), trials=3)
    sweep = plan(tmp_path, cfg, toy_workload())
    assert len(sweep.tasks) == 2 * 2 * 3
    by = {(t.spec.optimizer, t.spec.batch_size, t.trial_id): t.spec for t in sweep.tasks}
    for opt in ("sgd", "nesterov"):
        for i in range(3):
            a, b = by[(opt, 8, f"trial_000{i}")], by[(opt, 32, f"trial_000{i}")]
            assert a.hyperparameters == b.hyperparameters and a.seed == b.seed
    assert sweep.target == 0.1 and sweep.metric == "valid_error"
    assert "momentum" in by[("nesterov", 8, "trial_0000")].hyperparameters
    with pytest.raises(LabError, match="exceed the training set"):
        plan(tmp_path, SweepConfig(batch_sizes=(512,)), toy_workload())


def test_prepare_refuses_a_folder_with_other_settings(tmp_path):
    w = toy_workload()
    prepare(plan(tmp_path, SweepConfig(batch_sizes=(8,), budget_steps=50), w))
    # more batch sizes, trials and optimizers: fine
    prepare(plan(tmp_path, SweepConfig(batch_sizes=(8, 16), trials=20, budget_steps=50,
                                       optimizers=("momentum",)), w))
    with pytest.raises(LabError, match="budget_steps 50 -> 60"):
        prepare(plan(tmp_path, SweepConfig(batch_sizes=(8,), budget_steps=60), w))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "sweep.json").write_text("not json")
    with pytest.raises(LabError, match="not a dyntrain sweep file"):
        prepare(plan(tmp_path / "other", SweepConfig(batch_sizes=(8,)), w))


def test_unfinished_trials_are_invisible_and_rerun(tmp_path):
    w = toy_workload()
    sweep = plan(tmp_path, SweepConfig(batch_sizes=(16,), trials=2, budget_steps=100,
                                       optimizers=("sgd",)), w)
    prepare(sweep)
    task = sweep.tasks[0]
    # a trial killed mid-write leaves a hidden folder: not a trial, and still pending
    partial = Path(task.study_dir) / f".{task.trial_id}.999.abc.tmp"
    partial.mkdir()
    (partial / "measurements.csv").write_text("step,valid_error\n1,0.5\n")
    assert len(sweep.pending()) == 2
    studies = read_studies(tmp_path)
    assert studies[0].trials == []
    write_trial(task, run_trial(w, task.spec), "valid_error")
    assert [t.trial_id for t in sweep.pending()] == ["trial_0001"]
    assert [t.trial_id for t in read_studies(tmp_path)[0].trials] == ["trial_0000"]


def test_progress_line_of_a_trial_read_back_from_disk_shows_the_best_value(tmp_path):
    """The service path prints trials as read from their folders: the best value reached, not
    'best nan'."""
    w = toy_workload()
    sweep = plan(tmp_path, SweepConfig(batch_sizes=(16,), trials=1, budget_steps=3,
                                       lr_range=(1e-5, 2e-5), optimizers=("sgd",)), w)
    prepare(sweep)
    task = sweep.tasks[0]
    outcome = run_trial(w, task.spec)
    assert outcome.steps_to_result is None
    write_trial(task, outcome, "valid_error")
    best = min(m.metric_value for m in outcome.measurements)
    line = describe(task, read_outcome(task, "valid_error"))
    assert line == describe(task, outcome) and f"(best {best:.4g})" in line, line
    assert "nan" not in line


def test_run_sweep_inline_writes_the_batch_science_layout_and_resumes(tmp_path, capsys):
    cfg = SweepConfig(batch_sizes=(8, 32, 128), optimizers=("sgd", "nesterov"), trials=3,
                      budget_steps=150, lr_range=(0.01, 3.0), workload=TOY)
    sweep = run_sweep(tmp_path, cfg, jobs=1)
    err = capsys.readouterr().err
    assert "= 18 trials" in err and "[18/18]" in err and "steps to result" in err
    studies = read_studies(tmp_path)
    assert len(studies) == 6
    for study in studies:
        assert study.eval_every == 1 and study.target == 0.1 and study.metric == "valid_error"
        assert [t.trial_id for t in study.trials] == ["trial_0000", "trial_0001", "trial_0002"]
        for trial in study.trials:
            meta = json.loads((tmp_path / "toy" / "linear" / study.optimizer /
                               str(study.batch_size) / trial.trial_id /
                               "metadata.json").read_text())
            # what the trial recorded agrees with the analysis of its measurements
            assert meta["steps_to_result"] == steps_to_result(trial, 0.1, False)
        assert best_steps(study)[0] is not None, study.batch_size
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("metadata.json")}
    # the same command again: nothing re-runs
    run_sweep(tmp_path, cfg, jobs=1)
    assert "18 trials already finished, 0 to run" in capsys.readouterr().err
    assert stamps == {p: p.stat().st_mtime_ns for p in tmp_path.rglob("metadata.json")}
    # one trial lost: only that one re-runs, with the same result
    lost = Path(sweep.tasks[4].folder())
    before = (lost / "measurements.csv").read_text()
    for f in lost.iterdir():
        f.unlink()
    lost.rmdir()
    run_sweep(tmp_path, cfg, jobs=1)
    assert "17 trials already finished, 1 to run" in capsys.readouterr().err
    assert (lost / "measurements.csv").read_text() == before


def test_sweep_cli_with_a_process_pool_and_a_plugin_workload(tmp_path):
    plugin = tmp_path / "my_workload.py"
    plugin.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from toy_workload import toy_workload\n"
        "def make(n='128'):\n"
        "    return toy_workload(n=n)\n")
    out = tmp_path / "sweep"
    proc = run_cli(["lab", "sweep", "--workload", f"{plugin}:make", "--workload-arg", "n=96",
                    "--batch-sizes", "8:32", "--optimizers", "momentum", "--trials", "2",
                    "--budget-steps", "80", "--jobs", "2", "--service", "none", "--out", out],
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "running inline with 2 process(es)" in proc.stderr and "[6/6]" in proc.stderr
    assert f"dyntrain lab report {out}" in proc.stderr
    studies = read_studies(out)
    assert [(s.optimizer, s.batch_size, len(s.trials)) for s in studies] == [
        ("momentum", 8, 2), ("momentum", 16, 2), ("momentum", 32, 2)]
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["fixed"]["workload_args"] == {"n": "96"}


@pytest.mark.parametrize("args,needle", [
    (["--batch-sizes", ""], "grid is empty"),
    (["--batch-sizes", "8,99999"], "exceed the training set"),
    (["--batch-sizes", "8", "--optimizers", "adam"], "unknown optimizer 'adam'"),
    (["--batch-sizes", "8", "--workload", "no_such_module:make"], "cannot import workload"),
    (["--batch-sizes", "8", "--workload", "digits-rnn"], "unknown workload"),
    (["--batch-sizes", "8", "--workload-arg", "novalue"], "KEY=VALUE"),
    (["--batch-sizes", "8", "--workload-arg", "width=3"], "does not take these arguments"),
    (["--batch-sizes", "8", "--lr-range", "1:0.1"], "low < high"),
    (["--batch-sizes", "8", "--momentum-range", "0.5:1.5"], "[0, 1)"),
    (["--batch-sizes", "8", "--jobs", "0"], "--jobs must be positive"),
    (["--batch-sizes", "8", "--service", "http://127.0.0.1:9"], "cannot reach"),
])
def test_sweep_bad_inputs_are_one_line_errors(tmp_path, args, needle):
    proc = run_main(["lab", "sweep", "--out", tmp_path / "s", "--trials", "1", *args])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert err.startswith("dyntrain: error:") and needle in err, err


def test_digits_workload_is_built_in():
    w = load_workload("digits-mlp")
    assert (w.dataset, w.model, w.metric, w.default_target) == ("digits", "mlp",
                                                                 "valid_error", 0.03)
    model = w.build_model()
    with torch.no_grad():
        err = w.evaluate(model)
    assert 0.5 < err <= 1.0  # untrained: about chance
    task = TrialTask("/nonexistent", "trial_0000", spec(batch_size=32, budget_steps=5))
    out = run_trial(w, task.spec)
    assert out.steps_run == 5 and len(out.measurements) == 5


# ------------------------------------------------------------------------------ on a service


def test_a_waiting_sweep_says_why_once_per_reason(capsys):
    from dyntrain.lab.sweep_service import say_why_waiting

    class Queue:  # list_jobs(parent=..., status="RUNNABLE") as the service answers it
        answers = [[], [{"waiting": {"reason": "no free slot", "position": 3}}],
                   [{"waiting": {"reason": "no free slot", "position": 1}}],
                   [{"waiting": {"reason": "queue q is DISABLED", "position": 1}}]]

        def list_jobs(self, **filters):
            assert filters == {"parent": "sweep-1", "status": "RUNNABLE", "limit": 1}
            return self.answers.pop(0)

    said, client = "", Queue()
    for _ in range(4):
        said = say_why_waiting(client, "sweep-1", said)
    assert capsys.readouterr().err.splitlines() == ["waiting: no free slot",
                                                    "waiting: queue q is DISABLED"]


@pytest.mark.slow
def test_sweep_runs_as_an_array_job_on_a_service(tmp_path):
    from dyntrain.service.client import Client
    from service.test_cli_service import start_server, stop_server

    proc, url = start_server(tmp_path / "state", tmp_path / "server.log")
    try:
        out = tmp_path / "sweep"
        args = ["lab", "sweep", "--workload", TOY,
                "--batch-sizes", "16,64", "--optimizers", "sgd", "--trials", "2",
                "--budget-steps", "100", "--lr-range", "0.1:2", "--service", url, "--out", out]
        first = run_main(args)  # the sweep's client in this process; its trials on the service
        assert first.returncode == 0, first.stderr[-3000:]
        # the embedded default: a `local` environment and a `default` queue
        assert "submitted 4 trials as job" in first.stderr and "queue default" in first.stderr
        assert "[4/4]" in first.stderr
        studies = read_studies(out)
        assert [len(s.trials) for s in studies] == [2, 2]
        assert all(best_steps(s)[0] is not None for s in studies)
        with Client(url) as client:
            jobs = client.list_jobs()
            assert len(jobs) == 1 and jobs[0]["array_size"] == 4
            assert jobs[0]["status"] == "SUCCEEDED"
        # resumable: nothing left to submit
        again = run_main(args)
        assert again.returncode == 0 and "0 to run" in again.stderr
        assert "submitted" not in again.stderr
        # trials bigger than the queue's slots: refused at once, naming the largest slot
        big = run_main([*args[:-1], tmp_path / "big", "--trial-cpus", "2"])
        assert big.returncode == 2 and "Traceback" not in big.stderr, big.stderr[-2000:]
        assert "needs cpus=2, gpus=0, memory_mib=1024 per worker, but the largest slot of " \
               "queue default's compute environments is cpus=1" in big.stderr, big.stderr
    finally:
        stop_server(proc)


def group_alive(pgid: int) -> bool:
    """Whether a process of the process group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_sweep_keeps_finished_trials_and_resumes(tmp_path, sig):
    """Ctrl-C or SIGTERM: exit 130 with a one-line hint, no traceback, no stray processes, only
    whole trial folders; the same command then runs only what is missing."""
    out, gate = tmp_path / "sweep", tmp_path / "gate"
    # every trial but the first waits for the gate: the sweep is surely running when stopped
    args = [*DYNTRAIN, "lab", "sweep", "--workload",
            f"{SCRIPTS / 'toy_workload.py'}:gated_toy_workload", "--workload-arg",
            f"gate={gate}", "--batch-sizes", "8:64", "--trials", "4", "--budget-steps", "40",
            "--lr-range", "1e-5:1e-4", "--jobs", "2", "--service", "none", "--out", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_until(lambda: list(out.rglob("trial_*/metadata.json"))
                   and list(tmp_path.glob("gate.waiting-*")),
                   "a finished trial and one waiting at the gate", 120,
                   unless=lambda: proc.poll() is not None and proc.communicate())
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):  # a failed test leaves no sweep behind
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted:" in err and "to resume" in err, err
    kept = int(re.search(r"interrupted: (\d+) of 32 trials", err).group(1))
    assert 1 <= kept < 32
    assert len(list(out.rglob("trial_*/metadata.json"))) == kept
    wait_until(lambda: not group_alive(proc.pid),  # zombies of the pool reaped too
               "the sweep's processes to be gone", 15)
    # the same command again runs only the pending trials
    gate.touch()
    again = run_cli([*args[3:], "--quiet"], timeout=600)
    assert again.returncode == 0, again.stderr
    assert len(list(out.rglob("trial_*/metadata.json"))) == 32


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_failing_user_workload_is_a_one_line_error(tmp_path, jobs):
    plugin = tmp_path / "broken.py"
    plugin.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from toy_workload import toy_workload\n"
        "def make():\n"
        "    w = toy_workload()\n"
        "    def loss_fn(model, batch):\n"
        "        raise RuntimeError('shapes do not match')\n"
        "    w.loss_fn = loss_fn\n"
        "    return w\n")
    # one job: the trials run in this process; two: in a process pool (its own command)
    sweep = run_main if jobs == "1" else run_cli
    proc = sweep(["lab", "sweep", "--workload", f"{plugin}:make", "--batch-sizes", "8",
                  "--optimizers", "sgd", "--trials", "2", "--jobs", jobs, "--service", "none",
                  "--out", tmp_path / "s", "--quiet"])
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert "sgd B=8 trial_000" in err and "RuntimeError: shapes do not match" in err, err
