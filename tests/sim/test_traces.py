"""Trace files: the public JSON spot traces, CSV, and job traces in every curve form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dyntrain.service.core.capacity import parse_trace
from dyntrain.service.core.model import ValidationError
from dyntrain.service.core.speedup import SpeedupModel
from dyntrain.service.core.trace_files import load_capacity, parse_json_trace, scale_time, to_csv
from dyntrain.sim.jobs import load_jobs, parse_jobs

ROOT = Path(__file__).resolve().parents[2]
SPOT = ROOT / "traces" / "spot" / "availability_16-node_aws-08-27-2023_us-west-2a.json"


def test_a_public_trace_is_one_value_per_tick():
    trace = parse_json_trace('{"metadata": {"gap_seconds": 300}, "data": [0, 0, 5, 16, 16, 8]}',
                             price=0.9)
    assert [(r.offset_s, r.slots) for r in trace.rows] == [
        (0, 0), (600, 5), (900, 16), (1500, 8), (1800, 8)]
    assert trace.at(899).slots == 5 and trace.at(900).slots == 16
    assert trace.at(1799).price == 0.9
    assert trace.duration == 1800  # six ticks of 300 s


def test_the_shipped_traces_read_as_they_are():
    trace = load_capacity(SPOT, loop=True)
    data = json.loads(SPOT.read_text())["data"]
    assert trace.duration == len(data) * 300
    for i in (0, 7, 8, 1000, len(data) - 1):
        assert trace.at(i * 300 + 150).slots == data[i]
    assert trace.at(len(data) * 300 + 8 * 300).slots == data[8]  # looped
    assert trace.max_slots == 16 and not trace.has_price


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"data": [1, 2]}', "metadata.gap_seconds must be a number > 0"),
    ('{"metadata": {"gap_seconds": 300}, "data": []}', "empty trace"),
    ('{"metadata": {"gap_seconds": 300}, "data": [1, -2]}', "tick 1: slots must be a whole"),
    ('{"metadata": {"gap_seconds": 300}, "data": [1, 2.5]}', "tick 1: slots must be a whole"),
    ('[1, 2]', "expected an object"),
])
def test_a_bad_public_trace_names_what_is_wrong(text, message):
    with pytest.raises(ValidationError, match=message):
        parse_json_trace(text, "t.json")


def test_either_format_loads_and_converts(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("offset_s,slots,price\n0,2,0.3\n60,4,0.4\n")
    assert load_capacity(csv).at(70).slots == 4
    assert load_capacity(csv, price=9.0).at(0).price == 0.3  # a CSV keeps its own prices
    json_file = tmp_path / "t.json"
    json_file.write_text('{"metadata": {"gap_seconds": 60}, "data": [2, 4]}')
    trace = load_capacity(json_file, price=0.5)
    again = parse_trace(to_csv(trace))
    assert again.rows == trace.rows
    fast = scale_time(trace, 30)
    assert fast.at(2.1).slots == 4 and fast.duration == 4
    with pytest.raises(ValidationError, match="cannot read capacity trace"):
        load_capacity(tmp_path / "missing.json")


# --- job traces -------------------------------------------------------------------------------

def job(**fields):
    return {"id": "j", "samples": 1000, "curve": {"parallel": 0.01}, **fields}


def test_every_curve_form(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "world_size": 1 if i <= 5 else 2, "samples_per_s": 100.0 if i <= 5
             else 190.0, "total_steps": 100, "time": i * 0.64} for i in range(1, 11)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    lab = ROOT / "bench" / "results" / "throughput" / "throughput.json"
    doc = {"jobs": [
        job(id="parts", curve={"serial": 0.001, "parallel": 0.01, "comm": 0.0, "chunks": 4}),
        job(id="points", curve={"points": [[1, 100], [4, 300]]}),
        job(id="figure", curve={"one_worker": 747, "efficiency": 0.92, "at": 64}),
        job(id="lab", curve={"lab": str(lab), "mode": "strong"}),
        job(id="run", curve={"run": "run"}, workers="2:8", arrival_s=5, elastic=False),
    ]}
    (tmp_path / "jobs.json").write_text(json.dumps(doc))
    trace = load_jobs(tmp_path / "jobs.json")
    models = {j.id: j.model for j in trace.jobs}
    assert models["parts"] == SpeedupModel(0.001, 0.01, 0.0, 4)
    assert models["points"].throughput(4) == pytest.approx(300)
    assert models["figure"].efficiency(64) == pytest.approx(0.92)
    measured = {r["workers"]: r["samples_per_s"] for r in json.loads(lab.read_text())["rows"]
                if r["mode"] == "strong"}
    for w, rate in measured.items():
        assert models["lab"].throughput(w) == pytest.approx(rate, rel=0.15)
    assert models["run"].throughput(2) == pytest.approx(190.0)
    last = trace.jobs[-1]
    assert (last.min_workers, last.max_workers, last.arrival_s, last.elastic) == (2, 8, 5, False)


@pytest.mark.parametrize("doc, message", [
    ({}, "non-empty \"jobs\" list"),
    ({"jobs": [{"id": "j", "curve": {"parallel": 1}}]}, "job j: missing samples"),
    ({"jobs": [job(speed=3)]}, "job j: unknown field"),
    ({"jobs": [job(), job()]}, "job j: the id appears twice"),
    ({"jobs": [job(workers="4:2")]}, "workers must satisfy 1 <= min <= max"),
    ({"jobs": [job(workers="a:b")]}, "workers must be MIN:MAX"),
    ({"jobs": [job(queue="other")]}, "unknown queue 'other'"),
    ({"jobs": [job(samples=-1)]}, "samples must be a finite number > 0"),
    ({"jobs": [job(curve={"parallel": -1})]}, "parallel must be a finite number >= 0"),
    ({"jobs": [job(curve={"points": [[0, 5]]})]}, "world size must be a whole number"),
    ({"jobs": [job(curve={"run": "nowhere"})]}, "cannot read"),
])
def test_a_bad_job_trace_names_the_job_and_the_field(doc, message):
    with pytest.raises(ValidationError, match=message):
        parse_jobs(doc, "jobs.json")
