"""The scaling report: steps to result against batch size, the critical-batch-size fit, the
scaling regimes, learning-rate heuristics and the gradient noise scale, as pure functions.

Its parts live in three modules, and every public name is importable from here as well:

* :mod:`dyntrain.lab.analysis`: :func:`analyse` turns studies (see :mod:`dyntrain.lab.results`)
  into one :class:`WorkloadReport` per workload (dataset, model, optimizer), with the
  hyperparameter lookup (:func:`find_hyperparameter`) and the optimizer comparison;
* :mod:`dyntrain.lab.noise`: B_simple over training from a run's ``metrics.jsonl``
  (:func:`load_noise`) against each workload's B_crit;
* :mod:`dyntrain.lab.render`: :func:`to_json`, :func:`to_markdown` and :func:`summary_lines`.

:mod:`dyntrain.lab.plots` draws the figures; ``dyntrain lab report``
(:mod:`dyntrain.cli.lab_report`) wires these together.
"""

from __future__ import annotations

from dyntrain.lab.analysis import (
    LR_KEYS,
    MOMENTUM_KEYS,
    REGIME_RULE,
    PointReport,
    WorkloadReport,
    analyse,
    by_dataset_model,
    find_hyperparameter,
    optimizer_comparisons,
)
from dyntrain.lab.noise import NoiseSeries, load_noise, noise_comparisons, parse_noise_spec
from dyntrain.lab.render import fmt, lr_verdict, plot_key, summary_lines, to_json, to_markdown

__all__ = [
    "LR_KEYS",
    "MOMENTUM_KEYS",
    "REGIME_RULE",
    "NoiseSeries",
    "PointReport",
    "WorkloadReport",
    "analyse",
    "by_dataset_model",
    "find_hyperparameter",
    "fmt",
    "load_noise",
    "lr_verdict",
    "noise_comparisons",
    "optimizer_comparisons",
    "parse_noise_spec",
    "plot_key",
    "summary_lines",
    "to_json",
    "to_markdown",
]
