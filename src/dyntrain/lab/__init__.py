"""The scaling lab: steps-to-result vs batch size (Shallue et al. 2018) and the
McCandlish et al. critical-batch-size fit, as pure functions over study files."""

from dyntrain.lab.fit import (
    Fit,
    classify_regimes,
    edge_warnings,
    fit_steps_curve,
    scaling_heuristics,
)
from dyntrain.lab.results import (
    CurvePoint,
    LabError,
    Measurement,
    Study,
    Trial,
    best_steps,
    read_studies,
    steps_curve,
    steps_to_result,
    write_study,
)

__all__ = [
    "CurvePoint",
    "Fit",
    "LabError",
    "Measurement",
    "Study",
    "Trial",
    "best_steps",
    "classify_regimes",
    "edge_warnings",
    "fit_steps_curve",
    "read_studies",
    "scaling_heuristics",
    "steps_curve",
    "steps_to_result",
    "write_study",
]
