"""The gradient noise scale of a training run, read from its ``metrics.jsonl``, for the scaling
report.

The rows that count are those with a ``b_simple`` field (a number or null; the trainer writes
one per step with ``TrainConfig.noise_scale`` on), read through the run files' schema
(:mod:`dyntrain.elastic.runs.log`); other rows are passed over. The mean is taken over the second
half of the logged steps (the steps from the midpoint of the first and last step carrying
``b_simple`` onwards), where the estimate has settled, and compared with each workload's fitted
``B_crit``: McCandlish et al. (2018) predict ``B_crit`` to be close to ``B_simple``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dyntrain.elastic.runs.log import RunFile, RunLogError, read_records, run_file
from dyntrain.elastic.runs.rows import MetricsRow, RowError
from dyntrain.elastic.runs.storage import LocalStore, StorageError, is_url
from dyntrain.lab.analysis import WorkloadReport
from dyntrain.lab.results import LabError

__all__ = ["NoiseSeries", "load_noise", "noise_comparisons", "parse_noise_spec"]


@dataclass
class NoiseSeries:
    """``b_simple`` over training from one ``metrics.jsonl``."""

    name: str
    path: str
    steps: list[int]
    values: list[float | None]

    @property
    def window(self) -> tuple[int, int] | None:
        """(first, last) step of the second half of the logged steps."""
        if not self.steps:
            return None
        first, last = min(self.steps), max(self.steps)
        return (math.ceil(first + (last - first) / 2), last)

    def _second_half(self) -> list[float]:
        w = self.window
        if w is None:
            return []
        return [v for s, v in zip(self.steps, self.values, strict=True)
                if s >= w[0] and v is not None and math.isfinite(v)]

    @property
    def mean_second_half(self) -> float | None:
        """Mean of the finite ``b_simple`` values over the second half of training."""
        vals = self._second_half()
        return sum(vals) / len(vals) if vals else None

    @property
    def n_second_half(self) -> int:
        return len(self._second_half())

def parse_noise_spec(spec: str) -> tuple[str | None, Path | str]:
    """``NAME=PATH`` or ``PATH`` (a path that exists as given wins over splitting at ``=``);
    PATH may be an object-store URL (kept as a string)."""
    if "=" in spec and not Path(spec).exists() and not is_url(spec.partition("=")[0]):
        name, _, path = spec.partition("=")
        if not name or not path:
            raise LabError(f"--noise expects [NAME=]PATH, got {spec!r}")
        return name, path if is_url(path) else Path(path)
    return None, spec if is_url(spec) else Path(spec)


def _default_noise_name(path: PurePosixPath | Path) -> str:
    if path.stem == "metrics" and path.parent.name not in ("", "."):
        return path.parent.name
    return path.stem


def _metrics_file(path: str | Path) -> RunFile:
    """The file to read: a local path is the file itself; a URL names a run folder or its
    ``metrics.jsonl``. LabError when it cannot be read."""
    if is_url(path):
        try:
            file = run_file(str(path))
            there = file.exists()
        except StorageError as e:
            raise LabError(str(e)) from None
        if not there:
            raise LabError(f"{file.shown}: no such file")
        return file
    path = Path(path)
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise LabError(f"{path}: cannot read: {e.strerror}") from None
    return RunFile(LocalStore(path.parent), path.name, str(path))


def load_noise(path: str | Path, name: str | None = None) -> NoiseSeries:
    """Read ``b_simple`` over training from a dyntrain ``metrics.jsonl``.

    Rows without a ``b_simple`` field are passed over. Raises :class:`LabError` naming the file
    and line for a line that is not a JSON object (one still being written at the end is left
    out, see :mod:`dyntrain.elastic.runs.log`), and for a row with ``b_simple`` that is not a
    valid metrics row (a ``b_simple`` that is neither a number nor null, no integer ``step``);
    and when the file has no ``b_simple`` rows at all. A later row for the same step replaces
    the earlier one; a null, NaN or infinite ``b_simple`` is a step without an estimate.

    Args:
        path: a local ``metrics.jsonl``, or an object-store URL of a run folder or of its
            ``metrics.jsonl``.
        name: the series' name in the report (default: the run folder's name).
    """
    file = _metrics_file(path)
    try:
        found = read_records(file).records
    except (RunLogError, StorageError) as e:
        raise LabError(str(e)) from None
    records: dict[int, float | None] = {}
    for record in found:
        if "b_simple" not in record.data:
            continue
        try:
            row = MetricsRow.from_json(record.data)
        except RowError as e:
            raise LabError(f"{file.shown}:{record.line}: {e}") from None
        value = row.noise.b_simple
        records[row.step] = value if value is not None and math.isfinite(value) else None
    if not records:
        raise LabError(f"{file.shown}: no records with a b_simple key")
    steps = sorted(records)
    shown = PurePosixPath(file.shown.partition("://")[2]) if is_url(file.shown) else Path(path)
    return NoiseSeries(name or _default_noise_name(shown), file.shown, steps,
                       [records[s] for s in steps])


def noise_comparisons(series: NoiseSeries, reports: Iterable[WorkloadReport]
                      ) -> list[dict[str, Any]]:
    """The series' second-half mean against each fitted workload's ``B_crit``."""
    mean = series.mean_second_half
    out = []
    for r in reports:
        if r.fit is None:
            continue
        ratio = mean / r.fit.b_crit if mean is not None and r.fit.b_crit > 0 else None
        out.append({"workload": r.name, "b_crit": r.fit.b_crit, "b_simple_mean": mean,
                    "ratio": ratio})
    return out
