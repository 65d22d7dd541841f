"""``dyntrain data pack SRC DST``: an image folder into WebDataset tar shards plus an index."""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
import time
from dataclasses import dataclass

import numpy as np

from dyntrain.data.sources import INDEX_JSON, INDEX_TABLE, PACK_FORMAT, _fs, open_source
from dyntrain.errors import DataError
from dyntrain.outdir import make_out_dir


@dataclass(frozen=True)
class PackSummary:
    samples: int
    classes: int
    shards: int
    bytes: int
    seconds: float


def pack(src: str, dst: str, shard_bytes: int = 256 << 20) -> PackSummary:
    """Write every sample of ``src`` (an image folder, or packed shards) into tar shards of at
    most ``shard_bytes`` of image data each (a sample never spans two), then the index.

    The index is written last: a folder without ``index.json`` is not a finished pack.
    ``dyntrain data pack SRC DST`` calls it.

    Args:
        src: The source: an image folder or packed shards, a local path or an fsspec URL.
        dst: The pack's folder, created if needed (local path or fsspec URL).
        shard_bytes: Most image bytes per shard.

    Returns:
        How many samples, classes, shards and bytes were written, and the seconds it took.

    Raises:
        DataError: ``src`` cannot be read, ``dst`` cannot be written, or ``shard_bytes`` is
            not positive.
    """
    if shard_bytes <= 0:
        raise DataError(f"shard size must be positive, got {shard_bytes}")
    t0 = time.perf_counter()
    source = open_source(src)
    fs, root = _fs(str(dst))
    if "file" in fs.protocol:  # a local folder: one line when it cannot be one
        make_out_dir(root if "://" in str(dst) else dst, "DST")
    if fs.exists(posixpath.join(root, INDEX_JSON)):
        raise DataError(f"{dst} already holds a pack (index.json); choose an empty folder")
    fs.makedirs(root, exist_ok=True)
    shards: list[str] = []
    extensions: list[str] = []
    rows: list[tuple[int, int, int, int, int]] = []
    total = 0
    i = 0
    while i < len(source):
        name = f"shard-{len(shards):06d}.tar"
        members, size = [], 0
        with fs.open(posixpath.join(root, name), "wb") as f, \
                tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            while i < len(source) and size < shard_bytes:
                rec = source.read(i)
                ext = posixpath.splitext(rec.name)[1].lower() or ".jpg"
                if ext not in extensions:
                    extensions.append(ext)
                key = f"{i:08d}"
                _add(tar, key + ext, rec.data)
                _add(tar, key + ".cls", str(rec.label).encode())
                members.append((key + ext, rec.label, extensions.index(ext)))
                size += len(rec.data)
                i += 1
        offsets = _data_offsets(fs, posixpath.join(root, name))
        for member, label, ext_id in members:
            offset, length = offsets[member]
            rows.append((len(shards), offset, length, label, ext_id))
        shards.append(name)
        total += size
    with fs.open(posixpath.join(root, INDEX_TABLE), "wb") as f:
        np.save(f, np.asarray(rows, dtype=np.int64).reshape(-1, 5))
    meta = {"format": PACK_FORMAT, "samples": len(rows), "classes": list(source.classes),
            "shards": shards, "extensions": extensions}
    with fs.open(posixpath.join(root, INDEX_JSON), "w") as f:
        json.dump(meta, f, indent=1)
    return PackSummary(len(rows), len(source.classes), len(shards), total,
                       time.perf_counter() - t0)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # reproducible shards
    tar.addfile(info, io.BytesIO(data))


def _data_offsets(fs, path: str) -> dict[str, tuple[int, int]]:
    """Byte offset and size of every member's data in a finished tar shard."""
    with fs.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
        return {m.name: (m.offset_data, m.size) for m in tar.getmembers()}
