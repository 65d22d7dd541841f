"""Durable, atomic, checksummed checkpoints of a training job, independent of the world size.

A checkpoint holds one plain state dict (model, optimizer, scheduler, scaler, RNG, counters) and
nothing about which workers wrote it, so a job can resume on any number of workers. A file is
``MAGIC + sha256(payload) + len(payload) as 8 little-endian bytes + payload``; it appears under
its final name only once fully written and synced, and a reader rejects any file whose header or
checksum does not match instead of resuming from garbage.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from dyntrain.errors import DyntrainError

MAGIC = b"DYNTCKPT1\n"
_DIGEST_SIZE = 32
_LENGTH_SIZE = 8
_HEADER_SIZE = len(MAGIC) + _DIGEST_SIZE + _LENGTH_SIZE
_NAME_RE = re.compile(r"ckpt-(\d{9,})\.dtck")


class CorruptCheckpoint(DyntrainError):
    """A checkpoint file is truncated, damaged or not a checkpoint; it must not be resumed from."""

    def __init__(self, path: Path, reason: str) -> None:
        # Both go to ``args`` so the exception survives pickling between processes.
        super().__init__(path, reason)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path.name}: {self.reason}"


def dumps(state: dict) -> bytes:
    """Serialize a state dict with ``torch.save``, the format ``loads`` reads back safely."""
    buffer = io.BytesIO()
    import torch  # here, not at the top: listing checkpoints (the service's pages) needs no torch

    torch.save(state, buffer)
    return buffer.getvalue()


def loads(data: bytes) -> dict:
    """Deserialize a state dict onto the CPU without running arbitrary pickled code.

    ``weights_only=True`` refuses any global outside torch's allow-list, so a tampered file cannot
    execute code; ``map_location="cpu"`` lets a checkpoint written on GPUs load anywhere.
    """
    import torch

    state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    if not isinstance(state, dict):
        raise TypeError(f"expected a dict, got {type(state).__name__}")
    return state


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new, never half.

    The bytes go to a uniquely named temporary file in the same directory (so concurrent writers
    do not collide and the rename stays on one file system), are synced to disk, and are renamed
    over ``path``; the directory is then synced so the rename itself survives a power loss.
    """
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def checkpoint_path(directory: Path, step: int) -> Path:
    """The file name of the checkpoint taken after ``step``; zero-padded so names sort by step."""
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    return directory / f"ckpt-{step:09d}.dtck"


def save_checkpoint(directory: Path, step: int, state: dict, keep: int = 3) -> Path:
    """Durably write the checkpoint of ``step`` and prune all but the newest ``keep`` checkpoints.

    The file just written is never pruned, even when checkpoints with higher step numbers exist
    (say a corrupt one that a resume skipped), so a save is always followed by a readable file.
    Temporary files of other writers are left alone.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, step)
    atomic_write_bytes(path, encode_checkpoint(state))
    existing = list_checkpoints(directory)
    for old_step, old_path in existing[:-keep]:
        if old_step != step:
            old_path.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> dict:
    """Load a checkpoint after checking its magic, length and checksum.

    Raises ``CorruptCheckpoint`` (one line, naming the file) rather than handing back a state that
    was damaged on disk or cut short by a crash.
    """
    return decode_checkpoint(path.read_bytes(), path)


def encode_checkpoint(state: dict) -> bytes:
    """A checkpoint's bytes: ``MAGIC + sha256(payload) + length + payload``."""
    payload = dumps(state)
    length = len(payload).to_bytes(_LENGTH_SIZE, "little")
    return MAGIC + hashlib.sha256(payload).digest() + length + payload


def decode_checkpoint(data: bytes, path: Path) -> dict:
    """The state in a checkpoint's bytes, after checking its magic, length and checksum;
    ``path`` names it in the ``CorruptCheckpoint`` raised for damaged bytes."""
    if not data.startswith(MAGIC) and not MAGIC.startswith(data):
        raise CorruptCheckpoint(path, "bad magic: not a dyntrain checkpoint")
    if len(data) < _HEADER_SIZE:
        raise CorruptCheckpoint(path, f"truncated: {len(data)} bytes, header is {_HEADER_SIZE}")
    digest = data[len(MAGIC) : len(MAGIC) + _DIGEST_SIZE]
    length = int.from_bytes(data[len(MAGIC) + _DIGEST_SIZE : _HEADER_SIZE], "little")
    payload = data[_HEADER_SIZE:]
    if len(payload) < length:
        raise CorruptCheckpoint(path, f"truncated: payload has {len(payload)} of {length} bytes")
    if len(payload) > length:
        raise CorruptCheckpoint(
            path, f"{len(payload) - length} unexpected bytes after the {length}-byte payload"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint(path, "checksum mismatch")
    try:
        return loads(payload)
    except Exception as exc:  # torch.load raises many types; any of them means unusable.
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise CorruptCheckpoint(
            path, f"payload cannot be loaded: {type(exc).__name__}: {first_line}"
        ) from exc


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """The checkpoint files in ``directory`` as ``(step, path)``, oldest first.

    Only names made by ``checkpoint_path`` count, so temporary files and anything else a user
    keeps there are ignored. A missing directory simply has no checkpoints.
    """
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = _NAME_RE.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_valid_checkpoint(
    directory: Path, on_skip: Callable[[Path, str], None] | None = None
) -> tuple[int, Path, dict] | None:
    """The newest checkpoint that reads back intact, as ``(step, path, state)``, or ``None``.

    A crash or a bad disk can damage the newest file; resuming from the one before loses a little
    progress instead of the whole job. Every file passed over is reported to ``on_skip`` with the
    reason, so the caller can log it.
    """
    for step, path in reversed(list_checkpoints(directory)):
        try:
            return step, path, read_checkpoint(path)
        except CorruptCheckpoint as exc:
            reason = exc.reason
        except OSError as exc:  # e.g. pruned by another writer after it was listed
            reason = f"unreadable: {exc.strerror or exc}"
        if on_skip is not None:
            on_skip(path, reason)
    return None
