"""metrics.jsonl and events.jsonl through one schema: typed rows written and read back, and the
one reading policy (a line being written waits, a bad line names its file and line)."""

from __future__ import annotations

import json
import uuid

import pytest

from dyntrain.elastic.runs import linefile
from dyntrain.elastic.runs.log import (
    RunLogError,
    last_step,
    open_events,
    open_metrics,
    read_events,
    read_metrics,
    read_records,
    run_file,
    tail_records,
)
from dyntrain.elastic.runs.rows import EventKind, EventRow, MetricsRow, NoiseScale, RowError
from dyntrain.elastic.runs.storage import LocalStore, open_store

# a row as the coordinator hands it to the launcher: every field the runtime writes
LEADER_ROW = {"gen": 2, "chunks": [3, 5], "state_sync_s": 0.25, "group_connect_s": 0.125,
              "step": 7, "epoch": 1,
              "world_size": 2, "total_steps": 40, "loss": 0.412345, "samples_per_s": 1520.3,
              "time": 1700000000.5, "b_simple": None, "b_simple_raw": 812.5, "g2": 0.0,
              "trace_sigma": 3.25, "grad_norm": 1.5, "val_accuracy": 0.93, "val_seconds": 0.1,
              "recomputed": True}
EVENT = {"event": "join", "workers": ["w2"], "world_before": 1, "requested_at": 3.5,
         "detected_at": 3.5, "generation": 2, "world_after": 2, "start_step": 20,
         "steps_redone": 0, "origin": "members", "state_sync_s": 0.2, "group_connect_s": 0.1,
         "reformed_at": 4.0,
         "first_step_at": 4.5, "latency_s": 1.0}


def test_a_leader_row_is_typed_and_written_back_as_it_was(tmp_path):
    row = MetricsRow.from_json(LEADER_ROW)
    assert (row.step, row.generation, row.chunks, row.recomputed) == (7, 2, (3, 5), True)
    assert row.noise == NoiseScale(None, 812.5, 0.0, 3.25)  # b_simple null: no estimate yet
    assert row.validation == {"val_accuracy": 0.93, "val_seconds": 0.1} and row.extra == {}
    assert row.to_json() == LEADER_ROW
    writer = open_metrics(LocalStore(tmp_path))
    writer.write(LEADER_ROW)  # a JSON object, as the launcher receives it
    writer.write(MetricsRow(step=8, loss=0.4, time=1700000001.0))  # a script alone: no gen
    writer.close()
    first, second = read_metrics(tmp_path)
    assert first == row and second.generation is None and second.noise is None
    assert second.recomputed is False and "b_simple" not in second.to_json()


def test_unknown_fields_are_kept_and_an_event_row_is_typed(tmp_path):
    row = MetricsRow.from_json({"step": 1, "future_field": {"a": [1]}})
    assert row.extra == {"future_field": {"a": [1]}}
    assert row.to_json() == {"step": 1, "recomputed": False, "future_field": {"a": [1]}}
    writer = open_events(LocalStore(tmp_path))
    writer.write(EVENT)
    writer.write(EventRow(EventKind.CRASH, ("w1",), world_before=2, reason="exit 137"))
    writer.close()
    join, crash = read_events(tmp_path)
    assert join.kind is EventKind.JOIN and join.workers == ("w2",) and join.to_json() == EVENT
    assert (crash.kind, crash.reason, crash.steps_redone) == (EventKind.CRASH, "exit 137", 0)
    assert json.loads((tmp_path / "events.jsonl").read_text().splitlines()[1])["event"] == \
        "crash"


@pytest.mark.parametrize("bad, message", [
    ({"loss": 1.0}, "a metrics row has no integer step"),
    ({"step": "7"}, "step is not an integer: '7'"),
    ({"step": True}, "step is not an integer"),
    ({"step": 1, "b_simple": "big"}, "b_simple is not a number: 'big'"),
    ({"step": 1, "chunks": [1, "2"]}, "chunks is not a list of integers"),
    ({"step": 1, "recomputed": "no"}, "recomputed is not true or false"),
])
def test_an_invalid_metrics_row_names_the_field(bad, message):
    with pytest.raises(RowError, match=message):
        MetricsRow.from_json(bad)


def test_the_writer_refuses_what_readers_would_refuse(tmp_path):
    writer = open_metrics(LocalStore(tmp_path))
    with pytest.raises(RowError, match="has no integer step"):
        writer.write({"loss": 1.0})
    with pytest.raises(RowError, match="EventRow where a MetricsRow belongs"):
        writer.write(EventRow(EventKind.START))
    writer.close()
    with pytest.raises(RowError, match="unknown event 'explode'"):
        EventRow.from_json({"event": "explode"})
    with pytest.raises(RowError, match="an event row has no event"):
        EventRow.from_json({"workers": ["w1"]})
    assert read_metrics(tmp_path) == [] and not run_file(tmp_path).exists()


def test_a_line_being_written_waits_for_the_next_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "lo')
    found = read_records(tmp_path)
    assert [(r.line, r.data["step"]) for r in found.records] == [(1, 1), (3, 2)]
    assert found.end == len('{"step": 1}\n\n{"step": 2}\n')
    assert [r.step for r in read_metrics(tmp_path)] == [1, 2]
    with open(path, "a") as f:
        f.write('ss": 0.5}\n')
    more = read_records(tmp_path, offset=found.end)
    assert [r.data for r in more.records] == [{"step": 3, "loss": 0.5}]
    assert more.end == path.stat().st_size
    assert read_records(tmp_path, offset=more.end).records == []
    # a whole object without its newline (written by hand) is read, and read once
    path.write_text('{"step": 1}\n{"step": 2}')
    assert [r.step for r in read_metrics(path)] == [1, 2]
    assert read_records(path, offset=read_records(path).end).records == []


def test_a_bad_line_is_an_error_naming_file_and_line_unless_the_reader_goes_on(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n[3]\n{"step": "x"}\n')
    with pytest.raises(RunLogError, match=rf"^{path}:2: invalid JSON"):
        read_records(tmp_path)
    told = []
    rows = read_metrics(tmp_path, on_bad=told.append)
    assert [r.step for r in rows] == [1, 2]
    assert [str(e).split(": ", 1)[0] for e in told] == [f"{path}:2", f"{path}:4", f"{path}:5"]
    assert "not a JSON object" in str(told[1]) and "step is not an integer" in str(told[2])
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": "x"}\n')
    with pytest.raises(RunLogError, match=rf"^{path}:3: step is not an integer"):
        read_metrics(path)


def test_a_read_from_an_offset_names_the_bad_line_by_its_byte(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(RunLogError, match=r"metrics.jsonl \(the line at byte 12\): invalid"):
        read_records(tmp_path, offset=12)


def test_the_tail_and_the_last_step(tmp_path):
    assert tail_records(tmp_path, 3) == [] and last_step(tmp_path) == 0
    lines = [json.dumps({"step": s, "pad": "x" * 40}) for s in range(1, 101)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 101, "pa')
    assert [r.data["step"] for r in tail_records(tmp_path, 3)] == [98, 99, 100]
    # a small window starts inside a line: that partial line is not a record
    assert [r.data["step"] for r in tail_records(tmp_path, 10, window=200)][-1] == 100
    assert all(r.data.get("pad") == "x" * 40 for r in tail_records(tmp_path, 10, window=200))
    # a window that starts exactly at a line's beginning keeps that line
    last_three = sum(len(x) + 1 for x in lines[-3:]) + len('{"step": 101, "pa')
    assert [r.data["step"] for r in tail_records(tmp_path, 10, window=last_three)] == \
        [98, 99, 100]
    assert [r.data["step"] for r in tail_records(tmp_path, 10, window=last_three - 1)] == \
        [99, 100]
    assert last_step(tmp_path) == 100
    (tmp_path / "metrics.jsonl").write_text('{"step": 4}\ngarbage\n')
    assert last_step(tmp_path) == 4  # passes over what is not a row


def test_segments_on_an_object_store_read_as_one_file():
    url = f"memory://runlog-{uuid.uuid4().hex[:8]}/run"
    store = open_store(url)
    first = open_metrics(store)
    for step in (1, 2, 3):
        first.write(MetricsRow(step=step, loss=1.0 / step))
    first.close()
    second = open_metrics(store)  # a resumed run: a segment after the first one
    second.write(MetricsRow(step=4, loss=0.25))
    second.close()
    assert len(linefile.pieces(store, "metrics.jsonl")) == 2
    assert [r.step for r in read_metrics(url)] == [1, 2, 3, 4]
    assert [r.step for r in read_metrics(f"{url}/metrics.jsonl")] == [1, 2, 3, 4]
    assert run_file(f"{url}/metrics.jsonl").shown == f"{url}/metrics.jsonl"
    assert last_step(store) == 4 and read_events(store) == []
