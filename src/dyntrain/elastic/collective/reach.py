"""Can the members of a generation reach each other? Checked before their group forms.

Every worker listens on a small probe port at the address it advertises (``ProbeListener``; its
``address:port`` goes to the coordinator with the hello and comes back in each generation).
Before a generation's process group is created, each member connects to every peer's probe
(``probe_peers``): a refused or timed-out connection names the peer, the address it advertised
and the error, so that the coordinator can remove the member its peers cannot reach
(``unreachable_members``) with a message that says why, instead of re-forming a group that cannot
form. A probe costs one connection per peer, made in parallel, in a millisecond or two.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from dyntrain.elastic.protocol import Unreachable

#: seconds a probe waits for a peer's answer (a live host answers a connect from its kernel,
#: even while the process is busy or stopped)
PROBE_TIMEOUT = 5.0


class ProbeListener:
    """Accepts (and closes) probe connections on ``address``, port chosen by the system.

    Args:
        address: the address this worker advertises; it must be one of this host's.
    """

    def __init__(self, address: str) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((address, 0))
        self._sock.listen(64)
        self.address, self.port = address, self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True, name="dyntrain-probe")
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            conn.close()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self._sock.close()
        self._thread.join(5.0)


def probe_peers(peers: dict[str, str], timeout: float = PROBE_TIMEOUT) -> list[Unreachable]:
    """Connect to each peer's probe endpoint (worker -> "host:port") at once; the failures."""
    if not peers:
        return []

    def attempt(item: tuple[str, str]) -> Unreachable | None:
        worker, endpoint = item
        host, _, port = endpoint.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
            return None
        except OSError as exc:
            why = exc.strerror or ("timed out" if isinstance(exc, TimeoutError) else str(exc))
            return Unreachable(worker, endpoint, why)

    with ThreadPoolExecutor(max_workers=min(16, len(peers))) as pool:
        return [r for r in pool.map(attempt, peers.items()) if r is not None]


def unreachable_members(reports: dict[str, list[dict]], newcomers: Iterable[str] = ()
                        ) -> dict[str, list[str]]:
    """Whom to remove so that the rest reach each other, from who could not reach whom.

    ``reports``: reporter -> its ``Unreachable.to_dict()`` records. The member that the most
    others could not reach goes first (ties: a newcomer before a member that trained, then by
    name), until no reported pair is left with both ends in. Returns each removed member with
    the reports about it ("w0 could not connect to 127.0.1.1:4242: Connection refused")."""
    pairs = {(reporter, r["worker"]): r for reporter, rs in reports.items() for r in rs
             if r["worker"] != reporter}
    fresh, removed = set(newcomers), {}
    while pairs:
        named = Counter(target for _, target in pairs)
        worst = min(named, key=lambda w: (-named[w], w not in fresh, w))
        removed[worst] = [f"{a} could not connect to {r['endpoint']}: {r['error']}"
                          for (a, b), r in sorted(pairs.items()) if b == worst]
        pairs = {k: r for k, r in pairs.items() if worst not in k}
    return removed
