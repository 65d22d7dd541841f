"""Study results in the batch-science layout and steps-to-result extraction.

On disk (the layout of the data released with Shallue et al. 2018)::

    ROOT/dataset/model/optimizer/batch_size/study.json
    ROOT/dataset/model/optimizer/batch_size/TRIAL_ID/metadata.json
    ROOT/dataset/model/optimizer/batch_size/TRIAL_ID/measurements.csv

``study.json`` holds the study's settings: ``metric`` (alias ``metric_name``), ``target``
(alias ``target_value``), ``higher_is_better`` (default from the metric's name: accuracy-like
True, error/loss-like False), ``eval_every`` and ``search_space``; ``dataset``, ``model``,
``optimizer`` and ``batch_size`` keys, when present, take precedence over the folder names.
``metadata.json`` holds the trial's ``hyperparameters`` (aliases ``hparams`` and ``parameters``;
without any, the other top-level keys) and ``status`` (``"diverged"`` or ``"ok"``; a boolean
``diverged`` key is accepted too). ``measurements.csv`` has a header with at least ``step`` and
the metric column.

Google's released archive of Shallue et al. reads as is: its ``parameter_configs`` is taken as
the ``search_space``, ``parameters`` as the hyperparameters and status ``INFEASIBLE`` (training
diverged) as diverged. Its ``study.json`` names no metric or target: pass ``metric`` and
``target`` to :func:`read_studies` (they override what ``study.json`` says).

Reading is lenient where the layout allows variation (unknown keys and extra columns are kept or
ignored) and strict where it matters: a malformed measurements file raises :class:`LabError`
naming the file and line.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from dyntrain.errors import DyntrainError

NO_FINISHED_TRIALS = "no finished trials"


class LabError(DyntrainError):
    """Study files are missing or malformed, or a lab computation has too little data."""


@dataclass
class Measurement:
    """One evaluation: the metric's value at a training step (extra CSV columns in ``extras``)."""

    step: int
    metric_value: float
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trial:
    """One hyperparameter setting trained at a study's batch size."""

    trial_id: str
    batch_size: int
    hyperparameters: dict[str, Any]
    measurements: list[Measurement]
    diverged: bool = False


_LOWER_IS_BETTER = ("error", "loss", "perplexity", "ppl", "xent", "entropy", "wer", "cer")
_HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall", "f1", "bleu", "score", "map")


def default_higher_is_better(metric: str) -> bool:
    """Accuracy-like metrics are higher-is-better; error/loss-like metrics are lower-is-better."""
    name = metric.lower()
    if any(word in name for word in _LOWER_IS_BETTER):
        return False
    if any(word in name for word in _HIGHER_IS_BETTER):
        return True
    raise LabError(f"cannot tell whether higher is better for metric {metric!r}; "
                   "set higher_is_better in study.json")


@dataclass
class Study:
    """All trials of one (dataset, model, optimizer, batch size) and the target they chase."""

    dataset: str
    model: str
    optimizer: str
    batch_size: int
    trials: list[Trial]
    metric: str
    target: float
    higher_is_better: bool | None = None
    eval_every: int | None = None
    search_space: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.higher_is_better is None:
            self.higher_is_better = default_higher_is_better(self.metric)

    @property
    def workload(self) -> tuple[str, str, str]:
        return (self.dataset, self.model, self.optimizer)


class CurvePoint(NamedTuple):
    """One point of a steps-to-result curve; ``steps`` is None (with a ``reason``) if no trial
    reached the target at this batch size."""

    batch_size: int
    steps: int | None
    best_trial: Trial | None
    reason: str = ""


# ---------------------------------------------------------------------------------------------
# steps to result


def passes(value: float, target: float, higher_is_better: bool) -> bool:
    """Whether ``value`` strictly passes ``target`` (equal does not pass; NaN never passes)."""
    return value > target if higher_is_better else value < target


def steps_to_result(trial: Trial, target: float, higher_is_better: bool) -> int | None:
    """The first evaluated step at which the metric strictly passes ``target``.

    None when it never does; always None for a diverged trial.

    Args:
        trial: One trial's measurements.
        target: The metric value to pass.
        higher_is_better: Pass from below (True) or from above (False).
    """
    if trial.diverged:
        return None
    for m in sorted(trial.measurements, key=lambda m: m.step):
        if passes(m.metric_value, target, higher_is_better):
            return m.step
    return None


def best_steps(study: Study) -> tuple[int | None, Trial | None]:
    """The fewest steps to result over the study's trials and the trial that got there.

    Diverged trials and trials that never reach the target are dropped; ties go to the
    trial listed first. ``(None, None)`` when no trial reaches the target.
    """
    best: tuple[int | None, Trial | None] = (None, None)
    for trial in study.trials:
        steps = steps_to_result(trial, study.target, bool(study.higher_is_better))
        if steps is not None and (best[0] is None or steps < best[0]):
            best = (steps, trial)
    return best


def infeasible_reason(study: Study) -> str:
    """Why no trial of ``study`` reached its target ("" if one did)."""
    if best_steps(study)[0] is not None:
        return ""
    if not study.trials:
        return NO_FINISHED_TRIALS
    diverged = sum(t.diverged for t in study.trials)
    if diverged == len(study.trials):
        return f"all {diverged} trials diverged"
    hib = bool(study.higher_is_better)
    values = [m.metric_value for t in study.trials if not t.diverged for m in t.measurements
              if not math.isnan(m.metric_value)]
    cmp = ">" if hib else "<"
    reason = f"no trial reached {study.metric} {cmp} {study.target:g}"
    if values:
        reason += f" (best {max(values) if hib else min(values):g})"
    else:
        reason += " (no measurements)"
    if diverged:
        reason += f"; {diverged} of {len(study.trials)} trials diverged"
    return reason


def steps_curve(studies: list[Study]) -> list[CurvePoint]:
    """Steps to result against batch size, one point per batch size, sorted by batch size.

    All studies must share the workload (dataset, model, optimizer), metric, target and
    direction; studies with the same batch size are merged. Batch sizes where the target was
    never reached are kept with ``steps=None`` and a ``reason``.
    """
    if not studies:
        raise LabError("no studies to build a steps curve from")
    first = studies[0]
    key = (first.workload, first.metric, first.target, first.higher_is_better)
    by_batch: dict[int, Study] = {}
    for s in studies:
        other = (s.workload, s.metric, s.target, s.higher_is_better)
        if other != key:
            raise LabError(f"studies mix workloads or targets: {'/'.join(first.workload)} "
                           f"{first.metric} {first.target:g} vs {'/'.join(s.workload)} "
                           f"{s.metric} {s.target:g}; build one curve per workload and target")
        if s.batch_size in by_batch:
            merged = by_batch[s.batch_size]
            by_batch[s.batch_size] = Study(
                merged.dataset, merged.model, merged.optimizer, merged.batch_size,
                [*merged.trials, *s.trials], merged.metric, merged.target,
                merged.higher_is_better, merged.eval_every, merged.search_space)
        else:
            by_batch[s.batch_size] = s
    points = []
    for b in sorted(by_batch):
        steps, trial = best_steps(by_batch[b])
        points.append(CurvePoint(b, steps, trial, infeasible_reason(by_batch[b])))
    return points


def group_studies(studies: list[Study]) -> dict[tuple[str, str, str], list[Study]]:
    """Studies grouped by workload (dataset, model, optimizer), each group sorted by batch."""
    groups: dict[tuple[str, str, str], list[Study]] = {}
    for s in studies:
        groups.setdefault(s.workload, []).append(s)
    return {k: sorted(v, key=lambda s: s.batch_size) for k, v in sorted(groups.items())}


# ---------------------------------------------------------------------------------------------
# writing


def _study_dir(root: Path, study: Study) -> Path:
    return Path(root) / study.dataset / study.model / study.optimizer / str(study.batch_size)


def write_study(root: str | Path, study: Study) -> Path:
    """Write ``study`` under ``root`` in the batch-science layout; returns the study folder."""
    d = _study_dir(Path(root), study)
    d.mkdir(parents=True, exist_ok=True)
    settings = {
        "dataset": study.dataset, "model": study.model, "optimizer": study.optimizer,
        "batch_size": study.batch_size, "metric": study.metric, "target": study.target,
        "higher_is_better": study.higher_is_better, "eval_every": study.eval_every,
        "search_space": study.search_space,
    }
    (d / "study.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    for trial in study.trials:
        td = d / trial.trial_id
        td.mkdir(exist_ok=True)
        meta = {"trial_id": trial.trial_id, "hyperparameters": trial.hyperparameters,
                "status": "diverged" if trial.diverged else "ok"}
        (td / "metadata.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        extras: list[str] = []
        for m in trial.measurements:
            extras += [k for k in m.extras if k not in extras]
        with open(td / "measurements.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", study.metric, *extras])
            for m in trial.measurements:
                w.writerow([m.step, repr(float(m.metric_value)),
                            *(m.extras.get(k, "") for k in extras)])
    return d


# ---------------------------------------------------------------------------------------------
# reading


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise LabError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    except OSError as e:
        raise LabError(f"{path}: cannot read: {e.strerror}") from None
    if not isinstance(data, dict):
        raise LabError(f"{path}:1: expected a JSON object")
    return data


def _parse_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_measurements(path: Path, metric: str) -> list[Measurement]:
    """Parse one ``measurements.csv``; raises :class:`LabError` naming the file and line."""
    try:
        f = open(path, newline="")
    except OSError as e:
        raise LabError(f"{path}: cannot read: {e.strerror}") from None
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        while header is not None and not any(c.strip() for c in header):
            header = next(reader, None)
        if header is None:
            raise LabError(f"{path}:1: missing header (empty file)")
        hline = reader.line_num
        header = [c.strip() for c in header]
        if all(_parse_number(c) is not None for c in header):
            raise LabError(f"{path}:{hline}: missing header (first row is numeric)")
        if "step" not in header:
            raise LabError(f"{path}:{hline}: header has no 'step' column: {','.join(header)}")
        if metric not in header:
            raise LabError(f"{path}:{hline}: header has no {metric!r} column: "
                           f"{','.join(header)}")
        i_step, i_metric = header.index("step"), header.index(metric)
        out: list[Measurement] = []
        for row in reader:
            line = reader.line_num
            if not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise LabError(f"{path}:{line}: expected {len(header)} fields, got {len(row)}")
            step_f = _parse_number(row[i_step])
            if step_f is None or not math.isfinite(step_f) or step_f != int(step_f):
                raise LabError(f"{path}:{line}: step is not an integer: {row[i_step]!r}")
            value = _parse_number(row[i_metric])
            if value is None:
                raise LabError(f"{path}:{line}: {metric} is not a number: {row[i_metric]!r}")
            step = int(step_f)
            if out and step <= out[-1].step:
                raise LabError(f"{path}:{line}: steps not increasing ({step} after "
                               f"{out[-1].step})")
            extras: dict[str, Any] = {}
            for j, name in enumerate(header):
                if j not in (i_step, i_metric):
                    num = _parse_number(row[j])
                    extras[name] = row[j] if num is None else num
            out.append(Measurement(step, value, extras))
    return out


_METRIC_COLUMN = re.compile(r"(valid|validation|eval|test|val)_?(error|accuracy|acc|loss)", re.I)


def _infer_metric(study_dir: Path) -> str:
    for mpath in sorted(study_dir.glob("*/measurements.csv")):
        with open(mpath, newline="") as f:
            header = [c.strip() for c in next(csv.reader(f), [])]
        named = [c for c in header if _METRIC_COLUMN.fullmatch(c)]
        others = [c for c in header if c != "step"]
        if named:
            return named[0]
        if len(others) == 1:
            return others[0]
    raise LabError(f"{study_dir / 'study.json'}: no 'metric' and none can be inferred "
                   "from measurements.csv headers")


def _batch_size(study_dir: Path, settings: dict[str, Any]) -> int:
    if "batch_size" in settings:
        try:
            return int(settings["batch_size"])
        except (TypeError, ValueError):
            raise LabError(f"{study_dir / 'study.json'}: batch_size is not an integer: "
                           f"{settings['batch_size']!r}") from None
    m = re.fullmatch(r"\D*(\d+)", study_dir.name)
    if not m:
        raise LabError(f"{study_dir}: folder name is not a batch size and study.json "
                       "has no batch_size")
    return int(m.group(1))


def _read_trial(trial_dir: Path, batch_size: int, metric: str) -> Trial:
    meta_path = trial_dir / "metadata.json"
    meta = _load_json(meta_path) if meta_path.exists() else {}
    hkey = next((k for k in ("hyperparameters", "hparams", "parameters") if k in meta), None)
    if hkey is not None:
        hparams = meta[hkey] or {}
        if not isinstance(hparams, dict):
            raise LabError(f"{meta_path}: hyperparameters is not an object")
    else:
        hparams = {k: v for k, v in meta.items()
                   if k not in ("trial_id", "status", "diverged", "batch_size")}
    status = str(meta.get("status", "ok")).strip().lower()
    diverged = status in ("diverged", "infeasible") or meta.get("diverged") is True
    mpath = trial_dir / "measurements.csv"
    measurements = read_measurements(mpath, metric) if mpath.exists() else []
    return Trial(str(meta.get("trial_id", trial_dir.name)), batch_size, dict(hparams),
                 measurements, diverged)


def read_study(study_dir: str | Path, *, target: float | None = None,
               metric: str | None = None) -> Study:
    """Read the study in ``study_dir`` (the folder holding ``study.json``); ``target`` and
    ``metric``, when given, override ``study.json``."""
    d = Path(study_dir)
    path = d / "study.json"
    settings = _load_json(path)
    metric = (metric or settings.get("metric", settings.get("metric_name"))
              or _infer_metric(d))
    if target is None:
        target = settings.get("target", settings.get("target_value"))
    if target is None:
        raise LabError(f"{path}: no 'target'")
    try:
        target = float(target)
    except (TypeError, ValueError):
        raise LabError(f"{path}: target is not a number: {target!r}") from None
    hib = settings.get("higher_is_better")
    if hib is not None and not isinstance(hib, bool):
        raise LabError(f"{path}: higher_is_better must be true or false, not {hib!r}")
    batch_size = _batch_size(d, settings)
    names = d.resolve().parts
    defaults = dict(zip(("dataset", "model", "optimizer"), names[-4:-1], strict=False))
    # hidden folders are trials still being written (dyntrain writes aside, then renames)
    trial_dirs = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")
                        and ((p / "measurements.csv").exists() or (p / "metadata.json").exists()))
    trials = [_read_trial(p, batch_size, str(metric)) for p in trial_dirs]
    eval_every = settings.get("eval_every")
    return Study(
        dataset=str(settings.get("dataset", defaults.get("dataset", ""))),
        model=str(settings.get("model", defaults.get("model", ""))),
        optimizer=str(settings.get("optimizer", defaults.get("optimizer", ""))),
        batch_size=batch_size, trials=trials, metric=str(metric), target=target,
        higher_is_better=hib, eval_every=None if eval_every is None else int(eval_every),
        search_space=dict(settings.get("search_space", settings.get("parameter_configs"))
                          or {}),
    )


def read_studies(root: str | Path, *, target: float | None = None,
                 metric: str | None = None) -> list[Study]:
    """Every study under ``root``, sorted by (dataset, model, optimizer, batch size);
    ``target`` and ``metric``, when given, override every ``study.json``.

    Args:
        root: A folder in the batch-science layout (written by ``dyntrain lab sweep``, or
            Google's released archive).
        target: The metric value that counts as reached (for studies that name none).
        metric: The metric's name (likewise).

    Raises:
        LabError: No ``study.json`` under ``root``, or a malformed file (naming it).
    """
    root = Path(root)
    paths = sorted(root.rglob("study.json")) if root.is_dir() else []
    if not paths:
        raise LabError(f"no studies under {root}")
    studies = [read_study(p.parent, target=target, metric=metric) for p in paths]
    return sorted(studies, key=lambda s: (*s.workload, s.batch_size))
