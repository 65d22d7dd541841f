"""What a worker owns (model, optimizer, scheduler, scaler, progress, RNG) and how it moves.

The training state is replicated: after every applied step all members hold the same state, so any
one member's copy is the whole job's state. The same dict is what a joiner receives from a live
member and what a checkpoint stores, so neither depends on the world size. With the online
gradient noise scale on, the state of its tracker travels too, so a joiner or a resumed job
continues the same moving averages.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

STATE_FORMAT = 1

log = logging.getLogger("dyntrain.state")


@dataclass
class TrainingParts:
    """The user's objects whose state makes up a training run.

    ``noise`` is the runtime's gradient noise scale tracker (a ``NoiseScaleTracker``), set by the
    ``ChunkStepper`` when ``TrainConfig.noise_scale`` is on.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any | None = None
    scaler: Any | None = None
    noise: Any | None = None


def capture_state(parts: TrainingParts, step: int, steps_per_epoch: int) -> dict:
    """A self-contained, weights-only-loadable dict of the full training state at ``step``."""
    state = {
        "format": STATE_FORMAT,
        "step": step,
        "epoch": step // steps_per_epoch,
        "step_in_epoch": step % steps_per_epoch,
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    if torch.cuda.is_available():
        state["rng"]["cuda"] = torch.cuda.get_rng_state_all()
    if parts.lr_scheduler is not None:
        state["lr_scheduler"] = parts.lr_scheduler.state_dict()
    if parts.scaler is not None:
        state["scaler"] = parts.scaler.state_dict()
    if parts.noise is not None:
        state["noise_scale"] = parts.noise.state_dict()  # plain floats and ints
    return state


def restore_state(parts: TrainingParts, state: dict) -> int:
    """Load ``state`` into the user's objects and return the step it was taken at."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"unknown training state format {state.get('format')!r}")
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    if parts.lr_scheduler is not None and "lr_scheduler" in state:
        parts.lr_scheduler.load_state_dict(state["lr_scheduler"])
    if parts.scaler is not None and "scaler" in state:
        parts.scaler.load_state_dict(state["scaler"])
    if parts.noise is not None:
        _restore_noise(parts.noise, state.get("noise_scale"))
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(_as_python_rng_state(state["rng"]["python"]))
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return int(state["step"])


def _restore_noise(tracker: Any, saved: dict | None) -> None:
    """Continue the saved moving averages, or start them afresh where there are none (a state
    from a run without the noise scale) or they were taken with other batch sizes, EMA factor or
    data-set size. Every member restores the same state, so all of them decide alike."""
    if saved is not None:
        try:
            tracker.load_state_dict(saved)
            return
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("gradient noise scale: restarting the moving averages (%s)", exc)
    tracker.load_state_dict({"g2_acc": 0.0, "trace_acc": 0.0, "steps": 0})


def _as_python_rng_state(value: Any) -> tuple:
    """random.setstate wants tuples; a serialised copy may hold lists."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
