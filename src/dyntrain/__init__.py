"""dyntrain: elastic data-parallel PyTorch training on capacity that comes and goes."""

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.trainer import ElasticTrainer

__all__ = ["ElasticTrainer", "TrainConfig"]
__version__ = "0.1.0"
