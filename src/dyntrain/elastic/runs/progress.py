"""What a run shows and writes: progress lines, ``metrics.jsonl`` rows, ``result.json``.

Shared by the launcher of ``dyntrain run`` (which receives the leader's rows) and a script that
trains alone with plain ``python my_train.py`` (``AloneOutput``), so both look the same.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TextIO

from dyntrain.elastic.runs.log import RowWriter, open_metrics
from dyntrain.elastic.runs.rows import MetricsRow
from dyntrain.elastic.runs.storage import RunStore
from dyntrain.elastic.runs.tensorboard import TensorBoardMirror, wanted

__all__ = ["RESULT_FILE", "AloneOutput", "progress_line", "result_line", "write_result"]

RESULT_FILE = "result.json"


def progress_line(m: dict, total: int | str | None = None) -> str:
    """``step   120/440  epoch   2  world 1  loss 0.4123     1520.3 samples/s``."""
    total = m.get("total_steps") or total or "?"
    return (f"step {m['step']:>5}/{total}  epoch {m['epoch']:>3}  world {m['world_size']}  "
            f"loss {m['loss']:.4f}  {m['samples_per_s']:>9.1f} samples/s")


def result_line(values: dict) -> str:
    return "result: " + ", ".join(f"{k}={v}" for k, v in values.items())


def write_result(store: RunStore, results: dict) -> None:
    store.put(RESULT_FILE, (json.dumps(results, indent=2) + "\n").encode())


class AloneOutput:
    """A world of one's terminal and run folder: a progress line every ``every`` seconds (and
    the last step), ``report()`` on the terminal; with a run folder, ``metrics.jsonl`` and
    ``result.json`` too (checkpoints and ``final.pt`` come from the trainer), and TensorBoard
    event files when ``tensorboard`` says so (``dyntrain.elastic.runs.tensorboard.wanted``)."""

    def __init__(self, store: RunStore | None, stream: TextIO | None = None,
                 every: float = 1.0, tensorboard: bool | None = None) -> None:
        self.store, self.stream, self.every = store, stream or sys.stdout, every
        # asked for but not installed: MissingExtra now, not at the first step
        self.tensorboard = store is not None and wanted(tensorboard, "tensorboard=True")
        self.last_print = 0.0
        self.results: dict = {}
        self._metrics: RowWriter | None = None
        self._board: TensorBoardMirror | None = None

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def metrics(self, row: MetricsRow, last: bool = False) -> None:
        """Record the row of the step just applied; print it as a progress line when one is due
        (and for the ``last`` step)."""
        if self.store is not None:
            if self._metrics is None:
                self._metrics = open_metrics(self.store, on_error=self.say)
                if self.tensorboard:
                    self._board = TensorBoardMirror(self.store, on_error=self.say)
            self._metrics.write(row)
            if self._board is not None:
                self._board.metrics(row)
        now = time.monotonic()
        if last or now - self.last_print >= self.every:
            self.last_print = now
            self.say(progress_line(row.to_json()))

    def close(self) -> None:
        """Write out the metrics rows still buffered (an object store's) and close the
        TensorBoard writer."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._board is not None:
            self._board.close()
            self._board = None

    def result(self, values: dict) -> None:
        self.results.update(values)
        if self.store is not None:
            write_result(self.store, self.results)
        self.say(result_line(values))
