"""Hand the training state to joiners fast: flat tensors straight over the group, no pickling.

The state dict (``state.capture_state``) is split into a small skeleton and its large tensors.
The skeleton (structure, Python values, small tensors such as RNG states) is serialised and
broadcast from the source member; the large tensors are broadcast as raw tensor data in pieces,
straight from the holders' tensors, the pieces spread over every member that holds the state
(their model and optimizer tensors are bitwise identical, which is the runtime's invariant), so
no single sender carries it all. A receiver gets them into one flat buffer per (part of the
state, dtype) and rebuilds the dict with views into the buffers; loading it into the model and
optimizer is then the only copy, made once every piece has arrived.

Collectives write only into buffers of the hand-over itself, never into live state: a holder
that does not send a piece takes part in its broadcast with a scratch buffer, so a broadcast
of an abandoned generation that completes late cannot overwrite a model that trains on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.runs.checkpoint_file import dumps, loads

# Tensors of at least this many bytes travel as raw data; smaller ones ride in the skeleton.
FLAT_MIN_BYTES = 1 << 16
# Broadcast pieces of at most this many bytes (each from one holder, round-robin).
PIECE_BYTES = 64 << 20


def split_state(state: dict) -> tuple[dict, list[tuple[str, torch.dtype, list[torch.Tensor]]]]:
    """The skeleton of ``state`` (large tensors replaced by ``{"__flat__": [group, index]}``)
    and the large tensors, grouped by (top-level key, dtype) in a fixed order."""
    groups: dict[tuple[str, torch.dtype], list[torch.Tensor]] = {}

    def walk(value, top: str):
        if isinstance(value, torch.Tensor) and value.numel() * value.element_size() >= \
                FLAT_MIN_BYTES:
            key = (top, value.dtype)
            tensors = groups.setdefault(key, [])
            tensors.append(value)
            return {"__flat__": [f"{top}/{_dtype_name(value.dtype)}", len(tensors) - 1],
                    "shape": list(value.shape)}
        if isinstance(value, dict):
            return {k: walk(v, top) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(v, top) for v in value)
        return value

    skeleton = {k: walk(v, k) for k, v in state.items()}
    return skeleton, [(top, dtype, tensors) for (top, dtype), tensors in groups.items()]


def join_state(skeleton: dict, flats: dict[str, torch.Tensor]) -> dict:
    """Rebuild the state dict from its skeleton and the received flat buffers (views)."""
    offsets: dict[str, list[int]] = {}

    def walk(value):
        if isinstance(value, dict) and "__flat__" in value:
            name, index = value["__flat__"]
            start, stop = offsets[name][index], offsets[name][index + 1]
            return flats[name][start:stop].view(value["shape"])
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(v) for v in value)
        return value

    for name, sizes in skeleton["__flat_sizes__"].items():
        offsets[name] = [0, *_cumsum(sizes)]
    return walk({k: v for k, v in skeleton.items() if k != "__flat_sizes__"})


def broadcast_state(group: Group, state: dict | None, root: int, holders: Sequence[int],
                    should_abort: Callable[[], bool]) -> dict:
    """Send ``state`` from the members that hold it to every member of ``group``.

    ``root`` (a holder) sends the skeleton; ``holders`` (ranks, ``root`` among them) all hold
    the state and share the sending of the flat tensor data. Members not in ``holders`` pass
    ``state=None`` and get the state back; holders get their own ``state`` back."""
    if group.size == 1 or group.pg is None:
        assert state is not None
        return state
    holding = group.rank in holders
    payload = None
    groups: list = []
    if holding:
        skeleton, groups = split_state(state)
        skeleton["__flat_sizes__"] = {f"{top}/{_dtype_name(dtype)}": [t.numel() for t in ts]
                                      for top, dtype, ts in groups}
        payload = dumps(skeleton) if group.rank == root else None
    skeleton = loads(group.broadcast_bytes(payload, root, should_abort))
    senders = sorted(holders)
    flats: dict[str, torch.Tensor] = {}
    local = {f"{top}/{_dtype_name(dtype)}": ts for top, dtype, ts in groups}
    piece = 0
    for name, sizes in skeleton["__flat_sizes__"].items():
        dtype = _dtype_of(name.rsplit("/", 1)[1])
        if holding:
            # the tensors themselves, not a concatenated copy (which costs as much as the
            # sending)
            parts = [t.reshape(-1).to(group.device) for t in local[name]]
        else:
            flats[name] = torch.empty(sum(sizes), dtype=dtype, device=group.device)
            parts = list(flats[name].split(sizes))
        step = max(1, PIECE_BYTES // torch.empty(0, dtype=dtype).element_size())
        works = []
        for part in parts:
            for start in range(0, part.numel(), step):
                sender = senders[piece % len(senders)]
                buf = part[start : start + step]
                if holding and sender != group.rank:
                    buf = torch.empty_like(buf)  # it holds these bytes: never receive into them
                works.append(group.broadcast_async(buf, sender))
                piece += 1
        for work in works:
            group.wait(work, should_abort)
    # A sender's broadcasts complete once its bytes are in its socket buffers (megabytes), not
    # in the receivers: a one-element sum ends the hand-over for every member together, so that
    # its time (``state_sync_s``) is the slowest link's on every side.
    group.allreduce_sum(torch.zeros(1, device=group.device), should_abort)
    if holding:
        return state
    return join_state(skeleton, flats)


def state_bytes(state: dict) -> int:
    """Bytes of tensor data in ``state`` (for logs and benchmarks)."""
    total = 0

    def walk(value):
        nonlocal total
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(state)
    return total


def _cumsum(sizes: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for n in sizes:
        acc += n
        out.append(acc)
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a state transfer")
    return dtype

