"""A gang's main node when its workers may run on several hosts (the Ray executor).

A torchrun gang's workers meet at ``MASTER_ADDR:MASTER_PORT``, where rank 0 listens, and a
multi-node job's nodes are told ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS``. The service
cannot know that address before the gang is placed, so it names the gang's first worker
(``WorkerSpec.main_worker``) and each worker's actor asks that worker's actor, once both are
placed, for its node's address and a port free there; ``main_node_env`` then puts them into the
variables the engine set. A plain DDP script's gloo binds the address its hostname resolves to
(127.0.1.1 on stock cloud images: peers on other hosts cannot connect, and nothing says why),
so a worker of such a gang is also given ``GLOO_SOCKET_IFNAME``, the interface of its route to
the main node, unless the job sets it. Light to import: Ray imports it on every node.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from dyntrain.elastic.worker.address import interface_of, route_address
from dyntrain.errors import DyntrainError

#: the variables that hold the main node's address, and the one that holds its port
ADDRESS_VARS = ("MASTER_ADDR", "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
PORT_VAR = "MASTER_PORT"
IFNAME_VAR = "GLOO_SOCKET_IFNAME"


def free_port() -> int:
    """A TCP port free on every address of this host now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def main_node_env(env: Mapping[str, str], address: str, port: int,
                  iface: str | None) -> dict[str, str]:
    """The variables of ``env`` to replace for a gang whose main node is ``address`` (rank 0
    listening on ``port``), reached from this host through interface ``iface``. Only the
    variables the engine set are replaced. A torchrun gang's worker is also a node of its own
    (``LOCAL_RANK`` 0 of ``LOCAL_WORLD_SIZE`` 1, ``GROUP_RANK`` its rank) and gets
    ``GLOO_SOCKET_IFNAME`` unless its job set it."""
    out = {name: address for name in ADDRESS_VARS if name in env}
    if PORT_VAR in env:
        out[PORT_VAR] = str(port)
        # each worker is a node of its own: its actor sees only its own devices, so that
        # ``cuda:LOCAL_RANK`` is its device
        out.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=env.get("RANK", "0"),
                   GROUP_WORLD_SIZE=env.get("WORLD_SIZE", "1"))
        if iface and IFNAME_VAR not in env:
            out[IFNAME_VAR] = iface
    return out


def local_interface(address: str, port: int) -> str | None:
    """The interface this host reaches ``address``:``port`` through (None: no route, or no
    interface holds the route's source address)."""
    try:
        return interface_of(route_address(address, port))
    except DyntrainError:  # no route: the script's own connection attempt will say so
        return None
