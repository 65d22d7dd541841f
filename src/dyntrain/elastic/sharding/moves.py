"""Move re-sharded tensors point to point: each from one holder to exactly its new owner.

A re-sharding (``zero.OptimizerShards.reshard``) or a leaver's hand-over plans which tensor
copies move (``owners.diff_plans``: a source that holds it, a target that newly owns it).
``send_moves`` sends them over the generation's process group with point-to-point sends, one
stream per (source, target) pair: a small header (the pickled skeleton of the tensors'
optimizer state: keys, Python values, small tensors such as Adam's ``step``; the large tensors'
shapes and dtypes) and then every large tensor as raw data, straight from the holder's tensors,
into tensors the receiver allocates for this transfer. Nothing goes to a member that does not
need it, and nothing is copied on either side but by the transport.

Every receive writes into tensors of the transfer itself; they become the receiver's optimizer
state (or parameter) only after every receive of the transfer has completed. A transfer of a
generation that is abandoned midway raises (``comm.Aborted`` or ``comm.CollectiveFailed``)
before anything is installed, its group is severed on close (``comm.Group.close``), and a
late send of a cut-off peer finds neither a socket nor a buffer that anyone reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.collective.transfer import FLAT_MIN_BYTES
from dyntrain.elastic.runs.checkpoint_file import dumps, loads
from dyntrain.elastic.sharding.owners import Move

#: What one moved tensor carries: its optimizer state, and its parameter where asked (level 3).
Payload = tuple[dict, torch.Tensor | None]

# tags of a pair's stream: the header's size, the header, then the raw tensors in order
_SIZE_TAG, _HEADER_TAG, _RAW_TAG = 0, 1, 2


@dataclass
class MoveStats:
    """What this member's re-sharding moved and where its time went (for logs and benchmarks).

    Bytes are tensor data on the wire (headers not counted); seconds are wall time per part.
    """

    state_sent_bytes: int = 0
    state_received_bytes: int = 0
    params_sent_bytes: int = 0
    params_received_bytes: int = 0
    tensors_received: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, part: str, began: float) -> None:
        """Add the time since ``began`` (``time.perf_counter``) to ``part``."""
        self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - began


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _skeleton(items: Sequence[tuple[int, Payload]]) -> tuple[dict, list[torch.Tensor]]:
    """The header of a pair's stream and its raw tensors in order: large tensors become
    ``{"__raw__": index, "shape", "dtype"}``, the rest stays as it is (pickled)."""
    raw: list[torch.Tensor] = []

    def mark(value):
        if isinstance(value, torch.Tensor) and _nbytes(value) >= FLAT_MIN_BYTES:
            raw.append(value.detach().contiguous())
            return {"__raw__": len(raw) - 1, "shape": list(value.shape),
                    "dtype": str(value.dtype).removeprefix("torch.")}
        return value

    header = {t: {"state": {k: mark(v) for k, v in state.items()},
                  "param": None if param is None else mark(param)} for t, (state, param) in items}
    return header, raw


def _allocate(header: dict, device: torch.device) -> tuple[dict, list[torch.Tensor]]:
    """The receiver's side of ``_skeleton``: the payloads with a fresh tensor for every raw
    one (in order), to receive into."""
    raw: list[torch.Tensor] = []

    def place(value):
        if isinstance(value, dict) and "__raw__" in value:
            dtype = getattr(torch, value["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {value['dtype']!r} in a re-sharding")
            raw.append(torch.empty(value["shape"], dtype=dtype, device=device))
            return raw[-1]
        return value

    got = {t: ({k: place(v) for k, v in entry["state"].items()},
               None if entry["param"] is None else place(entry["param"]))
           for t, entry in header.items()}
    return got, raw


def send_moves(group: Group, members: Sequence[str], moves: Iterable[Move], me: str,
               payload_of: Callable[[int], Payload], should_abort: Callable[[], bool],
               stats: MoveStats | None = None) -> dict[int, Payload]:
    """Send every move whose source is ``me`` to its target, and receive the moves whose
    target is ``me``; every member of ``group`` calls it with the same ``moves``.

    Args:
        group: The generation's group; ``members`` are its members in rank order.
        members: The members' ids, in rank order.
        moves: The copies to send (``Move.source`` and ``Move.target`` among ``members``; a
            move without a source is left out).
        me: This member's id.
        payload_of: What tensor ``t`` carries (its state, and its parameter or None), read on
            its sources only.
        should_abort: Asked while waiting; True gives the transfer up (``comm.Aborted``).
        stats: Where to count the bytes sent and received.

    Returns:
        The received payloads by tensor, in tensors of their own (empty on a member that
        receives nothing).
    """
    stats = stats if stats is not None else MoveStats()
    pairs: dict[tuple[str, str], list[int]] = {}
    for m in moves:
        if m.source is not None:  # (a copy no holder can send comes from a checkpoint)
            pairs.setdefault((m.source, m.target), []).append(m.tensor)
    if group.pg is None or not pairs:
        return {}
    rank = {m: i for i, m in enumerate(members)}
    works = []
    for (source, target), tensors in pairs.items():
        if source != me:
            continue
        header, raw = _skeleton([(t, payload_of(t)) for t in sorted(set(tensors))])
        data = torch.frombuffer(bytearray(dumps(header)), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        peer = rank[target]
        works += [group.send_async(size.to(group.device), peer, _SIZE_TAG),
                  group.send_async(data.to(group.device), peer, _HEADER_TAG)]
        for index, tensor in enumerate(raw):
            works.append(group.send_async(tensor.to(group.device), peer, _RAW_TAG + index))
        _count(stats, header, raw, sent=True)
    incoming = [(rank[source], torch.empty(1, dtype=torch.int64, device=group.device))
                for (source, target) in pairs if target == me]
    sizes = [group.recv_async(size, peer, _SIZE_TAG) for peer, size in incoming]
    got: dict[int, Payload] = {}
    for work, (peer, size) in zip(sizes, incoming, strict=True):
        group.wait_all([work], should_abort)
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=group.device)
        group.wait_all([group.recv_async(data, peer, _HEADER_TAG)], should_abort)
        header = loads(data.cpu().numpy().tobytes())
        payloads, raw = _allocate(header, group.device)
        works += [group.recv_async(tensor, peer, _RAW_TAG + index)
                  for index, tensor in enumerate(raw)]
        _count(stats, header, raw, sent=False)
        got.update(payloads)
    group.wait_all(works, should_abort)
    return got


def _count(stats: MoveStats, header: dict, raw: list[torch.Tensor], sent: bool) -> None:
    """Add the tensor data of a pair's stream (raw and small tensors) to ``stats``."""

    def size(value) -> int:
        if isinstance(value, dict) and "__raw__" in value:
            return _nbytes(raw[value["__raw__"]])
        return _nbytes(value) if isinstance(value, torch.Tensor) else 0

    state = sum(size(v) for e in header.values() for v in e["state"].values())
    params = sum(size(e["param"]) for e in header.values())
    if sent:
        stats.state_sent_bytes += state
        stats.params_sent_bytes += params
    else:
        stats.state_received_bytes += state
        stats.params_received_bytes += params
        stats.tensors_received += len(header)
