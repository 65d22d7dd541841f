"""Where the service and a Ray cluster reach each other: the cluster's address, checked quickly,
and the address of this host at which the nodes reach job coordinators."""

from __future__ import annotations

import ipaddress
import logging
import socket

from dyntrain.elastic.worker.address import route_address
from dyntrain.errors import DyntrainError
from dyntrain.service.core.executor import ExecutorError


def probe_cluster(address: str, timeout: float) -> None:
    """A one-line error, quickly, when nothing listens at ``HOST:PORT``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", ray://...: Ray itself tells
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as exc:
        raise ExecutorError(f"no Ray cluster at {address} ({exc.strerror or exc}); start one "
                            "with `ray start --head` or pass --ray-address") from None


def driver_node_ip(address: str) -> str | None:
    """The address this host reaches the cluster's GCS at ``HOST:PORT`` from: the node address
    of this host's raylet, which the service's driver attaches to (None: loopback, ``auto``,
    ``ray://``; Ray chooses). Ray alone would attach to any raylet whose process it sees on
    this machine, the head's first: hosts that share a process table (containers) are told
    apart by their addresses."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address or _loopback(host):
        return None
    try:
        return route_address(host, int(port))
    except DyntrainError:
        return None


def connect(ray, address: str, namespace: str) -> None:
    """``ray.init`` this process as a driver in ``namespace``, attached to the raylet of this
    host's own address (``driver_node_ip``), or, when no node has that address (a raylet
    started with another one), to the one Ray finds."""
    local = driver_node_ip(address)
    for node_ip in dict.fromkeys([local, None]):
        try:
            ray.init(address=address, namespace=namespace, log_to_driver=False,
                     logging_level=logging.WARNING,
                     **({} if node_ip is None else {"_node_ip_address": node_ip}))
            return
        except RuntimeError as exc:
            if node_ip is not None and "No node info found" in str(exc):
                continue
            error: Exception = exc
        except Exception as exc:  # ConnectionError, ValueError ...
            error = exc
        raise ExecutorError(f"cannot connect to the Ray cluster at {address}: "
                            f"{str(error).splitlines()[0][:200]}") from None


def coordinator_address(node_ip: str, gcs_address: str) -> str:
    """Where this host's job coordinators are reached: the address Ray gave this host's node,
    unless that is a loopback address (a head started without ``--node-ip-address`` on a machine
    whose hostname resolves to 127.0.1.1) while the GCS is not: then the address this host
    reaches the GCS from."""
    gcs_host, _, port = gcs_address.rpartition(":")
    if not _loopback(node_ip) or _loopback(gcs_host) or not port.isdigit():
        return node_ip
    try:
        return route_address(gcs_host, int(port))
    except DyntrainError:
        return node_ip


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
