"""A user script whose TrainConfig is invalid: the job must fail with that one-line reason."""

from dyntrain import TrainConfig

TrainConfig(global_batch=30, chunk_size=8)
