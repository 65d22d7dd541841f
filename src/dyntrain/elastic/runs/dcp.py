"""Sharded checkpoints in torch's Distributed Checkpoint (DCP) format, written by every member.

At shard levels 1-3 no member holds the whole optimizer state, so instead of gathering it to
one writer, every member writes a share of the tensors it owns (their parameters and optimizer
state, each tensor by one of its owners, balanced by bytes: ``split_writes``; the leader also
the rest: counters, RNG, scheduler, scaler, hyperparameters, buffers) with DCP's planner and
storage writer, each as its own one-member save: no process group takes part in the write. A
checkpoint is a folder ``checkpoints/ckpt-000000012.dcp`` holding DCP's ``.metadata``, one
``__<rank>_0.distcp`` per member and ``dyntrain.commit`` (JSON: each data file's size and
SHA-256).

On a local run folder it is seen only once complete: the members write into a staging folder
(``checkpoints/.ckpt-000000012.g<generation>.staging``), sync their files and report what they
wrote (DCP's metadata and write results, their files' checksums) to every member over the
generation's group; the leader then writes ``.metadata`` and the commit record into the staging
folder, syncs them and renames the folder into place. A folder without its commit record, or
whose files do not match it, is skipped on resume like a corrupt file; a staging folder that
never got committed (a member died, the generation was abandoned) is deleted by a later save.

An object store has no rename: there each member writes its files into a local scratch folder
and uploads them into the generation's own folder of the step
(``checkpoints/ckpt-000000012.g3.dcp/``, so that a late upload of an abandoned generation lands
where nothing reads it); the leader uploads ``.metadata`` and then puts the commit record,
naming that folder, at ``checkpoints/ckpt-000000012.dcp``: the checkpoint is seen once that one
object is there (``ckptstore``).

A checkpoint reads back as the plain state dict that ``state.capture_state`` makes (at any world
size and shard level: every reader loads it whole, without a process group), and torch's own
tools read it (``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dyntrain.elastic.runs.checkpoint_file import CorruptCheckpoint, atomic_write_bytes
from dyntrain.elastic.runs.storage import RunStore, StorageError

if TYPE_CHECKING:  # torch loads where a checkpoint is written or read, not for a listing
    import torch

    from dyntrain.elastic.collective.comm import Group

SUFFIX = ".dcp"
COMMIT = "dyntrain.commit"
COMMIT_FORMAT = 1
_STAGING_RE = re.compile(r"\.ckpt-(\d{9,})\.g\d+\.staging")
_FOLDER_RE = re.compile(r"ckpt-(\d{9,})\.dcp")


def folder_name(step: int) -> str:
    """The folder of the DCP checkpoint taken after ``step`` (sorts by step, as the files do)."""
    return f"ckpt-{step:09d}{SUFFIX}"


def staging_folder(directory: Path, step: int, generation: int) -> Path:
    """Where the members of ``generation`` write the checkpoint of ``step`` before it counts."""
    return directory / f".ckpt-{step:09d}.g{generation}.staging"


def split_writes(owner_ranks: Sequence[Sequence[int]], nbytes: Sequence[int],
                 size: int) -> list[list[int]]:
    """Pure: which tensors each of ``size`` members writes, balanced by bytes: every tensor goes
    to the one of its owners (``owner_ranks[t]``, the ranks holding its state) that writes the
    fewest bytes so far, largest tensor first (ties by tensor index and rank), so the same on
    every member. With ``r`` owners per tensor the writes spread even where one member is the
    primary of most tensors (every member owns every tensor when ``r`` is the world size)."""
    load, out = [0] * size, [[] for _ in range(size)]
    for t in sorted(range(len(nbytes)), key=lambda i: (-nbytes[i], i)):
        rank = min(owner_ranks[t], key=lambda r: (load[r], r))
        load[rank] += nbytes[t]
        out[rank].append(t)
    return [sorted(ts) for ts in out]


def member_part(state: dict, params: Sequence[torch.Tensor], names: Sequence[Sequence[str]],
                optimizer: torch.optim.Optimizer, mine: Sequence[int], leader: bool) -> dict:
    """What one member writes: the parameters and optimizer state of the tensors ``mine``
    (indices into ``params``, named ``names``; ``split_writes``), and on the ``leader`` the rest
    of ``state`` (``capture_state``'s dict, taken on that member).

    Args:
        state: The member's ``capture_state`` dict (its optimizer holds its own tensors).
        params: The trainable parameters in the stepper's order.
        names: Each one's names in the model's ``state_dict`` (a tied parameter has several).
        optimizer: The member's optimizer, for each parameter's index in its ``state_dict``.
        mine: The tensors this member writes (it holds their state).
        leader: Whether this member also writes everything that is not a tensor's shard.
    """
    order = {id(q): i for i, q in enumerate(q for g in optimizer.param_groups
                                             for q in g["params"])}
    tensor_state = state["optimizer"]["state"]
    part: dict = {"model": {n: state["model"][n] for t in mine for n in names[t]},
                  "optimizer": {"state": {order[id(params[t])]: tensor_state[order[id(params[t])]]
                                          for t in mine
                                          if order[id(params[t])] in tensor_state}}}
    if leader:
        sharded = {n for aliases in names for n in aliases}
        part["model"].update({k: v for k, v in state["model"].items() if k not in sharded})
        part["optimizer"]["param_groups"] = state["optimizer"]["param_groups"]
        part.update({k: v for k, v in state.items() if k not in ("model", "optimizer")})
    return part


def write_part(staging: Path, part: dict, rank: int) -> bytes:
    """Write one member's ``part`` into ``staging`` as DCP's ``__<rank>_*.distcp`` files,
    synced, and return its report for the leader (or the error, one line, as the report)."""
    # torch's DCP is imported where it is used: listing checkpoints does not load it
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import SavePlan

    try:
        writer = FileSystemWriter(staging, single_file_per_rank=True, sync_files=True)
        writer.set_up_storage_writer(True)
        writer.reset(staging)
        planner = DefaultSavePlanner()
        planner.set_up_planner(part, None, True)
        local = writer.prepare_local_plan(planner.create_local_plan())
        plans, metadata = planner.create_global_plan([local])
        plan = planner.finish_plan(writer.prepare_global_plan([SavePlan([])] * rank + plans)[-1])
        results = writer.write_data(plan, planner).wait()
        files = {}
        for name in sorted({r.storage_data.relative_path for r in results}):
            files[name] = file_entry((staging / name).read_bytes())
        return pickle.dumps({"metadata": metadata, "results": results, "files": files})
    except (OSError, RuntimeError, ValueError) as exc:
        return pickle.dumps({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})


def upload_part(store: RunStore, folder: str, staging: Path, report: bytes) -> bytes:
    """A member, on an object store: upload the files its ``report`` names from its local
    scratch folder ``staging`` into the store's ``folder``; returns the report, or, when the
    part was not written or the upload failed, a report of the error (one line)."""
    if "error" in pickle.loads(report):
        return report
    try:
        store.put_many({f"{folder}/{name}": (staging / name).read_bytes()
                        for name in pickle.loads(report)["files"]})
    except (StorageError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return pickle.dumps({"error": f"cannot upload to {store.where(folder)}: {first}"})
    return report


def exchange_reports(group: Group, report: bytes,
                     should_abort: Callable[[], bool]) -> list[bytes]:
    """Every member's report, in rank order, on every member (one broadcast per member)."""
    return [group.broadcast_bytes(report if rank == group.rank else None, rank, should_abort)
            for rank in range(group.size)]


def merge_reports(staging: Path, step: int, reports: Sequence[bytes]) -> dict:
    """The leader: after every member reported its part written (``write_part``), write DCP's
    ``.metadata`` into ``staging`` and return the commit record (not yet written anywhere).

    Raises:
        OSError: A member could not write its part (nothing is committed then).
    """
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.metadata import Metadata

    parts = [pickle.loads(r) for r in reports]  # from this generation's members
    failed = [f"member {rank}: {p['error']}" for rank, p in enumerate(parts) if "error" in p]
    if failed:
        raise OSError('; '.join(failed))
    metadata = Metadata(
        state_dict_metadata={k: v for p in parts
                             for k, v in p["metadata"].state_dict_metadata.items()},
        planner_data={k: v for p in parts for k, v in (p["metadata"].planner_data or {}).items()})
    writer = FileSystemWriter(staging, sync_files=True)
    writer.set_up_storage_writer(True)
    writer.reset(staging)
    writer.finish(metadata, [p["results"] for p in parts])
    files = {name: entry for p in parts for name, entry in p["files"].items()}
    return {"format": COMMIT_FORMAT, "step": step, "time": time.time(), "members": len(parts),
            "files": files}


def commit(staging: Path, step: int, reports: Sequence[bytes]) -> Path:
    """The leader, on a local run folder: merge the members' reports (``merge_reports``),
    write the commit record into ``staging`` and rename it into place; returns the
    checkpoint's folder.

    Raises:
        OSError: A member could not write its part (nothing is committed then).
    """
    record = merge_reports(staging, step, reports)
    atomic_write_bytes(staging / COMMIT, json.dumps(record).encode())
    final = staging.parent / folder_name(step)
    if final.exists():  # the same step's checkpoint of an earlier generation: replaced
        shutil.rmtree(final)
    os.replace(staging, final)
    _sync_dir(staging.parent)
    return final


def file_entry(data: bytes) -> dict:
    """A file's entry in a commit record: its size and SHA-256."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_dcp(path: Path, keep: Callable[[str], bool] | None = None) -> dict:
    """Load the DCP checkpoint folder ``path`` as ``capture_state``'s dict, after checking its
    commit record and its files' sizes and checksums.

    Args:
        path: The checkpoint's folder.
        keep: Which of its keys to load, by DCP's flattened name (``model.<name>``,
            ``optimizer.state.<index>.exp_avg``, ...); None: all of them. A member that will
            own some tensors' optimizer state loads only theirs (``OptimizerShards``).

    Raises:
        CorruptCheckpoint: No commit record, a file missing or damaged, or DCP cannot load it.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    try:
        record = json.loads((path / COMMIT).read_bytes())
        files = record["files"]
        if record.get("format") != COMMIT_FORMAT or not isinstance(files, dict):
            raise ValueError(f"unknown commit record format {record.get('format')}")
    except FileNotFoundError:
        raise CorruptCheckpoint(path, "no commit record: not completely written") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpoint(path, f"bad commit record ({exc})") from None
    for name, entry in files.items():
        try:
            size, digest = _file_digest(path / name)
        except FileNotFoundError:
            raise CorruptCheckpoint(path, f"file {name} is missing") from None
        if size != entry["size"]:
            raise CorruptCheckpoint(path, f"file {name} has {size} of {entry['size']} bytes")
        if digest != entry["sha256"]:
            raise CorruptCheckpoint(path, f"file {name}: checksum mismatch")
    state: dict = {}
    try:
        reader = FileSystemReader(path)
        keys = None if keep is None else {
            k for k in reader.read_metadata().state_dict_metadata if keep(k)}
        _load_state_dict(state, storage_reader=reader,
                         planner=_EmptyStateDictLoadPlanner(keys=keys), no_dist=True)
    except Exception as exc:  # DCP raises many types (CheckpointException, ...): unusable
        first = (str(exc).strip().splitlines() or [""])[0]
        raise CorruptCheckpoint(path, f"DCP cannot load it: {type(exc).__name__}: {first}") \
            from exc
    optimizer = state.get("optimizer", {})
    # DCP names the optimizer's per-tensor state by strings; in the optimizer's order, as an
    # unsharded optimizer creates it
    optimizer["state"] = dict(sorted((int(k), v) for k, v in optimizer.get("state", {}).items()))
    return state


def _file_digest(path: Path) -> tuple[int, str]:
    """A file's size and SHA-256, read in pieces (a member's share may be large)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while piece := f.read(8 << 20):
            digest.update(piece)
            size += len(piece)
    return size, digest.hexdigest()


def list_folders(directory: Path) -> dict[str, int]:
    """The DCP checkpoint folders in ``directory`` (``checkpoints``), by name, with their bytes."""
    found = {}
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return {}
    for entry in entries:
        if _FOLDER_RE.fullmatch(entry.name) and entry.is_dir():
            try:
                found[entry.name] = sum(f.stat().st_size for f in entry.iterdir())
            except FileNotFoundError:  # pruned since the listing began
                continue
    return found


def remove(path: Path) -> None:
    """Delete a checkpoint: a DCP folder or a file."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def drop_stale_staging(directory: Path, step: int) -> None:
    """Delete the staging folders of steps up to ``step`` (never committed: their writers died
    or their generation was abandoned; a later step's may still be being written)."""
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        match = _STAGING_RE.fullmatch(entry.name)
        if match and int(match.group(1)) <= step:
            shutil.rmtree(entry, ignore_errors=True)


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
