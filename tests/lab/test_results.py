"""Study files in the batch-science layout and steps-to-result semantics."""

import json
import re
from pathlib import Path

import pytest

from dyntrain.errors import DyntrainError
from dyntrain.lab import (
    LabError,
    Measurement,
    Study,
    Trial,
    best_steps,
    edge_warnings,
    read_studies,
    steps_curve,
    steps_to_result,
    write_study,
)
from dyntrain.lab.results import default_higher_is_better, read_measurements

FIXTURES = Path(__file__).parent / "fixtures" / "batch_science"


def trial(tid, values, *, start=100, every=100, diverged=False, batch=64, **hparams):
    ms = [Measurement(start + i * every, v) for i, v in enumerate(values)]
    return Trial(tid, batch, hparams or {"learning_rate": 0.1}, ms, diverged)


def study(batch, trials, *, metric="valid_error", target=0.1, hib=None, **kw):
    return Study("cifar10", "resnet8", "nesterov", batch, trials, metric, target, hib,
                 eval_every=100, **kw)


# --- steps to result -------------------------------------------------------------------------


def test_threshold_is_strict_lower_is_better():
    t = trial("a", [0.5, 0.1, 0.0999])
    assert steps_to_result(t, 0.1, higher_is_better=False) == 300


def test_threshold_is_strict_higher_is_better():
    t = trial("a", [0.5, 0.9, 0.90001])
    assert steps_to_result(t, 0.9, higher_is_better=True) == 300
    assert steps_to_result(t, 0.95, higher_is_better=True) is None


def test_diverged_trial_has_no_steps_even_if_it_passed():
    t = trial("a", [0.01], diverged=True)
    assert steps_to_result(t, 0.1, higher_is_better=False) is None


def test_nan_never_passes():
    t = trial("a", [float("nan"), 0.05])
    assert steps_to_result(t, 0.1, higher_is_better=False) == 200


def test_default_direction_from_metric_name():
    assert default_higher_is_better("valid_error") is False
    assert default_higher_is_better("eval_cross_entropy_loss") is False
    assert default_higher_is_better("valid_accuracy") is True
    with pytest.raises(LabError, match="higher_is_better"):
        default_higher_is_better("mystery")
    assert study(64, [], metric="valid_accuracy", target=0.9).higher_is_better is True


def test_best_steps_is_minimum_over_trials_and_drops_diverged():
    s = study(64, [
        trial("slow", [0.5, 0.3, 0.09]),             # 300
        trial("fast", [0.5, 0.08]),                   # 200
        trial("boom", [0.01], diverged=True),         # would be 100, but diverged
        trial("never", [0.5, 0.2, 0.1]),              # equal to target: does not pass
    ])
    steps, best = best_steps(s)
    assert (steps, best.trial_id) == (200, "fast")


def test_steps_curve_sorted_with_reasons_for_unreached(tmp_path):
    studies = [
        study(256, [trial("a", [0.5, 0.05], batch=256)]),
        study(64, [trial("a", [0.5, 0.3, 0.2, 0.05])]),
        study(128, [trial("a", [0.5, 0.1]), trial("b", [0.01], diverged=True)]),
        study(512, [trial("a", [0.01], diverged=True), trial("b", [9.0], diverged=True)]),
    ]
    for s in studies:
        write_study(tmp_path, s)
    curve = steps_curve(read_studies(tmp_path))
    assert [p.batch_size for p in curve] == [64, 128, 256, 512]
    assert [p.steps for p in curve] == [400, None, 200, None]
    assert curve[0].best_trial.trial_id == "a" and curve[0].reason == ""
    assert "no trial reached valid_error < 0.1 (best 0.1)" in curve[1].reason
    assert "1 of 2 trials diverged" in curve[1].reason
    assert curve[3].reason == "all 2 trials diverged"
    b, steps, best, _ = curve[2]
    assert (b, steps, best.trial_id) == (256, 200, "a")


def test_steps_curve_merges_duplicate_batch_sizes_and_rejects_mixed_workloads():
    curve = steps_curve([study(64, [trial("a", [0.5, 0.05])]),
                         study(64, [trial("b", [0.05])])])
    assert [(p.batch_size, p.steps, p.best_trial.trial_id) for p in curve] == [(64, 100, "b")]
    other = Study("imagenet", "resnet50", "nesterov", 128, [], "valid_error", 0.1)
    with pytest.raises(LabError, match="mix workloads"):
        steps_curve([study(64, []), other])
    with pytest.raises(LabError, match="mix workloads or targets"):
        steps_curve([study(64, []), study(128, [], target=0.2)])
    with pytest.raises(LabError):
        steps_curve([])


# --- round trip and the checked-in fixture ---------------------------------------------------


def test_write_then_read_round_trip(tmp_path):
    t = Trial("t0", 32, {"learning_rate": 0.3, "momentum": 0.9, "activation": "relu"},
              [Measurement(10, 0.5, {"train_loss": 1.5}), Measurement(20, 0.25, {})], False)
    s = Study("mnist", "mlp", "sgd", 32, [t, trial("t1", [0.4], diverged=True, batch=32)],
              "valid_accuracy", 0.3, eval_every=10,
              search_space={"learning_rate": {"min": 0.01, "max": 1.0, "scale": "log"}})
    path = write_study(tmp_path, s)
    assert path == tmp_path / "mnist" / "mlp" / "sgd" / "32"
    header = (path / "t0" / "measurements.csv").read_text().splitlines()[0]
    assert header == "step,valid_accuracy,train_loss"
    (got,) = read_studies(tmp_path)
    assert got.workload == ("mnist", "mlp", "sgd") and got.batch_size == 32
    assert got.metric == "valid_accuracy" and got.higher_is_better is True
    assert got.target == 0.3 and got.eval_every == 10 and got.search_space == s.search_space
    assert [tr.trial_id for tr in got.trials] == ["t0", "t1"]
    assert got.trials[0].hyperparameters == t.hyperparameters
    assert got.trials[0].measurements[0] == Measurement(10, 0.5, {"train_loss": 1.5})
    assert got.trials[0].measurements[1].extras == {"train_loss": ""}
    assert got.trials[1].diverged
    assert best_steps(got)[0] == 10


def test_reads_checked_in_batch_science_fixture():
    studies = read_studies(FIXTURES)
    assert [(s.workload, s.batch_size) for s in studies] == [
        (("mnist", "simple_cnn", "momentum"), b) for b in (64, 128, 256)]
    s64 = studies[0]
    assert s64.metric == "valid_error" and s64.higher_is_better is False
    assert s64.target == 0.05 and s64.eval_every == 100
    assert [t.diverged for t in s64.trials] == [False, False, True]
    t2 = s64.trials[1]
    assert t2.measurements[0].extras == {"train_loss": 0.9, "wall_time": 12.5}
    # trial_1 equals the target at step 300 (no pass), passes at 400; trial_2 passes at 300;
    # diverged trial_3 "passes" at 100 but is dropped
    assert steps_to_result(s64.trials[0], 0.05, False) == 400
    curve = steps_curve(studies)
    assert [(p.batch_size, p.steps) for p in curve] == [(64, 300), (128, None), (256, 150)]
    assert curve[0].best_trial.trial_id == "trial_2"
    assert curve[1].reason.startswith("no trial reached valid_error < 0.05 (best 0.06)")


def test_edge_warnings_on_fixture():
    s64 = read_studies(FIXTURES)[0]
    (warning,) = edge_warnings(s64, s64.search_space)
    assert "trial_2" in warning and "learning_rate=0.98" in warning and "upper edge" in warning
    assert edge_warnings(s64, {"learning_rate": [0.001, 10.0]}) == []
    assert "lower edge" in edge_warnings(s64, {"learning_rate": [0.9, 100.0]})[0]
    # momentum 0.9 on a one-minus log scale over [0.5, 0.999] is mid-range; linear is not
    assert edge_warnings(s64, {"momentum": {"min": 0.5, "max": 0.999, "scale": "reverse"}}) == []
    assert edge_warnings(s64, [{"name": "momentum", "min_value": 0.0, "max_value": 0.91,
                                "scale": "linear"}])
    no_best = study(64, [trial("a", [0.5])])
    assert edge_warnings(no_best, {"learning_rate": [0.1, 1.0]}) == []


# --- malformed files -------------------------------------------------------------------------


def write_raw(root: Path, csv_text: str, study_json=None) -> Path:
    d = root / "mnist" / "mlp" / "sgd" / "128"
    (d / "t0").mkdir(parents=True)
    (d / "study.json").write_text(json.dumps(study_json or {"metric": "valid_error",
                                                            "target": 0.1}))
    (d / "t0" / "metadata.json").write_text('{"hyperparameters": {}, "status": "ok"}')
    path = d / "t0" / "measurements.csv"
    path.write_text(csv_text)
    return path


@pytest.mark.parametrize("text, line, what", [
    ("", 1, "missing header"),
    ("100,0.5\n200,0.4\n", 1, "missing header"),
    ("iteration,valid_error\n100,0.5\n", 1, "no 'step' column"),
    ("step,valid_accuracy\n100,0.5\n", 1, "no 'valid_error' column"),
    ("step,valid_error\n100,0.5\n200,abc\n", 3, "valid_error is not a number"),
    ("step,valid_error\n100,0.5\nx,0.4\n", 3, "step is not an integer"),
    ("step,valid_error\n100,0.5\n300,0.4\n200,0.3\n", 4, "steps not increasing"),
    ("step,valid_error\n100,0.5\n100,0.4\n", 3, "steps not increasing"),
    ("step,valid_error\n100,0.5\n200\n", 3, "expected 2 fields"),
])
def test_malformed_measurements_name_file_and_line(tmp_path, text, line, what):
    path = write_raw(tmp_path, text)
    with pytest.raises(LabError) as info:
        read_studies(tmp_path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}:{line}: ")
    assert what in msg
    assert isinstance(info.value, DyntrainError)


def test_lenient_reading(tmp_path):
    # blank lines, extra columns, float-formatted integer steps, unknown metadata keys
    path = write_raw(tmp_path, "step,valid_error,lr\n\n100.0,0.5,0.1\n200,0.05,sched\n\n",
                     {"metric_name": "valid_error", "target_value": 0.1, "extra": [1, 2]})
    ms = read_measurements(path, "valid_error")
    assert [(m.step, m.metric_value, m.extras["lr"]) for m in ms] == [
        (100, 0.5, 0.1), (200, 0.05, "sched")]
    (s,) = read_studies(tmp_path)
    assert best_steps(s)[0] == 200 and s.batch_size == 128


def test_metric_inferred_from_header_when_study_json_omits_it(tmp_path):
    write_raw(tmp_path, "step,train_loss,valid_error\n100,0.9,0.05\n", {"target": 0.1})
    (s,) = read_studies(tmp_path)
    assert s.metric == "valid_error" and best_steps(s)[0] == 100


def test_bad_study_json(tmp_path):
    write_raw(tmp_path, "step,valid_error\n100,0.5\n", {"metric": "valid_error"})
    with pytest.raises(LabError, match="no 'target'"):
        read_studies(tmp_path)
    study_json = next(tmp_path.rglob("study.json"))
    study_json.write_text("{not json")
    with pytest.raises(LabError, match=re.escape(f"{study_json}:1: invalid JSON")):
        read_studies(tmp_path)


def test_no_studies(tmp_path):
    with pytest.raises(LabError, match=re.escape(f"no studies under {tmp_path}")):
        read_studies(tmp_path)
    with pytest.raises(LabError, match="no studies under"):
        read_studies(tmp_path / "missing")
