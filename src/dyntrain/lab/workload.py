"""What the scaling lab trains: a model, its training data, a loss and a validation metric.

Built in: ``digits-mlp`` and ``digits-cnn`` (scikit-learn's handwritten digits, metric
``valid_error``). Your own workload is a function that returns a :class:`LabWorkload`; name it
as ``package.module:function`` or ``path/to/file.py:function`` and pass options to it with
``--workload-arg KEY=VALUE`` (they arrive as string keyword arguments)::

    # my_workload.py
    from dyntrain.lab.workload import LabWorkload

    def make(hidden="256"):
        train, val = load_my_data()                       # any torch Dataset
        def evaluate(model):                              # the validation metric
            ...
            return error_rate
        return LabWorkload(dataset="mydata", model=f"mlp{hidden}",
                           build_model=lambda: MyNet(int(hidden)), train_set=train,
                           loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]),
                                                                         batch[1]),
                           evaluate=evaluate, metric="valid_error", higher_is_better=False,
                           default_target=0.1)

    $ dyntrain lab sweep --workload my_workload.py:make --workload-arg hidden=512 ...

The function is called once in every process that runs trials, so it should load its data
itself (not rely on state from the process that started the sweep).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyntrain.lab.results import LabError


@dataclass
class LabWorkload:
    """One trainable problem. ``loss_fn(model, batch)`` returns the batch's mean loss;
    ``evaluate(model)`` returns the validation metric (the model is put in eval mode and back
    by the trial runner, and called under ``torch.no_grad``).

    A function that returns one, named as ``file.py:function`` or ``module:function``, is what
    ``dyntrain lab sweep --workload`` takes.

    Args:
        dataset: The data set's name (a folder name in the results: no ``/``).
        model: The model's name (likewise).
        build_model: Returns a fresh, untrained model; called once per trial.
        train_set: A sized map-style ``Dataset`` (not empty).
        loss_fn: ``loss_fn(model, batch) -> Tensor``: the batch's mean loss.
        evaluate: ``evaluate(model) -> float``: the validation metric.
        metric: The metric's name (likewise no ``/``).
        higher_is_better: Whether the target is passed from below (accuracy) or from above
            (error, the default).
        default_target: The target a sweep uses when ``--target`` is not given.

    Raises:
        LabError: A name is empty or holds ``/``, or ``train_set`` is empty or not sized.
    """

    dataset: str
    model: str
    build_model: Callable[[], Any]
    train_set: Any
    loss_fn: Callable[[Any, Any], Any]
    evaluate: Callable[[Any], float]
    metric: str = "valid_error"
    higher_is_better: bool = False
    default_target: float | None = None

    def __post_init__(self) -> None:
        for name in ("dataset", "model", "metric"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or "/" in value:
                raise LabError(f"workload {name} must be a non-empty name without '/', "
                               f"got {value!r}")
        try:
            n = len(self.train_set)
        except TypeError:
            raise LabError("workload train_set must be a sized Dataset (len() works)") from None
        if n == 0:
            raise LabError("workload train_set is empty")


def digits_workload(model: str = "mlp", val_fraction: str = "0.2") -> LabWorkload:
    """The built-in workload: scikit-learn's 8x8 digits, ``mlp`` or ``cnn``."""
    import torch

    from dyntrain.workloads.digits import MODELS, build_model, cross_entropy, load_digits_split

    if model not in MODELS:
        raise LabError(f"unknown digits model {model!r}; choose from {', '.join(MODELS)}")
    try:
        fraction = float(val_fraction)
    except ValueError:
        raise LabError(f"val_fraction must be a number, got {val_fraction!r}") from None
    train, val = load_digits_split(val_fraction=fraction)
    vx, vy = val.tensors

    def evaluate(net: torch.nn.Module) -> float:
        return float((net(vx).argmax(1) != vy).float().mean())

    return LabWorkload(dataset="digits", model=model, build_model=lambda: build_model(model),
                       train_set=train, loss_fn=cross_entropy, evaluate=evaluate,
                       metric="valid_error", higher_is_better=False, default_target=0.03)


BUILTIN: dict[str, Callable[..., LabWorkload]] = {
    "digits-mlp": lambda **kw: digits_workload("mlp", **kw),
    "digits-cnn": lambda **kw: digits_workload("cnn", **kw),
}


def _resolve(spec: str) -> Callable[..., LabWorkload]:
    if spec in BUILTIN:
        return BUILTIN[spec]
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise LabError(f"unknown workload {spec!r}: use one of {', '.join(BUILTIN)}, "
                       "module:function or file.py:function")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise LabError(f"workload file not found: {target}")
        name = f"_dyntrain_workload_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise LabError(f"cannot load workload file {target}: "
                           f"{type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise LabError(f"cannot import workload module {target!r}: {e}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise LabError(f"workload {spec!r}: {target} has no function {attr!r}")
    return factory


def load_workload(spec: str, args: dict[str, str] | None = None) -> LabWorkload:
    """Build the workload named by ``spec`` with string keyword ``args``."""
    factory = _resolve(spec)
    try:
        workload = factory(**(args or {}))
    except LabError:
        raise
    except TypeError as e:
        raise LabError(f"workload {spec!r} does not take these arguments "
                       f"{sorted(args or {})}: {e}") from None
    if not isinstance(workload, LabWorkload):
        raise LabError(f"workload {spec!r} returned {type(workload).__name__}, "
                       "not a LabWorkload")
    return workload
