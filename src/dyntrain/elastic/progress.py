"""What a run shows and writes: progress lines, ``metrics.jsonl`` rows, ``result.json``.

Shared by the launcher of ``dyntrain run`` (which receives the leader's rows) and a script that
trains alone with plain ``python my_train.py`` (``AloneOutput``), so both look the same.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO


def progress_line(m: dict, total: int | str | None = None) -> str:
    """``step   120/440  epoch   2  world 1  loss 0.4123     1520.3 samples/s``."""
    total = m.get("total_steps") or total or "?"
    return (f"step {m['step']:>5}/{total}  epoch {m['epoch']:>3}  world {m['world_size']}  "
            f"loss {m['loss']:.4f}  {m['samples_per_s']:>9.1f} samples/s")


def result_line(values: dict) -> str:
    return "result: " + ", ".join(f"{k}={v}" for k, v in values.items())


def write_result(out_dir: Path, results: dict) -> None:
    (out_dir / "result.json").write_text(json.dumps(results, indent=2) + "\n")


class AloneOutput:
    """A world of one's terminal and run folder: a progress line every ``every`` seconds (and
    the last step), ``report()`` on the terminal; with ``out_dir``, ``metrics.jsonl`` and
    ``result.json`` too (checkpoints and ``final.pt`` come from the trainer)."""

    def __init__(self, out_dir: Path | None, stream: TextIO | None = None,
                 every: float = 1.0) -> None:
        self.out_dir, self.stream, self.every = out_dir, stream or sys.stdout, every
        self.last_print = 0.0
        self.results: dict = {}
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def metrics(self, row: dict, last: bool = False) -> None:
        if self.out_dir is not None:
            with open(self.out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        now = time.monotonic()
        if last or now - self.last_print >= self.every:
            self.last_print = now
            self.say(progress_line(row))

    def result(self, values: dict) -> None:
        self.results.update(values)
        if self.out_dir is not None:
            write_result(self.out_dir, self.results)
        self.say(result_line(values))
