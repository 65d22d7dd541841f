"""A run folder remembers the settings its run started with and refuses other ones.

Resuming a checkpoint under other settings would silently train a different run (another
learning rate, another global batch) or fail deep inside ``load_state_dict`` (another model). So
the first worker of a run writes ``run.json`` with what decides the result: the
``TrainConfig`` fields that change the math, the model's tensor names and shapes, the optimizer's
class and hyperparameters, the LR scheduler's class and settings, all as the script built them
(before any state is restored). Once the folder holds a checkpoint, a run with other settings
stops before it joins, with a one-line error naming what differs.

Settings that do not change the result may differ (checkpoint frequency and retention, the
backend, overlapping the all-reduce with backward). A different length of training (``epochs``,
``max_steps``) is allowed only without an LR scheduler: a scheduler's restored state keeps the
horizon of the run it came from (a cosine schedule would restart its cycle), while a constant
learning rate continues exactly as if the longer run had been planned from the start (the data
order of each epoch depends only on the seed and the epoch).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from dyntrain.elastic.admission import CanaryDigest, Candidate, NumericsRecord, judge
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.numerics import NUMERICS_FILE, Numerics
from dyntrain.elastic.runs.checkpoints import list_checkpoints
from dyntrain.elastic.runs.storage import RunStore
from dyntrain.elastic.state import TrainingParts
from dyntrain.errors import DyntrainError

RUN_FILE = "run.json"
# TrainConfig fields that do not change what is trained.
_IGNORED = {"checkpoint_every_steps", "checkpoint_every_seconds", "keep_checkpoints", "backend",
            "overlap", "bucket_mb", "shard_level", "shard_redundancy"}
_LENGTH = {"epochs", "max_steps"}
_SHOWN = 3  # differences named in the message


class RunFolderMismatch(DyntrainError):
    """The run folder holds a run that was started with other settings."""


def describe_setup(config: TrainConfig, parts: TrainingParts) -> dict[str, Any]:
    """What decides a run's result, as JSON-able values."""
    cfg = {k: v for k, v in asdict(config).items() if k not in _IGNORED}
    model = {name: list(t.shape) for name, t in parts.model.state_dict().items()}
    # (a scheduler's ``initial_lr`` repeats the learning rate the script set)
    groups = [{k: _plain(v) for k, v in group.items()
               if k not in ("params", "initial_lr") and _plain(v) is not None}
              for group in parts.optimizer.param_groups]
    setup: dict[str, Any] = {
        "config": cfg, "model": model,
        "optimizer": {"class": type(parts.optimizer).__name__, "groups": groups},
        "lr_scheduler": None}
    sched = parts.lr_scheduler
    if sched is not None:
        settings = {k: _plain(v) for k, v in vars(sched).items()
                    if not k.startswith("_") and k not in ("optimizer", "last_epoch")
                    and _plain(v) is not None}
        setup["lr_scheduler"] = {"class": type(sched).__name__, **settings}
    return setup


def _plain(value: Any) -> Any:
    """A JSON scalar or a list of them; None for anything else (functions, tensors of many)."""
    if hasattr(value, "numel") and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple) and all(isinstance(v, bool | int | float | str)
                                               for v in value):
        return list(value)
    return None


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two setups, one short phrase each (``epochs 12 -> 120``)."""
    out = [f"{k} {old['config'].get(k)} -> {new['config'].get(k)}"
           for k in sorted(set(old["config"]) | set(new["config"]))
           if old["config"].get(k) != new["config"].get(k)]
    out += _model_differences(old["model"], new["model"])
    o_opt, n_opt = old["optimizer"], new["optimizer"]
    if o_opt["class"] != n_opt["class"]:
        out.append(f"optimizer {o_opt['class']} -> {n_opt['class']}")
    elif len(o_opt["groups"]) != len(n_opt["groups"]):
        out.append(f"optimizer parameter groups {len(o_opt['groups'])} -> "
                   f"{len(n_opt['groups'])}")
    else:
        for i, (a, b) in enumerate(zip(o_opt["groups"], n_opt["groups"], strict=True)):
            where = f"optimizer group {i} " if len(o_opt["groups"]) > 1 else "optimizer "
            out += [f"{where}{k} {a[k]} -> {b[k]}" for k in sorted(set(a) & set(b))
                    if a[k] != b[k]]
    o_s, n_s = old["lr_scheduler"], new["lr_scheduler"]
    if (o_s is None) != (n_s is None) or (o_s and o_s["class"] != n_s["class"]):
        out.append(f"lr_scheduler {o_s and o_s['class']} -> {n_s and n_s['class']}")
    elif o_s is not None:
        out += [f"lr_scheduler {k} {o_s[k]} -> {n_s[k]}" for k in sorted(set(o_s) & set(n_s))
                if o_s[k] != n_s[k]]
    return out


def _model_differences(old: dict[str, list], new: dict[str, list]) -> list[str]:
    gone, added = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    out = []
    if gone or added:
        out.append(f"model tensors: {len(gone)} only in the old run"
                   f"{f' (e.g. {gone[0]})' if gone else ''}, {len(added)} only in this one"
                   f"{f' (e.g. {added[0]})' if added else ''}")
    out += [f"model {k} shape {old[k]} -> {new[k]}" for k in sorted(set(old) & set(new))
            if old[k] != new[k]]
    return out


def check_run_folder(store: RunStore, setup: dict[str, Any], *, where: str = "--out") -> None:
    """Refuse a run folder that holds a run with other settings; record ``setup`` otherwise.

    ``where`` names how the user chose the folder, for the hint.
    """
    recorded = _read(store)
    started = bool(list_checkpoints(store)) or store.exists("final.pt")
    diffs = differences(recorded, setup) if recorded is not None and started else []
    if diffs:
        # a scheduler's own settings (T_max, ...) follow the length: they count with it
        core = [d for d in diffs if not d.startswith("lr_scheduler ")]
        length_only = bool(core) and all(d.split()[0] in _LENGTH for d in core) and (
            (recorded["lr_scheduler"] or {}).get("class") ==
            (setup["lr_scheduler"] or {}).get("class"))
        if not (length_only and setup["lr_scheduler"] is None):
            shown = ", ".join(diffs[:_SHOWN]) + (f" and {len(diffs) - _SHOWN} more"
                                                if len(diffs) > _SHOWN else "")
            why = (" (a longer or shorter run needs a fresh folder when an LR scheduler is "
                   "used: its restored state keeps the old length)" if length_only else "")
            raise RunFolderMismatch(
                f"{store.location} holds a run started with other settings: {shown}{why}; use "
                f"another {where}, or delete {store.location} to start fresh")
    if recorded != setup:
        store.put(RUN_FILE, (json.dumps({"setup": setup}, indent=1) + "\n").encode())


def _read(store: RunStore) -> dict[str, Any] | None:
    try:
        return json.loads(store.get(RUN_FILE))["setup"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunFolderMismatch(f"{store.where(RUN_FILE)} is not readable ({exc}); delete it to "
                                "record this run's settings again") from None


def read_numerics(store: RunStore) -> NumericsRecord | None:
    """The numerics the run folder recorded (``numerics.json``), or None (a fresh run, or one
    from before they were recorded); a ``ConfigError`` if the file is not a record."""
    try:
        raw = store.get(NUMERICS_FILE)
    except FileNotFoundError:
        return None
    return NumericsRecord.decode(raw, store.where(NUMERICS_FILE))


def write_numerics(store: RunStore, record: NumericsRecord) -> None:
    store.put(NUMERICS_FILE, record.encode())


def check_numerics_alone(store: RunStore, pinned: Numerics | None, settings: dict,
                         canary: CanaryDigest, host: str) -> None:
    """A run that trains alone in ``store``: record what it computes with, or refuse to resume
    a run that computed other bits (what differs, in one line)."""
    verdict = judge(pinned, read_numerics(store), Candidate("this run", host, settings, canary),
                    0, allow_mixed=False)
    if not verdict.admit:
        raise RunFolderMismatch(f"{store.location} holds a run that computed other bits than "
                                f"this one ({verdict.differs}): resume it with that run's "
                                f"numerics ({NUMERICS_FILE}), or use another output folder")
    if verdict.changed:
        write_numerics(store, verdict.record)
