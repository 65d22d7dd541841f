"""dyntrain: elastic data-parallel PyTorch training on capacity that comes and goes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyntrain.errors import install_excepthook

__all__ = ["ElasticTrainer", "TrainConfig"]
__version__ = "0.1.0"

# A script that imports dyntrain ends on a DyntrainError (a bad TrainConfig, a missing extra) with
# one line, ``dyntrain: error: ...``, and exit status 2, as ``dyntrain`` itself does.
install_excepthook()

if TYPE_CHECKING:
    from dyntrain.elastic.config import TrainConfig
    from dyntrain.elastic.trainer import ElasticTrainer


def __getattr__(name: str):
    # Lazy: the job service and the CLI must not pay for importing torch at start-up.
    if name == "ElasticTrainer":
        from dyntrain.elastic.trainer import ElasticTrainer

        return ElasticTrainer
    if name == "TrainConfig":
        from dyntrain.elastic.config import TrainConfig

        return TrainConfig
    raise AttributeError(f"module 'dyntrain' has no attribute {name!r}")
