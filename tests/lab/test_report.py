"""``dyntrain lab report``: the analysis, its JSON/Markdown/PNG outputs and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from dyntrain.cli.main import main
from dyntrain.lab import LabError, Measurement, Study, Trial, read_studies, write_study
from dyntrain.lab.analysis import REGIME_RULE, analyse, find_hyperparameter
from dyntrain.lab.fit import DIMINISHING, MAXIMAL, NOT_REACHED, PERFECT
from dyntrain.lab.noise import load_noise, parse_noise_spec
from dyntrain.lab.render import fmt, to_json, to_markdown

FIXTURES = Path(__file__).parent / "fixtures"
BATCH_SCIENCE = FIXTURES / "batch_science"
GOOGLE = FIXTURES / "google_archive"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

S_MIN, B_CRIT = 1000.0, 256.0
BATCHES = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
SPACE = {"learning_rate": {"min": 1e-4, "max": 10.0, "scale": "log"},
         "momentum": {"min": 0.5, "max": 0.999, "scale": "reverse_log"}}


def model_steps(b, s_min=S_MIN, b_crit=B_CRIT) -> int:
    return round(s_min * (1 + b_crit / b))


def synthetic_study(b, steps, *, optimizer="momentum", lr=None, momentum=0.9, target=0.1,
                    dataset="cifar10", model="resnet8", space=SPACE) -> Study:
    """A study whose best trial passes ``target`` exactly at ``steps`` (None: never)."""
    lr = 0.01 * math.sqrt(b / 16) if lr is None else lr
    if steps is None:
        trials = [Trial("t0", b, {"learning_rate": lr, "momentum": momentum},
                        [Measurement(100, 0.5), Measurement(200, 0.2)]),
                  Trial("t1", b, {"learning_rate": 9.0}, [Measurement(100, 0.01)], True)]
    else:
        best = Trial("best", b, {"learning_rate": lr, "momentum": momentum},
                     [Measurement(max(steps // 2, 1), 0.5), Measurement(steps, 0.05)])
        slow = Trial("slow", b, {"learning_rate": lr / 4, "momentum": 0.6},
                     [Measurement(steps, 0.3), Measurement(3 * steps, 0.05)])
        trials = [slow, best]
    return Study(dataset, model, optimizer, b, trials, "valid_error", target,
                 eval_every=None, search_space=dict(space))


def write_workload(root: Path, *, s_min=S_MIN, b_crit=B_CRIT, batches=BATCHES, **kw) -> Path:
    for b in batches:
        write_study(root, synthetic_study(b, model_steps(b, s_min, b_crit), **kw))
    return root


def invoke(args, capsys) -> tuple[int, str, str]:
    """Run the real CLI entry point in-process: (exit code, stdout, stderr)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_MAGIC, path


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dyntrain: error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


# --- the analysis ----------------------------------------------------------------------------


def test_synthetic_curve_recovers_fit_regimes_and_lr_exponent(tmp_path):
    reports = analyse(read_studies(write_workload(tmp_path)))
    (r,) = reports
    assert r.name == "cifar10/resnet8/momentum" and r.goal == "valid_error < 0.1"
    data = json.loads(json.dumps(to_json(reports), allow_nan=False))
    (w,) = data["workloads"]
    fit = w["fit"]
    assert fit["s_min"] == pytest.approx(S_MIN, rel=0.02)
    assert fit["b_crit"] == pytest.approx(B_CRIT, rel=0.02)
    assert fit["e_min"] == pytest.approx(S_MIN * B_CRIT, rel=0.03)
    assert fit["r2"] > 0.999 and fit["n"] == len(BATCHES)
    assert w["fit_note"] == ""
    regimes = [p["regime"] for p in w["points"]]
    # in batch order: perfect scaling, then diminishing returns, then maximal parallelism
    order = [PERFECT, DIMINISHING, MAXIMAL]
    assert regimes == sorted(regimes, key=order.index)
    assert set(regimes) == set(order)
    assert w["regimes"][PERFECT] == [16, 32, 64]
    assert w["regimes"][MAXIMAL] == [1024, 2048, 4096, 8192]
    for p in w["points"]:
        assert p["steps"] == model_steps(p["batch_size"])
        assert p["examples"] == p["batch_size"] * p["steps"]
        assert p["best_trial"] == "best" and p["trials"] == 2 and p["diverged"] == 0
        assert p["learning_rate"] == pytest.approx(0.01 * math.sqrt(p["batch_size"] / 16))
        assert p["momentum"] == 0.9
    assert w["learning_rate"]["measured_exponent"] == pytest.approx(0.5, abs=1e-6)
    assert w["learning_rate"]["sqrt"] == pytest.approx(w["learning_rate"]["measured"])
    assert w["warnings"] == []
    assert data["regime_rule"] == REGIME_RULE and "B_crit/3" in REGIME_RULE
    md = to_markdown(reports, {})
    assert REGIME_RULE in md
    assert "Best learning rate goes as B^0.50" in md and "closer to square-root scaling" in md
    assert f"| {fmt(r.fit.s_min)} | {fmt(r.fit.b_crit)} | {fmt(r.fit.e_min)} | " in md
    assert "| 16 | 17000 | 272000 | perfect scaling | 0.01 | 0.9 | best | 2 (0) |" in md


def test_target_override_and_nan_free_json(tmp_path):
    write_workload(tmp_path)
    (r,) = analyse(read_studies(tmp_path), target=0.01)  # nobody reaches 0.01
    assert r.fit is None and r.target == 0.01
    assert r.fit_note.startswith("target never reached at any batch size")
    assert all(p.regime == NOT_REACHED and p.reason for p in r.points)
    json.dumps(to_json([r]), allow_nan=False)
    with pytest.raises(LabError, match="no studies"):
        analyse([])


def test_fewer_than_three_reached_points_give_no_fit(tmp_path):
    for b in (64, 128, 256, 512):
        write_study(tmp_path, synthetic_study(b, model_steps(b) if b < 256 else None))
    (r,) = analyse(read_studies(tmp_path))
    assert r.fit is None
    assert "reached at only 2 of 4 batch sizes; need at least 3" in r.fit_note
    assert [p.regime for p in r.points] == [None, None, NOT_REACHED, NOT_REACHED]
    assert r.points[3].reason == "no trial reached valid_error < 0.1 (best 0.2); 1 of 2 trials " \
                                 "diverged"
    md = to_markdown([r], {})
    assert "**No fit:** target reached at only 2 of 4" in md
    assert "not reached: no trial reached valid_error < 0.1 (best 0.2)" in md


@pytest.mark.parametrize("hparams, lr", [
    ({"learning_rate": 0.3, "lr": 0.1}, 0.3),
    ({"LR": "0.2"}, 0.2),
    ({"base_learning_rate": 0.05}, 0.05),
    ({"optimizer": {"lr": 0.4}}, 0.4),
    ({"optimizer/lr": 0.4}, 0.4),
    ({"learning_rate.value": 0.7}, 0.7),
    ({"learning_rate": {"value": 0.6, "schedule": "cosine"}}, 0.6),
    ({"learning_rate": "cosine", "peak_learning_rate": 1.5}, 1.5),
    ({"end_learning_rate_factor": 0.01, "learning_rate_decay_steps": 1000}, None),
    ({"learning_rate": 0, "lr": True}, None),
    ({}, None),
])
def test_learning_rate_lookup_is_lenient(hparams, lr):
    from dyntrain.lab.analysis import LR_KEYS

    assert find_hyperparameter(hparams, LR_KEYS, positive=True) == lr


def test_edge_warning_reaches_report(tmp_path):
    for b in (64, 128, 256, 512):
        lr = 9.9 if b == 512 else None  # on the upper edge of [1e-4, 10] (log scale)
        write_study(tmp_path, synthetic_study(b, model_steps(b), lr=lr))
    (r,) = analyse(read_studies(tmp_path))
    (warning,) = r.warnings
    assert "batch 512" in warning and "learning_rate=9.9" in warning and "upper edge" in warning
    md = to_markdown([r], {})
    assert md.count("learning_rate=9.9 at the upper edge") == 2  # workload and global list


def test_optimizer_comparison(tmp_path):
    write_workload(tmp_path, optimizer="momentum")
    write_workload(tmp_path, optimizer="sgd", s_min=4000.0, b_crit=64.0,
                   batches=[16, 64, 256, 1024, 4096])
    reports = analyse(read_studies(tmp_path))
    assert [r.optimizer for r in reports] == ["momentum", "sgd"]
    data = to_json(reports)
    (cmp,) = data["optimizer_comparisons"]
    assert (cmp["dataset"], cmp["model"], cmp["same_goal"]) == ("cifar10", "resnet8", True)
    assert cmp["batch_sizes"] == [16, 64, 256, 1024, 4096]
    mom, sgd = cmp["rows"]
    assert mom["optimizer"] == "momentum" and sgd["optimizer"] == "sgd"
    assert sgd["s_min"] == pytest.approx(4000, rel=0.02)
    assert sgd["b_crit"] == pytest.approx(64, rel=0.03)
    assert mom["b_crit"] == pytest.approx(B_CRIT, rel=0.02)
    assert sgd["steps"] == [model_steps(b, 4000, 64) for b in cmp["batch_sizes"]]
    md = to_markdown(reports, {})
    assert "#### Optimizer comparison" in md
    assert "| Optimizer | S_min | B_crit | E_min | R² | S at B=16 | S at B=64 |" in md
    assert f"| sgd | {fmt(sgd['s_min'])} | {fmt(sgd['b_crit'])} |" in md
    assert "largest critical batch size (B_crit): **momentum**" in md
    # a different model is not compared
    write_workload(tmp_path, model="vgg", batches=[16, 64, 256])
    assert len(to_json(analyse(read_studies(tmp_path)))["optimizer_comparisons"]) == 1


# --- gradient noise scale input --------------------------------------------------------------


def write_metrics(path: Path, values, *, extra_lines=()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ['{"event": "start", "world": 2}']
    for step, v in enumerate(values):
        lines.append(json.dumps({"step": step, "loss": 1.0 / (step + 1), "b_simple": v}))
        if step % 3 == 0:
            lines.append(json.dumps({"step": step, "eval_loss": 0.5}))  # no b_simple: ignored
    lines += list(extra_lines)
    path.write_text("\n".join(lines) + "\n\n")
    return path


def test_load_noise_and_second_half_mean(tmp_path):
    values = [None, None] + [10.0 * (i + 1) for i in range(8)] + [200.0, 200.0]
    path = write_metrics(tmp_path / "run-a" / "metrics.jsonl", values)
    s = load_noise(path)
    assert s.name == "run-a" and s.steps == list(range(12))
    assert s.window == (6, 11)  # the second half of steps 0..11
    assert s.mean_second_half == pytest.approx((50 + 60 + 70 + 80 + 200 + 200) / 6)
    assert load_noise(path, "mine").name == "mine"
    assert parse_noise_spec(f"x={path}") == ("x", path)
    assert parse_noise_spec(str(path)) == (None, path)
    with pytest.raises(LabError, match="NAME"):
        parse_noise_spec("=abc")


@pytest.mark.parametrize("bad, line, what", [
    ('{"step": 1, "b_simple": 3.0}\n{not json\n', 2, "invalid JSON"),
    ('{"step": 1, "b_simple": "big"}\n', 1, "b_simple is not a number"),
    ('\n{"b_simple": 3.0}\n', 2, "no integer step"),
])
def test_load_noise_malformed_names_file_and_line(tmp_path, bad, line, what):
    path = tmp_path / "metrics.jsonl"
    path.write_text(bad)
    with pytest.raises(LabError) as info:
        load_noise(path)
    assert str(info.value).startswith(f"{path}:{line}: ") and what in str(info.value)


def test_load_noise_without_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n')
    with pytest.raises(LabError, match="no records with a b_simple key"):
        load_noise(path)
    with pytest.raises(LabError, match="cannot read"):
        load_noise(tmp_path / "missing.jsonl")


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_on_checked_in_fixture(tmp_path):
    out = tmp_path / "report"
    proc = run_cli(["lab", "report", BATCH_SCIENCE, "--out", out], check=True, timeout=120)
    assert "mnist/simple_cnn/momentum" in proc.stdout
    assert "no fit: target reached at only 2 of 3 batch sizes" in proc.stdout
    assert "B=128" in proc.stdout and "not reached (no trial reached valid_error" in proc.stdout
    assert "upper edge" in proc.stdout and str(out / "report.md") in proc.stdout
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["best_lr_mnist_simple_cnn.png", "steps_vs_batch_mnist_simple_cnn.png"]
    for p in out.glob("*.png"):
        assert_png(p)
    md = (out / "report.md").read_text()
    assert "![steps to result against batch size](steps_vs_batch_mnist_simple_cnn.png)" in md
    assert "| 64 | 300 | 19200 |" in md and "| 256 | 150 | 38400 |" in md
    assert "| 128 | — | — | not reached: no trial reached valid_error < 0.05 (best 0.06); " \
           "1 of 2 trials diverged |" in md
    assert "trial_2 has learning_rate=0.98 at the upper edge" in md
    data = json.loads((out / "summary.json").read_text())
    (w,) = data["workloads"]
    assert w["fit"] is None and "need at least 3" in w["fit_note"]
    assert [(p["batch_size"], p["steps"]) for p in w["points"]] == [
        (64, 300), (128, None), (256, 150)]
    assert data["plots"]["steps_vs_batch:mnist/simple_cnn"] == "steps_vs_batch_mnist_simple_cnn.png"
    assert not (BATCH_SCIENCE / "report").exists()


def test_cli_reads_google_archive_layout(tmp_path, capsys):
    # Google's archive: no metric/target in study.json, "parameters", "parameter_configs",
    # status INFEASIBLE, val/... columns, integer trial folders
    out = tmp_path / "out"
    code, stdout, err = invoke(["lab", "report", GOOGLE, "--out", out, "--target", "0.3",
                                "--metric", "val/classification_error"], capsys)
    assert code == 0, err
    data = json.loads((out / "summary.json").read_text())
    (w,) = data["workloads"]
    assert w["workload"] == "cifar_10/resnet_8/nesterov_momentum"
    assert w["fit"]["s_min"] == pytest.approx(1000, rel=0.01)
    assert w["fit"]["b_crit"] == pytest.approx(64, rel=0.01)
    assert w["fit"]["r2"] > 0.999
    # the INFEASIBLE trial "passes" at step 100 but diverged: not counted
    assert [p["steps"] for p in w["points"]] == [5000, 3000, 2000, 1500, 1250, 1125]
    assert [p["best_trial"] for p in w["points"]] == ["0"] * 6
    assert w["regimes"] == {PERFECT: [16], DIMINISHING: [32, 64, 128], MAXIMAL: [256, 512]}
    assert w["learning_rate"]["measured_exponent"] == pytest.approx(1.0)
    (warning,) = w["warnings"]
    assert "momentum=0.99992 at the upper edge" in warning
    md = (out / "report.md").read_text()
    assert "| 1000 | 64 | 64000 | 1.000 | 6 |" in md
    assert "B_crit=64" in stdout and "maximal data parallelism" in stdout
    assert "closer to linear scaling" in stdout and "closer to linear scaling" in md
    for name in ("steps_vs_batch_cifar_10_resnet_8.png", "best_lr_cifar_10_resnet_8.png"):
        assert_png(out / name)


def test_cli_google_archive_needs_metric_and_target(tmp_path, capsys):
    code, _, err = invoke(["lab", "report", GOOGLE, "--out", tmp_path], capsys)
    assert_one_line_error(code, err, "pass --metric COLUMN")
    code, _, err = invoke(["lab", "report", GOOGLE, "--out", tmp_path, "--metric",
                           "val/classification_error"], capsys)
    assert_one_line_error(code, err, "no 'target'", "pass --target VALUE")


def test_cli_synthetic_with_noise_and_two_optimizers(tmp_path, capsys):
    root = tmp_path / "studies"
    write_workload(root, optimizer="momentum")
    write_workload(root, optimizer="sgd", s_min=4000.0, b_crit=64.0, batches=[16, 64, 256, 1024])
    metrics = write_metrics(tmp_path / "runs" / "r1" / "metrics.jsonl",
                            [None] + [256.0] * 10 + [None])
    other = write_metrics(tmp_path / "other.jsonl", [50.0, 70.0, 90.0, 110.0, None])
    code, stdout, err = invoke(["lab", "report", root, "--noise", metrics,
                                "--noise", f"small={other}"], capsys)
    assert code == 0, err
    out = root / "report"  # the default
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["best_lr_cifar10_resnet8.png", "noise.png",
                     "steps_vs_batch_cifar10_resnet8.png"]
    for p in out.glob("*.png"):
        assert_png(p)
    data = json.loads((out / "summary.json").read_text())
    r1, small = data["noise"]
    assert (r1["name"], small["name"]) == ("r1", "small")
    assert r1["b_simple_mean"] == pytest.approx(256.0)
    assert small["b_simple_mean"] == pytest.approx(100.0)  # steps 2..4 of 0..4; null skipped
    mom = next(c for c in r1["vs_b_crit"] if c["workload"].endswith("/momentum"))
    assert mom["ratio"] == pytest.approx(256.0 / mom["b_crit"]) == pytest.approx(1.0, rel=0.03)
    md = (out / "report.md").read_text()
    assert "## Gradient noise scale" in md and "![B_simple over training](noise.png)" in md
    assert "#### Optimizer comparison" in md and "| Optimizer | S_min |" in md
    assert "noise r1: mean B_simple 256" in stdout
    # --quiet: only where it went
    code, stdout, _ = invoke(["lab", "report", root, "--quiet"], capsys)
    assert code == 0 and stdout.strip().splitlines() == [stdout.strip()]
    assert stdout.startswith("wrote ")


def test_cli_workload_that_never_reaches_target(tmp_path, capsys):
    for b in (32, 64, 128):
        write_study(tmp_path / "s", synthetic_study(b, None))
    code, stdout, err = invoke(["lab", "report", tmp_path / "s", "--out", tmp_path / "o"],
                               capsys)
    assert code == 0, err
    assert "no fit: target never reached at any batch size (3 measured)" in stdout
    md = (tmp_path / "o" / "report.md").read_text()
    assert "**No fit:** target never reached at any batch size" in md
    assert_png(tmp_path / "o" / "steps_vs_batch_cifar10_resnet8.png")
    assert not (tmp_path / "o" / "best_lr_cifar10_resnet8.png").exists()
    data = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert data["workloads"][0]["learning_rate"] is None


def test_cli_says_no_finished_trials_instead_of_target_never_reached(tmp_path, capsys):
    """A sweep interrupted before its first trial, or a batch size still waiting for one."""
    root = tmp_path / "s"
    for b in (32, 64):
        study = synthetic_study(b, None)
        write_study(root, Study(study.dataset, study.model, study.optimizer, b, [],
                                study.metric, study.target))
    code, stdout, err = invoke(["lab", "report", root], capsys)
    assert_one_line_error(code, err, "no finished trials yet (2 studies planned)", "to resume")
    assert "never reached" not in err and not (root / "report").exists()
    write_study(root, synthetic_study(128, None))
    code, stdout, err = invoke(["lab", "report", root], capsys)
    assert code == 0, err
    assert "B=32      no finished trials" in stdout and "B=128     not reached (" in stdout


def test_cli_bad_inputs_are_one_line_errors(tmp_path, capsys):
    code, _, err = invoke(["lab", "report", tmp_path / "missing"], capsys)
    assert_one_line_error(code, err, "no such folder")
    (tmp_path / "empty").mkdir()
    code, _, err = invoke(["lab", "report", tmp_path / "empty"], capsys)
    assert_one_line_error(code, err, "no studies under")
    assert not (tmp_path / "empty" / "report").exists()

    root = write_workload(tmp_path / "ok", batches=[64, 128, 256])
    bad_csv = next(root.rglob("measurements.csv"))
    good = bad_csv.read_text()
    bad_csv.write_text(good + "oops,0.1\n")
    code, _, err = invoke(["lab", "report", root], capsys)
    assert_one_line_error(code, err, f"{bad_csv}:", "step is not an integer")
    bad_csv.write_text(good)

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "b_simple": 3.0}\n{"step": 2, "b_simple": \n')
    code, _, err = invoke(["lab", "report", root, "--noise", metrics], capsys)
    assert_one_line_error(code, err, f"{metrics}:2: invalid JSON")
    code, _, err = invoke(["lab", "report", root, "--noise", tmp_path / "nope.jsonl"], capsys)
    assert_one_line_error(code, err, "cannot read")
    code, _, err = invoke(["lab", "report", root, "--target", "abc"], capsys)
    assert_one_line_error(code, err, "--target")
    (tmp_path / "file").write_text("x")
    code, _, err = invoke(["lab", "report", root, "--out", tmp_path / "file" / "sub"], capsys)
    file = tmp_path / "file"
    assert_one_line_error(code, err, f"--out {file / 'sub'}: {file} is a file, not a folder")


def test_cli_bad_inputs_real_process(tmp_path):
    write_study(tmp_path, synthetic_study(64, 100))
    bad = next(tmp_path.rglob("measurements.csv"))
    bad.write_text("step,valid_error\n100,0.5\n200,abc\n")
    proc = run_cli(["lab", "report", tmp_path], timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"dyntrain: error: {bad}:3: valid_error is not a number: "
                                   "'abc'")


def test_report_command_does_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from dyntrain.cli.main import main\n"
        f"main(['lab', 'report', {str(BATCH_SCIENCE)!r}, '--out', {str(tmp_path)!r}, '-q'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "report.md").exists()


def test_report_states_the_evaluation_interval(tmp_path):
    """The report says how often the metric was evaluated (k), from study.json's eval_every."""
    from dyntrain.lab.analysis import analyse
    from dyntrain.lab.render import to_json, to_markdown

    studies = []
    for b, s in ((8, 400), (32, 120), (128, 60)):
        trial = Trial("t0", b, {"learning_rate": 0.1},
                      [Measurement(s - 5, 0.5), Measurement(s, 0.01)])
        studies.append(Study("d", "m", "sgd", b, [trial], "valid_error", 0.05, False, 5, {}))
    (report,) = analyse(studies)
    assert report.eval_every == (5,) and report.evaluation == "evaluated every 5 steps"
    assert "evaluated every 5 steps" in to_markdown([report], {})
    assert to_json([report])["workloads"][0]["eval_every"] == [5]
    no_k = [Study("d", "m", "sgd", s.batch_size, s.trials, "valid_error", 0.05, False)
            for s in studies]
    assert analyse(no_k)[0].evaluation == "evaluation interval not recorded"
