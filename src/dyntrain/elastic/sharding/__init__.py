"""Sharding (ZeRO-1/2/3) by whole tensors: who owns what, the sharded optimizer state, gradients
and parameters, and the moves that re-shard in place when members change."""
