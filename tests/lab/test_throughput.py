"""``dyntrain lab throughput``: the scaling math, the validation, and one real small run."""

import json

import pytest

from conftest import run_cli
from dyntrain.errors import DyntrainError
from dyntrain.lab.scaling import (
    RunMeasurement,
    ThroughputConfig,
    efficiency_table,
    measure_metrics,
    parse_worker_counts,
    workload_argv,
)
from dyntrain.lab.throughput import run_throughput
from dyntrain.lab.throughput_output import markdown_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HW = {"cpu_model": "Test CPU", "cpu_cores": 2, "cpu_count": 2, "gpu": None, "gpu_count": 0,
      "torch": "x", "backend": "gloo", "device": "cpu", "summary": "Test CPU, 2 CPU cores"}


def m(mode, workers, rate, global_batch=None, chunk=8, load=None):
    gb = global_batch or 32 * workers
    return RunMeasurement(mode, workers, gb, chunk, 10, 1.0, rate, 10.0, other_load_cores=load)


# --- the math (exact, on binary-exact numbers) ------------------------------------------------


def test_weak_scaling_efficiency_against_one_worker():
    rows = efficiency_table([m("weak", 4, 250.0), m("weak", 1, 100.0), m("weak", 2, 150.0)])
    assert [r.workers for r in rows] == [1, 2, 4]
    assert [r.speedup for r in rows] == [1.0, 1.5, 2.5]
    assert [r.efficiency for r in rows] == [1.0, 0.75, 0.625]
    assert [r.ideal_samples_per_s for r in rows] == [100.0, 200.0, 400.0]
    assert [r.per_worker_batch for r in rows] == [32, 32, 32]
    assert [r.chunks_per_worker for r in rows] == [4, 4, 4]
    assert {r.baseline_workers for r in rows} == {1}


def test_strong_scaling_efficiency_is_speedup_over_workers():
    rows = efficiency_table([m("strong", 1, 64.0, 128), m("strong", 2, 96.0, 128),
                             m("strong", 4, 128.0, 128)])
    assert [r.speedup for r in rows] == [1.0, 1.5, 2.0]
    assert [r.efficiency for r in rows] == [1.0, 0.75, 0.5]
    assert [r.per_worker_batch for r in rows] == [128, 64, 32]
    assert [r.chunks_per_worker for r in rows] == [16, 8, 4]


def test_modes_have_their_own_baselines_and_weak_comes_first():
    rows = efficiency_table([m("strong", 1, 200.0, 128), m("weak", 1, 100.0),
                             m("strong", 2, 300.0, 128), m("weak", 2, 100.0)])
    assert [(r.mode, r.workers, r.efficiency) for r in rows] == [
        ("weak", 1, 1.0), ("weak", 2, 0.5), ("strong", 1, 1.0), ("strong", 2, 0.75)]


def test_baseline_is_the_smallest_worker_count_when_one_is_missing():
    rows = efficiency_table([m("weak", 2, 200.0), m("weak", 8, 600.0)])
    assert [r.baseline_workers for r in rows] == [2, 2]
    assert [r.speedup for r in rows] == [1.0, 3.0]
    assert [r.efficiency for r in rows] == [1.0, 0.75]  # (600 / 8) / (200 / 2)
    assert [r.ideal_samples_per_s for r in rows] == [200.0, 800.0]


def test_empty_results_give_an_empty_table():
    assert efficiency_table([]) == []


# --- timing from metrics.jsonl ------------------------------------------------------------------


def records(steps, dt=0.5, world=2, start=10.0):
    return [{"step": s, "time": start + dt * s, "world_size": world, "recomputed": False}
            for s in range(1, steps + 1)]


def test_measure_times_from_end_of_warmup_to_end_of_the_step_before_the_last():
    recs = records(6)
    recs[-1]["time"] += 100.0  # the last step (final checkpoint) is not timed
    recs[0]["time"] -= 100.0  # nor are the warm-up steps
    timed, seconds, rate, step_ms = measure_metrics(recs, global_batch=64, warmup=2, steps=6,
                                                    workers=2)
    assert (timed, seconds, rate, step_ms) == (3, 1.5, 128.0, 500.0)


def test_measure_ignores_recomputed_steps_and_takes_the_median_step():
    recs = records(7, dt=0.25)
    recs[3]["time"] += 0.25  # step 4 took 0.5 s, step 5 took 0 s
    recs.append({"step": 3, "time": 999.0, "world_size": 2, "recomputed": True})
    timed, seconds, rate, step_ms = measure_metrics(recs, global_batch=8, warmup=1, steps=7)
    assert (timed, seconds, rate, step_ms) == (5, 1.25, 32.0, 250.0)


def test_measure_names_the_missing_step():
    with pytest.raises(DyntrainError, match="no step-end time for step 5 .*step 4 of 8"):
        measure_metrics(records(4), global_batch=8, warmup=2, steps=8)


def test_measure_rejects_a_run_that_changed_size():
    recs = records(6)
    recs[3]["world_size"] = 1
    with pytest.raises(DyntrainError, match="changed size"):
        measure_metrics(recs, global_batch=8, warmup=2, steps=6, workers=2)


# --- configuration ------------------------------------------------------------------------------


def test_worker_counts_are_sorted_and_deduplicated():
    assert parse_worker_counts(" 4,1,2,2 ") == [1, 2, 4]


def test_workload_gets_the_lab_settings_after_the_user_arguments():
    cfg = ThroughputConfig(command=("-m", "dyntrain.workloads.digits", "--lr", "0.1"),
                           chunk_size=4, steps=12, warmup=3)
    argv = workload_argv(cfg, 96)
    assert argv[:2] == ["-m", "dyntrain.workloads.digits"]
    assert argv.index("--lr") < argv.index("--global-batch")
    assert argv[-6:] == ["--global-batch", "96", "--chunk-size", "4", "--max-steps", "12"]
    script = workload_argv(ThroughputConfig(command=("train.py", "--x")), 32)
    assert script[:2] == ["train.py", "--x"] and "--epochs" not in script


def test_weak_only_does_not_check_the_global_batch():
    ThroughputConfig(modes=("weak",), global_batch=3, workers=(1, 2, 4))


def test_run_throughput_writes_json_markdown_and_png(tmp_path):
    cfg = ThroughputConfig(workers=(1, 2, 4), out_dir=str(tmp_path / "tp"))
    rates = {1: 100.0, 2: 150.0, 4: 250.0}

    def fake(config, mode, workers):
        return m(mode, workers, rates[workers], config.global_batch_for(mode, workers),
                 load=0.25)

    said = []
    doc = run_throughput(cfg, runner=fake, hw=HW, say=said.append)
    assert len(said) == 1 + 6 and "efficiency  62.5%" in said[3]
    assert "(oversubscribed)" in said[3] and "(oversubscribed)" not in said[2]
    saved = json.loads((tmp_path / "tp" / "throughput.json").read_text())
    assert saved["hardware"] == HW and saved["config"]["workers"] == [1, 2, 4]
    assert [(r["mode"], r["workers"], r["efficiency"]) for r in saved["rows"]] == [
        (mode, n, e) for mode in ("weak", "strong") for n, e in ((1, 1.0), (2, 0.75), (4, 0.625))]
    assert saved["rows"] == doc["rows"]
    md = (tmp_path / "tp" / "throughput.md").read_text()
    assert md == markdown_table(doc)
    assert "Test CPU, 2 CPU cores" in md and "| weak | 4* | 128 | 32 | 4 | 250.0 |" in md
    assert "more workers than this machine has 2 CPU cores" in md
    assert (tmp_path / "tp" / "throughput.png").read_bytes()[:8] == PNG_MAGIC


# --- the CLI: bad input -------------------------------------------------------------------------


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("dyntrain: error:"), err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("args, needles", [
    (["--workers", ""], ["comma-separated list"]),
    (["--workers", "1,x"], ["'x' is not a whole number"]),
    (["--workers", "0,2"], ["at least 1"]),
    (["--workers", "-2"], ["at least 1"]),
    (["--mode", "sideways"], ["--mode"]),
    (["--steps", "5", "--warmup", "5"], ["--steps (5) must exceed --warmup (5)"]),
    (["--steps", "6", "--warmup", "5"], ["by at least 2"]),
    (["--warmup", "0"], ["--warmup must be at least 1"]),
    (["--chunk-size", "0"], ["--chunk-size must be positive"]),
    (["--global-batch", "100"], ["--global-batch 100 is not a multiple of --chunk-size 8"]),
    (["--global-batch", "16", "--workers", "1,2,4"],
     ["at least one chunk per worker", "2 chunks, fewer than 4 workers", "32"]),
    (["--workers", "1,3"], ["do not divide among 3 workers", "multiple of 24"]),
    (["--mode", "weak", "--per-worker-batch", "12"],
     ["--per-worker-batch 12 is not a multiple of --chunk-size 8"]),
    (["--repeat", "0"], ["--repeat must be at least 1"]),
    (["no_such_script.py"], ["script not found"]),
    (["-m"], ["-m needs a module name"]),
])
def test_invalid_input_is_one_line_and_exit_2(args, needles, tmp_path):
    proc = run_cli(["lab", "throughput", "--out", tmp_path / "o", *args], timeout=60)
    assert_one_line_error(proc, *needles)
    assert not (tmp_path / "o").exists()


# --- one real run -------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_weak_and_strong_run_on_digits(tmp_path):
    out = tmp_path / "tp"
    proc = run_cli(["lab", "throughput", "--workers", "1,2", "--mode", "both", "--steps", "6",
                    "--warmup", "2", "--out", out], timeout=180, check=True)
    progress = [ln for ln in proc.stderr.splitlines() if "samples/s" in ln]
    assert len(progress) == 4, proc.stderr
    doc = json.loads((out / "throughput.json").read_text())
    assert [(r["mode"], r["workers"]) for r in doc["rows"]] == [
        ("weak", 1), ("weak", 2), ("strong", 1), ("strong", 2)]
    assert all(r["samples_per_s"] > 0 and r["efficiency"] > 0 for r in doc["rows"])
    assert [r["global_batch"] for r in doc["rows"]] == [32, 64, 128, 128]
    assert doc["rows"][0]["efficiency"] == 1.0 and doc["rows"][2]["efficiency"] == 1.0
    assert doc["hardware"]["cpu_cores"] >= 1 and doc["hardware"]["torch"]
    assert (out / "throughput.png").read_bytes()[:8] == PNG_MAGIC
    assert "| strong | 2" in (out / "throughput.md").read_text()
    assert "| strong | 2" in proc.stdout
    assert not (out / "runs" / "weak-w2" / "checkpoints").exists()
    assert (out / "runs" / "weak-w2" / "metrics.jsonl").is_file()
