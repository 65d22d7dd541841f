"""Checkpoints in a run store: one file each in a local folder, parts plus a commit record on an
object store; either way a checkpoint is seen only once it is complete.

A local folder keeps ``checkpoint_file.py``'s format: one file per checkpoint, renamed into place
once synced. An object store has no rename, and a large upload is not one operation, so a checkpoint
is written as parts (``ckpt-000000012.<token>.part0000``, ...) and then a small commit record
``ckpt-000000012.commit`` (JSON: each part's name, size and SHA-256, and the total size). Readers
list commit records only: a writer killed mid-upload leaves parts without a record, and the
previous checkpoint stays the newest that verifies; the orphan parts are deleted by the next
save that reaches their step. A record whose parts are missing or do not match is skipped like
a corrupt file. Old checkpoints are pruned as in a local folder (records first, then parts).

Either kind is read from either kind of store, so a run folder copied between a disk and a
bucket resumes where it was. At shard levels 1-3 checkpoints are in torch's Distributed
Checkpoint format instead, written by every member (``dcpckpt``): in a local folder one folder
each (``ckpt-000000012.dcp/``); on an object store the members' files in the writing
generation's folder (``ckpt-000000012.g3.dcp/``) and the commit record, naming that folder, at
``ckpt-000000012.dcp``, put last. They are listed, read, described and pruned here with the
others; a DCP checkpoint is read from the kind of store that wrote it.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dyntrain.elastic.runs import checkpoint_file, dcp
from dyntrain.elastic.runs.checkpoint_file import (
    CorruptCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
)
from dyntrain.elastic.runs.storage import RunStore, StorageError, open_store, parent_and_name

FOLDER = "checkpoints"
RECORD_FORMAT = 1
PART_BYTES = 32 << 20  # below s3fs's single-PUT limit (2 x 50 MiB): each part is one request
_ENTRY_RE = re.compile(r"ckpt-(\d{9,})\.(dtck|commit|dcp)")
_PART_RE = re.compile(r"ckpt-(\d{9,})\.[0-9a-f]+\.part\d{4,}")
_DCP_FILES_RE = re.compile(r"ckpt-(\d{9,})\.g\d+\.[0-9a-f]+\.dcp")  # an object store's DCP files
_FILE_NAME_RE = re.compile(r"\.?[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a DCP file, no folder


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint as listed for people: its step, file name, bytes and when it was made."""

    step: int
    name: str
    size_bytes: int
    written_at: float


def commit_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    return f"{FOLDER}/ckpt-{step:09d}.commit"


def list_checkpoints(store: RunStore) -> list[tuple[int, str]]:
    """The checkpoints in ``store`` as ``(step, name)``, oldest first (a step with both a file
    and a commit record, or a DCP folder, counts once, as the record or the folder)."""
    return _entries(_listing(store))


def _listing(store: RunStore) -> dict[str, int]:
    """The files in the checkpoints folder, and its DCP checkpoint folders, with their bytes."""
    listing = store.list(FOLDER)
    if store.local is not None:
        listing.update({f"{FOLDER}/{name}": size for name, size
                        in dcp.list_folders(store.local / FOLDER).items()})
    return listing


def _entries(listing: dict[str, int]) -> list[tuple[int, str]]:
    by_step: dict[int, str] = {}
    for name in listing:
        match = _ENTRY_RE.fullmatch(name.rpartition("/")[2])
        if match and (match.group(2) != "dtck" or int(match.group(1)) not in by_step):
            by_step[int(match.group(1))] = name
    return sorted(by_step.items())


def newest_step(store: RunStore) -> int:
    """The step of the newest checkpoint listed (0 when there is none); not verified."""
    found = list_checkpoints(store)
    return found[-1][0] if found else 0


def save_checkpoint(store: RunStore, step: int, state: dict, keep: int = 3,
                    part_bytes: int = PART_BYTES) -> str:
    """Write the checkpoint of ``step``, prune all but the newest ``keep``, return where it is.

    Args:
        store: the run folder.
        step: the step the state was taken after.
        state: the plain state dict (``state.capture_state``).
        keep: how many checkpoints to keep; the one just written is never pruned.
        part_bytes: the size of each part on an object store.
    """
    if store.local is not None:
        where = str(checkpoint_file.save_checkpoint(store.local / FOLDER, step, state, keep))
        prune_local(store, step, keep)
        return where
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    blob = encode_checkpoint(state)
    stem, token = commit_name(step).removesuffix(".commit"), secrets.token_hex(4)
    parts = {f"{stem}.{token}.part{i:04d}": blob[at:at + part_bytes]
             for i, at in enumerate(range(0, len(blob), part_bytes))}
    store.put_many(parts)
    record = {"format": RECORD_FORMAT, "step": step, "size": len(blob), "time": time.time(),
              "parts": [{"name": name.rpartition("/")[2], "size": len(data),
                         "sha256": hashlib.sha256(data).hexdigest()}
                        for name, data in parts.items()]}
    store.put(commit_name(step), json.dumps(record).encode())
    _prune(store, step, keep)
    return store.where(commit_name(step))


def dcp_files_folder(step: int, generation: int, token: str) -> str:
    """On an object store: where the members of ``generation`` upload their files of the DCP
    checkpoint of ``step``; ``token`` (hex) is the leader's, drawn for this checkpoint. The
    folder is this write's own: a late upload of an abandoned generation, or of an earlier
    launch's generation of the same number, never lands in a checkpoint that counts."""
    return f"{FOLDER}/ckpt-{step:09d}.g{generation}.{token}{dcp.SUFFIX}"


def upload_shard(store: RunStore, staging: Path, folder: str, report: bytes) -> bytes:
    """A member, on an object store: upload the DCP files it wrote into its scratch folder
    ``staging`` (``dcp.write_part``) into ``folder`` (``dcp_files_folder``); returns its
    report (an error report if it failed)."""
    return dcp.upload_part(store, folder, staging, report)


def commit_sharded(store: RunStore, staging: Path, step: int, reports: list[bytes],
                   keep: int = 3, folder: str | None = None) -> str:
    """The leader: commit the DCP checkpoint of ``step`` that every member wrote and
    reported, prune all but the newest ``keep``, return where it is. In a local folder
    ``staging`` is the step's staging folder (``dcp.commit``); on an object store the
    leader's scratch folder, and the members' files are uploaded already into ``folder``
    (``upload_shard``): the leader uploads ``.metadata``, then puts the commit record.

    Raises:
        OSError: A member could not write or upload its part (nothing is committed then).
        StorageError: The store cannot be reached.
    """
    if store.local is not None:
        where = dcp.commit(staging, step, reports)
        prune_local(store, step, keep)
        return str(where)
    if folder is None:
        raise ValueError("on an object store the folder of the members' files is needed")
    record = dcp.merge_reports(staging, step, reports)
    metadata = (staging / ".metadata").read_bytes()
    store.put(f"{folder}/.metadata", metadata)
    record["files"][".metadata"] = dcp.file_entry(metadata)
    record["folder"] = folder.rpartition("/")[2]
    name = f"{FOLDER}/{dcp.folder_name(step)}"
    store.put(name, json.dumps(record).encode())
    _prune(store, step, keep)
    return store.where(name)


def prune_local(store: RunStore, step: int, keep: int) -> None:
    """In a local folder: delete all but the newest ``keep`` checkpoints of either format
    (never ``step``'s), and the staging folders of DCP checkpoints never committed."""
    for _, name in [(s, n) for s, n in list_checkpoints(store)[:-keep] if s != step]:
        dcp.remove(store.local / name)
    dcp.drop_stale_staging(store.local / FOLDER, step)


def _prune(store: RunStore, step: int, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (never ``step``'s): their records first,
    so none is visible without its parts; then every part no kept record names, of a step up to
    ``step`` or of a pruned one (a later step's may still be uploading)."""
    listing = store.list(FOLDER)
    entries = _entries(listing)
    old = [(s, n) for s, n in entries[:-keep] if s != step]
    store.delete(n for _, n in old)
    gone = {s for s, _ in old}
    named, folders = set(), set()  # the parts and the DCP files' folders of kept checkpoints
    for s, name in entries:
        try:
            if s not in gone and name.endswith(".commit"):
                named |= {f"{FOLDER}/{p['name']}" for p in _record(store, name)["parts"]}
            elif s not in gone and name.endswith(dcp.SUFFIX):
                folders.add(_dcp_record(store, name)["folder"])
        except (CorruptCheckpoint, FileNotFoundError):
            continue
    for folder in store.list_folders(FOLDER):
        match = _DCP_FILES_RE.fullmatch(folder.rpartition("/")[2])
        if match and folder.rpartition("/")[2] not in folders and (
                int(match.group(1)) <= step or int(match.group(1)) in gone):
            store.delete(store.list(folder))  # pruned, or never committed (late, abandoned)
    orphans = []
    for name in listing:
        match = _PART_RE.fullmatch(name.rpartition("/")[2])
        if match and name not in named and (int(match.group(1)) <= step
                                            or int(match.group(1)) in gone):
            orphans.append(name)
    store.delete(orphans)


def _record(store: RunStore, name: str) -> dict:
    where = _where(store, name)
    try:
        record = json.loads(store.get(name))
        if record.get("format") != RECORD_FORMAT:
            raise CorruptCheckpoint(where, f"unknown commit record format {record.get('format')}")
        for part in record["parts"]:
            if not (isinstance(part["name"], str) and isinstance(part["size"], int)
                    and isinstance(part["sha256"], str)):
                raise TypeError("bad part entry")
        if not isinstance(record["size"], int):
            raise TypeError("bad size")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptCheckpoint(where, f"not a commit record ({exc})") from None
    return record


def _dcp_record(store: RunStore, name: str) -> dict:
    """The commit record of an object store's DCP checkpoint ``name``, checked."""
    where = _where(store, name)
    try:
        record = json.loads(store.get(name))
        if record.get("format") != dcp.COMMIT_FORMAT:
            raise CorruptCheckpoint(where, f"unknown commit record format {record.get('format')}")
        match = _DCP_FILES_RE.fullmatch(record["folder"])
        if not match or match.group(1) != name.rpartition("/")[2][5:-4]:
            raise ValueError(f"folder {record['folder']!r} is not this step's")
        for file, entry in record["files"].items():
            if not (_FILE_NAME_RE.fullmatch(file) and isinstance(entry["size"], int)
                    and isinstance(entry["sha256"], str)):
                raise TypeError(f"bad file entry {file!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptCheckpoint(where, f"not a commit record ({exc})") from None
    return record


def _read_dcp_from(store: RunStore, name: str,
                   keep: Callable[[str], bool] | None = None) -> dict:
    """Load an object store's DCP checkpoint ``name``: its files, fetched one by one into a
    scratch folder and checked there (``dcp.read_dcp``; ``keep``: which keys)."""
    where = _where(store, name)
    record = _dcp_record(store, name)
    folder = f"{FOLDER}/{record['folder']}"
    with tempfile.TemporaryDirectory(prefix="dyntrain-dcp-") as tmp:
        for file in record["files"]:
            try:
                (Path(tmp) / file).write_bytes(store.get(f"{folder}/{file}"))
            except FileNotFoundError:
                raise CorruptCheckpoint(where, f"file {file} is missing") from None
        (Path(tmp) / dcp.COMMIT).write_bytes(json.dumps(record).encode())
        try:
            return dcp.read_dcp(Path(tmp), keep)
        except CorruptCheckpoint as exc:  # named by its place in the store, not the scratch
            raise CorruptCheckpoint(where, exc.reason) from None


def read_checkpoint(store: RunStore, name: str,
                    keep: Callable[[str], bool] | None = None) -> dict:
    """Load the checkpoint ``name`` (a file or a commit record) after verifying it; of a DCP
    checkpoint only the keys ``keep`` accepts (``dcp.read_dcp``; None: all).

    Raises ``CorruptCheckpoint`` for a damaged or incomplete one, ``StorageError`` when the
    store cannot be reached (never mistaken for a damaged checkpoint).
    """
    where = _where(store, name)
    if name.endswith(dcp.SUFFIX):
        if store.local is None:
            return _read_dcp_from(store, name, keep)
        return dcp.read_dcp(store.local / name, keep)
    if not name.endswith(".commit"):
        return decode_checkpoint(store.get(name), where)
    record = _record(store, name)
    names = [f"{FOLDER}/{p['name']}" for p in record["parts"]]
    got = store.get_many(names)
    chunks = []
    for part, part_name in zip(record["parts"], names, strict=True):
        data = got[part_name]
        if isinstance(data, FileNotFoundError):
            raise CorruptCheckpoint(where, f"part {part['name']} is missing")
        if isinstance(data, Exception):
            raise StorageError(f"cannot read {store.where(part_name)}: {data}")
        if len(data) != part["size"]:
            raise CorruptCheckpoint(where, f"part {part['name']} has {len(data)} of "
                                           f"{part['size']} bytes")
        if hashlib.sha256(data).hexdigest() != part["sha256"]:
            raise CorruptCheckpoint(where, f"part {part['name']}: checksum mismatch")
        chunks.append(data)
    blob = b"".join(chunks)
    if len(blob) != record["size"]:
        raise CorruptCheckpoint(where, f"parts hold {len(blob)} of {record['size']} bytes")
    return decode_checkpoint(blob, where)


def read_ref(ref: str, keep: Callable[[str], bool] | None = None) -> dict:
    """Load a checkpoint by its full location (what ``save_checkpoint`` returned); ``keep``:
    as ``read_checkpoint``'s."""
    root, name = parent_and_name(ref)
    return read_checkpoint(open_store(root), name, keep)


def latest_valid_checkpoint(store: RunStore, on_skip: Callable[[str, str], None] | None = None
                            ) -> tuple[int, str, dict] | None:
    """The newest checkpoint that verifies, as ``(step, location, state)``, or ``None``.

    Every one passed over is reported to ``on_skip`` with the reason. A store that cannot be
    reached raises ``StorageError`` instead: a network fault must not restart a job from step 0.
    """
    for step, name in reversed(list_checkpoints(store)):
        try:
            return step, store.where(name), read_checkpoint(store, name)
        except CorruptCheckpoint as exc:
            reason = exc.reason
        except OSError as exc:  # e.g. pruned by another writer after it was listed
            reason = f"unreadable: {exc.strerror or exc}"
        if on_skip is not None:
            on_skip(store.where(name), reason)
    return None


def describe_checkpoints(store: RunStore) -> list[CheckpointInfo]:
    """The checkpoints now in ``store``, newest first, with their sizes and times."""
    listing = _listing(store)
    out = []
    for step, name in _entries(listing):
        try:
            if name.endswith(".commit"):
                record = _record(store, name)
                out.append(CheckpointInfo(step, name.rpartition("/")[2], record["size"],
                                          float(record.get("time") or 0.0)))
            elif store.local is None and name.endswith(dcp.SUFFIX):
                record = _dcp_record(store, name)
                out.append(CheckpointInfo(step, name.rpartition("/")[2],
                                          sum(f["size"] for f in record["files"].values()),
                                          float(record.get("time") or 0.0)))
            elif store.local is not None:
                st = (store.local / name).stat()
                out.append(CheckpointInfo(step, name.rpartition("/")[2], listing[name],
                                          st.st_mtime))
            else:
                out.append(CheckpointInfo(step, name.rpartition("/")[2], listing[name], 0.0))
        except (CorruptCheckpoint, FileNotFoundError):
            continue  # pruned between the listing and now
    return sorted(out, key=lambda c: c.step, reverse=True)


def _where(store: RunStore, name: str) -> Path:
    """How a checkpoint is named in messages: its path, or its URL's path part."""
    return Path(store.where(name)) if store.local is not None else \
        PurePosixPath(store.where(name))  # type: ignore[return-value]
