"""The input pipeline: image sources, the article's augmentations, and the chunk loader.

- ``ImageFolder`` / ``PackedShards`` / ``open_source``: samples by index from an image folder or
  from WebDataset tar shards with an index (``dyntrain data pack``); local paths or fsspec URLs.
- ``ImageTransform`` / ``ImageDataset``: decode + augment (train) or resize + centre crop (val).
- ``LoaderConfig``: pass it as ``ElasticTrainer(..., loader=LoaderConfig(workers=2))`` to produce
  this worker's chunks in DataLoader worker processes, ahead of time, seeded per sample.
"""

from dyntrain.data.images import ImageDataset, ImageTransform
from dyntrain.data.loader import ChunkLoader, LoaderConfig, sample_seed
from dyntrain.data.pack import pack
from dyntrain.data.sources import DataError, ImageFolder, PackedShards, open_source

__all__ = ["ChunkLoader", "DataError", "ImageDataset", "ImageFolder", "ImageTransform",
           "LoaderConfig", "PackedShards", "open_source", "pack", "sample_seed"]
