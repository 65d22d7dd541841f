"""Where images come from: an image folder or packed tar shards, read by sample index.

Both sources give random access by sample index (the sampler decides the order) and take local
paths or fsspec URLs (``file://``, ``s3://``, ``memory://``, ...). A source hands out encoded
bytes; decoding happens in the loader processes (``dyntrain.data.images``).

Packed shards are WebDataset tar files (``shard-000000.tar`` holding ``00000000.jpg`` and
``00000000.cls`` per sample), so webdataset's tools stream them sequentially as they are, plus
``index.json`` (classes, shards, format) and ``index.npy`` (per sample: shard, byte offset, size,
label) for reads by index: one seek and one read per sample, no tar scan.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass

import fsspec
import numpy as np

from dyntrain.errors import DataError

__all__ = ["ImageFolder", "PackedShards", "Record", "open_source"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
INDEX_JSON, INDEX_TABLE = "index.json", "index.npy"
PACK_FORMAT = 1


@dataclass(frozen=True)
class Record:
    """One encoded sample: its bytes, class index, and a name for error messages."""

    data: bytes
    label: int
    name: str


def _fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/") or "/"


class ImageFolder:
    """``root/<class>/<image>.jpg|.jpeg|.png``: classes and files in sorted order.

    Args:
        root: The folder, a local path or an fsspec URL (``s3://bucket/train``).

    Raises:
        DataError: The folder does not exist or holds no image in a class sub-folder.
    """

    def __init__(self, root: str) -> None:
        self.root = str(root)
        self.fs, path = _fs(self.root)
        if not self.fs.isdir(path):
            raise DataError(f"image folder not found: {self.root}")
        self.classes = sorted(posixpath.basename(d["name"].rstrip("/"))
                              for d in self.fs.ls(path, detail=True) if d["type"] == "directory")
        files: list[str] = []
        labels: list[int] = []
        for label, cls in enumerate(self.classes):
            names = sorted(f for f in self.fs.ls(posixpath.join(path, cls), detail=False)
                           if f.lower().endswith(IMAGE_EXTENSIONS))
            files += names
            labels += [label] * len(names)
        if not files:
            raise DataError(f"no .jpg/.jpeg/.png images in class sub-folders of {self.root}")
        self.files, self.labels = files, labels

    def __len__(self) -> int:
        return len(self.files)

    def read(self, index: int) -> Record:
        """The encoded bytes and the label of sample ``index``.

        Args:
            index: In ``range(len(self))``: classes in sorted order, then files in sorted order.

        Raises:
            DataError: The file cannot be read (naming it).
        """
        path = self.files[index]
        try:
            with self.fs.open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise DataError(f"cannot read image {path}: {exc}") from None
        return Record(data, self.labels[index], path)


class PackedShards:
    """WebDataset tar shards plus the index ``dyntrain data pack`` writes; reads by index.

    Each sample is one seek and one read in its shard; a forked loader process opens its own
    files.

    Args:
        root: The pack's folder (holding ``index.json``), a local path or an fsspec URL.

    Raises:
        DataError: The index cannot be read or is of an unknown format.
    """

    def __init__(self, root: str) -> None:
        self.root = str(root)
        self.fs, self.path = _fs(self.root)
        meta_path = posixpath.join(self.path, INDEX_JSON)
        try:
            with self.fs.open(meta_path, "rb") as f:
                meta = json.load(f)
            with self.fs.open(posixpath.join(self.path, INDEX_TABLE), "rb") as f:
                table = np.load(f)
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read the shard index in {self.root}: {exc}") from None
        if meta.get("format") != PACK_FORMAT:
            raise DataError(f"{meta_path}: unknown pack format {meta.get('format')!r}")
        self.classes: list[str] = meta["classes"]
        self.shards: list[str] = meta["shards"]
        self.extensions: list[str] = meta["extensions"]
        self.table = table  # int64 [N, 5]: shard, offset, size, label, extension
        self._pid: int | None = None
        self._handles: dict = {}

    def __len__(self) -> int:
        return len(self.table)

    def _file(self, shard: int):
        """This process's open file of ``shard``: a forked loader process must not share a
        file offset with its parent, so handles are per process id."""
        if self._pid != os.getpid():
            self._pid, self._handles = os.getpid(), {}
        f = self._handles.get(shard)
        if f is None:
            f = self._handles[shard] = self.fs.open(posixpath.join(self.path, self.shards[shard]),
                                                    "rb")
        return f

    def read(self, index: int) -> Record:
        """The encoded bytes and the label of sample ``index``.

        Args:
            index: In ``range(len(self))``, the order of the source that was packed.

        Raises:
            DataError: The shard cannot be read or the sample is truncated (naming it).
        """
        shard, offset, size, label, ext = (int(v) for v in self.table[index])
        name = f"{self.shards[shard]}:{index:08d}{self.extensions[ext]}"
        try:
            f = self._file(shard)
            f.seek(offset)
            data = f.read(size)
        except OSError as exc:
            raise DataError(f"cannot read sample {name} in {self.root}: {exc}") from None
        if len(data) != size:
            raise DataError(f"sample {name} in {self.root} is truncated "
                            f"({len(data)} of {size} bytes)")
        return Record(data, label, name)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_pid"], state["_handles"] = None, {}  # open files stay with their process
        return state


def open_source(root: str) -> ImageFolder | PackedShards:
    """Packed shards where ``root`` holds an ``index.json``, an image folder otherwise.

    Args:
        root: A local path or an fsspec URL.

    Raises:
        DataError: ``root`` is neither (one line, naming it).
    """
    fs, path = _fs(str(root))
    if fs.exists(posixpath.join(path, INDEX_JSON)):
        return PackedShards(root)
    return ImageFolder(root)
