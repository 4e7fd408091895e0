"""Loopback-only addresses: what a piwf relay listens on and what ``--remote`` may name.

The relay carries a user's whole client protocol, so it never listens where another machine can
reach it, and the remote client never sends it anywhere but to this machine (the end of an SSH
tunnel). A host is accepted when it is an IP literal in a loopback network (``127.0.0.0/8``,
``::1``) or a name that resolves to loopback addresses only::

    127.0.0.1, ::1, [::1], localhost (-> 127.0.0.1, ::1)      accepted
    0.0.0.0, ::, 192.168.1.5, a name with any other address   NotLoopbackError
"""

from __future__ import annotations

import ipaddress
import socket

#: The SSH tunnel recipe every refusal points at (docs/REMOTE.md).
TUNNEL_HINT = (
    "reach it from another machine through an SSH tunnel: "
    "ssh -L 8765:127.0.0.1:8765 HOST piwf relay --listen 127.0.0.1:8765, "
    "then piwf view --remote ws://127.0.0.1:8765"
)


#: The most characters of a refused ``--listen`` value a refusal repeats.
_SHOWN_CHARS = 100


class NotLoopbackError(ValueError):
    """A host that is not (or does not resolve only to) a loopback address; says why."""


def loopback_addresses(host: str) -> tuple[str, ...]:
    """Return the loopback IP addresses ``host`` names, in resolver order, without repeats.

    ``host`` is an IP literal (IPv6 with or without brackets) or a name resolved with
    :func:`socket.getaddrinfo`. Raises :class:`NotLoopbackError` when it is empty, does not
    resolve, or names any address outside the loopback networks.
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not bare:
        raise NotLoopbackError("no host given")
    try:
        literal = ipaddress.ip_address(bare)
    except ValueError:
        literal = None
    if literal is not None:
        if not literal.is_loopback:
            raise NotLoopbackError(f"{_shown(host)} is not a loopback address")
        return (str(literal),)
    try:
        found = socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise NotLoopbackError(f"{_shown(host)} does not resolve to an address") from None
    addresses: list[str] = []
    for _family, _type, _proto, _name, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if not address.is_loopback:
            raise NotLoopbackError(
                f"{_shown(host)} resolves to {address}, which is not a loopback address"
            )
        if str(address) not in addresses:
            addresses.append(str(address))
    if not addresses:
        raise NotLoopbackError(f"{_shown(host)} does not resolve to an address")
    return tuple(addresses)


def parse_listen_address(text: str) -> tuple[tuple[str, ...], int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6) into its loopback addresses and port.

    PORT is 0 to 65535 (0: the system picks a free port). Raises :class:`NotLoopbackError`
    for a host that is not loopback-only and ``ValueError`` for text that is no HOST:PORT.
    """
    if "@" in text:
        # A user name or password (where a token could sit) is not repeated back.
        raise ValueError(
            "the address carries a user name or password; --listen takes HOST:PORT only,"
            " as in 127.0.0.1:8765"
        )
    shown = repr(text[:_SHOWN_CHARS] + "..." if len(text) > _SHOWN_CHARS else text)
    if "://" in text:
        raise ValueError(f"{shown} is a URL; --listen takes HOST:PORT, as in 127.0.0.1:8765")
    host, colon, port_text = text.rpartition(":")
    if not colon or not host or not port_text.isdigit():
        raise ValueError(f"{shown} is not HOST:PORT (for example 127.0.0.1:8765)")
    if int(port_text) > 65535:
        raise ValueError(f"{shown}: the port is 0 to 65535 (0 picks a free one)")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{shown}: write an IPv6 host in brackets, as in [::1]:8765")
    return loopback_addresses(host), int(port_text)


def _shown(host: str) -> str:
    """``host`` as a refusal may show it: as typed when it is at most :data:`_SHOWN_CHARS`
    printable ASCII characters, else quoted with its escapes and cut."""
    if len(host) <= _SHOWN_CHARS and host.isascii() and host.isprintable():
        return host
    return repr(host[:_SHOWN_CHARS] + "..." if len(host) > _SHOWN_CHARS else host)
