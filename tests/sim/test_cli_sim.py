"""`dyntrain sim` as a user runs it: the table, the JSON records, plots, one line on bad input."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT, run_cli

SPOT = ROOT / "traces" / "spot" / "availability_16-node_aws-08-27-2023_us-west-2a.json"
JOBS = {"jobs": [
    {"id": "wide", "arrival_s": 0, "samples": 2e6, "workers": "1:8",
     "curve": {"one_worker": 100, "efficiency": 0.9, "at": 8}, "start_s": 30, "reform_s": 2},
    {"id": "narrow", "arrival_s": 600, "samples": 5e5, "workers": "1:8",
     "curve": {"parallel": 0.01, "chunks": 2}, "start_s": 30, "reform_s": 2},
]}


@pytest.fixture
def jobs_file(tmp_path):
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(JOBS))
    return path


def test_sim_prints_the_table_and_writes_one_record_per_policy(tmp_path, jobs_file):
    csv = tmp_path / "od.csv"
    csv.write_text("offset_s,slots,price\n0,4,1.0\n3600,2,1.2\n")
    out = tmp_path / "sim.json"
    proc = run_cli(["sim", "--capacity", str(SPOT), "--capacity", f"pool={csv}", "--jobs",
                    str(jobs_file), "--policies", "static,fifo,fair,goodput", "--json", str(out),
                    "--plots", str(tmp_path / "plots")], check=True)
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy"))
    assert [line.split()[0] for line in lines[header + 1:header + 5]] == [
        "static", "fifo", "fair", "goodput"]
    assert "simulated seconds per second" in proc.stdout
    doc = json.loads(out.read_text())
    records = {r["policy"]: r for r in doc["policies"]}
    assert list(records) == ["static", "fifo", "fair", "goodput"]
    for r in records.values():
        for key in ("avg_jct_s", "p95_jct_s", "makespan_s", "cost", "utilisation",
                    "reformations"):
            assert isinstance(r[key], (int, float)), (r["policy"], key)
        assert r["unfinished"] == 0
    assert {j["id"] for j in doc["jobs"]["goodput"]} == {"wide", "narrow"}
    # the narrow job stops scaling at 2 workers: goodput never gives it more than 4
    narrow = next(j for j in doc["jobs"]["goodput"] if j["id"] == "narrow")
    assert max(int(w) for w in narrow["seconds_at_size"]) <= 4
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "sim_static.png", "sim_fifo.png", "sim_fair.png", "sim_goodput.png", "sim_compare.png"}


def test_sim_runs_the_built_in_mixed_trace_when_no_jobs_are_given():
    proc = run_cli(["sim", "--capacity", str(SPOT), "--count", "6", "--days", "1",
                    "--policies", "fifo,goodput"], check=True)
    assert "6 jobs (built-in mixed trace (seed 0))" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--capacity", "missing.json"], "cannot read capacity trace missing.json"),
    (["--capacity", "{bad_json}"], "not valid JSON"),
    (["--capacity", "{bad_csv}"], "bad header"),
    (["--capacity", "{spot}", "--policies", "fifo,pollux"], "unknown policy 'pollux'"),
    (["--capacity", "{spot}", "--jobs", "{bad_json}"], "not valid JSON"),
    (["--capacity", "{spot}", "--jobs", "nowhere.json"], "cannot read job trace nowhere.json"),
    (["--capacity", "{spot}", "--spot-price", "-1"], "--spot-price must be a finite number"),
    (["--capacity", "{spot}", "--jobs", "{bad_queue}"], "bad_queue.json: queue 1 must be an"),
    (["--capacity", "{spot}", "--jobs", "{bad_priority}"],
     "bad_priority.json: queue q: priority must be an integer, got 'hi'"),
    (["--capacity", "{spot}", "--jobs", "{bad_samples}"],
     "bad_samples.json: job a: samples must be a finite number > 0"),
    ([], "Missing option '--capacity'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    bad_json, bad_csv = tmp_path / "bad.json", tmp_path / "bad.csv"
    bad_json.write_text('{"metadata": ')
    bad_csv.write_text("time,capacity\n0,1\n")
    job = dict(JOBS["jobs"][0], id="a")
    files = {"bad_json": bad_json, "bad_csv": bad_csv, "spot": SPOT}
    for name, doc in (("bad_queue", {"queues": [{}], "jobs": [job]}),
                      ("bad_priority", {"queues": [{"name": "q", "priority": "hi"}],
                                        "jobs": [dict(job, queue="q")]}),
                      ("bad_samples", {"jobs": [dict(job, samples=-5)]})):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(doc))
    args = [a.format(**files) for a in args]
    proc = run_cli(["sim", *args])
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 or "Usage:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plots_without_matplotlib_are_refused_before_the_simulation(tmp_path, jobs_file,
                                                                    monkeypatch, capsys):
    """Without the lab extra, `--plots` is one line naming it, said before anything runs."""
    import dyntrain.sim.compare
    from dyntrain.cli.main import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    monkeypatch.setattr(dyntrain.sim.compare, "compare", lambda *a, **k: pytest.fail(
        "the simulation ran before matplotlib was checked"))
    with pytest.raises(SystemExit) as exit_:
        main(["sim", "--capacity", str(SPOT), "--jobs", str(jobs_file), "--plots",
              str(tmp_path / "plots")])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "", (out, err)
    assert err == ("dyntrain: error: `dyntrain sim` needs matplotlib, which is not installed: "
                   "pip install 'dyntrain[lab]'\n"), err
    assert not (tmp_path / "plots").exists()
