"""The input pipeline: image sources, the article's augmentations, and the chunk loader.

- ``ImageFolder`` / ``PackedShards`` / ``open_source``: samples by index from an image folder or
  from WebDataset tar shards with an index (``dyntrain data pack``); local paths or fsspec URLs.
- ``ImageTransform`` / ``ImageDataset``: decode + augment (train) or resize + centre crop (val).
- ``LoaderConfig``: pass it as ``ElasticTrainer(..., loader=LoaderConfig(workers=2))`` to produce
  this worker's chunks in DataLoader worker processes, ahead of time, seeded per sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyntrain.data.pack import pack
from dyntrain.data.sources import ImageFolder, PackedShards, open_source
from dyntrain.errors import DataError

if TYPE_CHECKING:
    from dyntrain.data.images import ImageDataset, ImageTransform
    from dyntrain.data.loader import ChunkLoader, LoaderConfig, sample_seed

__all__ = ["ChunkLoader", "DataError", "ImageDataset", "ImageFolder", "ImageTransform",
           "LoaderConfig", "PackedShards", "open_source", "pack", "sample_seed"]

# Lazy: these import torch, which ``dyntrain data pack`` does not need.
_LAZY = {"ImageDataset": "images", "ImageTransform": "images", "ChunkLoader": "loader",
         "LoaderConfig": "loader", "sample_seed": "loader"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"dyntrain.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dyntrain.data' has no attribute {name!r}")
