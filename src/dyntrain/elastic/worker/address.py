"""Which address a worker gives its peers: the one it reaches the coordinator from.

A process group's backend (gloo) binds the address that the machine's hostname resolves to, and
stock cloud images map the hostname to 127.0.1.1: peers on other hosts then cannot connect, and
nothing says why. A worker instead advertises and binds the local address of its route to the
coordinator (a host that reaches the coordinator is reached back on that address), unless it is
told an address (``--advertise-address``) or an interface (``--iface``).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

from dyntrain.errors import DyntrainError

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def route_address(host: str, port: int) -> str:
    """The local address this machine uses to reach ``host``:``port`` (no packet is sent)."""
    try:
        family, kind, proto, _, target = socket.getaddrinfo(
            host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(target)
            return probe.getsockname()[0]
    except OSError as exc:
        raise DyntrainError(f"no route to the coordinator at {host}:{port} "
                            f"({exc.strerror or exc})") from None


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as exc:
            known = ", ".join(n for _, n in socket.if_nameindex())
            raise DyntrainError(f"--iface {name}: no IPv4 address on that interface "
                                f"({exc.strerror}); this host has: {known}") from None
    return socket.inet_ntoa(raw[20:24])


def interface_of(address: str) -> str | None:
    """The name of the interface that holds IPv4 ``address`` (None: none of this host's)."""
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == address:
                return name
        except DyntrainError:
            continue
    return None


def machine_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (interfaces in system order)."""
    found = []
    for _, name in socket.if_nameindex():
        try:
            address = interface_address(name)
        except DyntrainError:
            continue
        if not ipaddress.ip_address(address).is_loopback:
            found.append(address)
    return found


def is_wildcard(host: str) -> bool:
    """True for an address that means every interface (0.0.0.0, ::, empty)."""
    return host in ("", "0.0.0.0", "::", "[::]")


def check_bindable(address: str, what: str) -> str:
    """``address`` if this host can listen on it; else a one-line error naming ``what``."""
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
    except (OSError, UnicodeError) as exc:
        raise DyntrainError(f"{what} {address} is not an address of this host "
                            f"({getattr(exc, 'strerror', None) or exc})") from None
    return address


def advertise_address(coordinator: tuple[str, int], address: str | None = None,
                      iface: str | None = None) -> str:
    """The address a worker binds and gives its peers.

    Args:
        coordinator: (host, port) of the job's coordinator.
        address: given by the user (``--advertise-address``); checked to be this host's.
        iface: an interface whose address to use (``--iface``), when ``address`` is not given.
    """
    if address:
        return check_bindable(address, "--advertise-address")
    if iface:
        return interface_address(iface)
    return route_address(*coordinator)
