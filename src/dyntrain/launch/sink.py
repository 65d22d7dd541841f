"""What a local run writes and says: its run folder's events, metrics and fired events (with
their TensorBoard mirror), ``result.json``, and a progress line on the terminal. The job
service's sink (``dyntrain.service.engine.elastic_host.ServiceSink``) builds on it."""

from __future__ import annotations

import json
import time
from typing import TextIO

from dyntrain.elastic.admission import NumericsRecord
from dyntrain.elastic.runs.folder import write_numerics
from dyntrain.elastic.runs.linefile import open_lines
from dyntrain.elastic.runs.log import open_events, open_metrics, read_records
from dyntrain.elastic.runs.progress import progress_line, result_line, write_result
from dyntrain.elastic.runs.rows import EventRow, MetricsRow
from dyntrain.elastic.runs.storage import RunStore
from dyntrain.elastic.runs.tensorboard import TensorBoardMirror, wanted
from dyntrain.launch.events import Event

# Each injected event as it fires (one JSON line), so that a resumed run skips those.
FIRED_FILE = "fired_events.jsonl"


class RunSink:
    """Writes events.jsonl and metrics.jsonl (and their TensorBoard mirror) and prints progress
    on the terminal.

    Args:
        store: the run folder.
        total_hint: the run's steps, as progress lines show them before the first row says.
        stream: where progress lines go.
        quiet: print only how the run ended.
        every: seconds between two progress lines.
        tensorboard: mirror the rows into TensorBoard event files
            (``dyntrain.elastic.runs.tensorboard``): True, False, or None (when it is installed).
    """

    def __init__(self, store: RunStore, total_hint: str, stream: TextIO, quiet: bool,
                 every: float, tensorboard: bool | None = None) -> None:
        self.files, self.stream, self.quiet, self.every = store, stream, quiet, every
        # told from the writers' threads when an object store refuses a write for a while
        self.events_file = open_events(store, on_error=self.storage_warning)
        self.metrics_file = open_metrics(store, on_error=self.storage_warning)
        self.fired_file = open_lines(store, FIRED_FILE, on_error=self.storage_warning)
        self.tensorboard = (TensorBoardMirror(store, on_error=self.storage_warning)
                            if wanted(tensorboard) else None)
        self.total_hint = total_hint
        self.started = time.time()
        self.last_print = 0.0
        self.last_metrics: dict | None = None
        self.printed: dict | None = None  # the newest metrics row shown as a progress line
        self.results: dict = {}
        self.events: list[dict] = []

    def _say(self, line: str) -> None:
        if not self.quiet:
            self.announce(line)

    def announce(self, line: str) -> None:
        """A line said even with --quiet (how the run ended, what did not happen)."""
        print(f"[{time.time() - self.started:7.2f}s] {line}", file=self.stream, flush=True)

    def storage_warning(self, line: str) -> None:
        self.announce(line)

    def event(self, record: dict) -> None:
        self.events.append(record)
        self.events_file.write(record)  # checked against the row type: RowError if bad
        if self.tensorboard is not None:
            self.tensorboard.event(EventRow.from_json(record))
        who = ",".join(record["workers"])
        ready = ""
        if record["event"] == "join" and record["detected_at"] > record["requested_at"]:
            ready = (f", {record['first_step_at'] - record['detected_at']:.3f} s after the "
                     "worker was ready")
        self._say(f"{record['event']} {who}: world {record['world_before']} -> "
                  f"{record.get('world_after')}, first step in the new world "
                  f"{record['latency_s']:.3f} s after the request{ready} "
                  f"(steps redone: {record.get('steps_redone', 0)})")

    def unstarted(self, row: EventRow, event: str) -> None:
        """Workers of a join that the launcher did not start: its ``events.jsonl`` row and one
        line, said even with --quiet (the run has fewer workers than its events asked for)."""
        record = row.to_json()
        self.events.append(record)
        self.events_file.write(record)
        if self.tensorboard is not None:
            self.tensorboard.event(row)
        self.catch_up()
        self.announce(f"event {event}: {row.reason}")

    def metrics(self, record: dict) -> None:
        self.last_metrics = record
        self.metrics_file.write(record)  # checked against the row type: RowError if bad
        if self.tensorboard is not None:
            self.tensorboard.metrics(MetricsRow.from_json(record))
        now = time.time()
        if now - self.last_print >= self.every:
            self.last_print = now
            self.print_progress(record)

    def print_progress(self, m: dict) -> None:
        self.printed = m
        self._say(progress_line(m, self.total_hint))

    def catch_up(self) -> None:
        """Show the newest step's progress line if the once-a-second rhythm skipped it."""
        if self.last_metrics is not None and self.printed is not self.last_metrics:
            self.print_progress(self.last_metrics)

    def log(self, line: str) -> None:
        self.catch_up()  # what happened follows the step it happened after
        self._say(line)

    def numerics(self, record: NumericsRecord) -> None:
        """The job's numerics were defined, or a worker of other numerics joined."""
        write_numerics(self.files, record)

    def result(self, record: dict) -> None:
        record = {k: v for k, v in record.items() if k != "worker"}
        self.results.update(record)
        write_result(self.files, self.results)
        self.catch_up()
        self._say(result_line(record))

    def fired(self, event: Event, step: int) -> None:
        """Record an injected event, so that a resumed run does not fire it again."""
        self.fired_file.write(json.dumps({"event": event.text, "step": step,
                                          "time": time.time()}), urgent=True)

    def fired_before(self) -> list[str]:
        """The events that earlier launches into this run folder fired, in order."""
        return [r.data["event"] for r in read_records(self.files, FIRED_FILE).records]

    def unfired(self, events: list[str], why: str) -> None:
        """Events of ``--events`` that never fired: said even with --quiet, kept in result.json."""
        self.results["events_not_fired"] = events
        write_result(self.files, self.results)
        self.announce(f"{len(events)} event(s) never fired: {', '.join(events)} ({why})")

    def close(self) -> None:
        """Write out what is still buffered (an object store's lines)."""
        for lines in (self.events_file, self.metrics_file, self.fired_file):
            lines.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
