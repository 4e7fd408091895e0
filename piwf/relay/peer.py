"""Which user owns the other end of a loopback TCP connection (Linux ``/proc/net/tcp``).

The server checks ``SO_PEERCRED`` on its Unix socket; TCP has no such option, but on loopback
both ends of a connection are sockets of this machine, listed in ``/proc/net/tcp`` (IPv4) and
``/proc/net/tcp6`` (IPv6) with the uid that owns each. The relay's accepted connection has
``local = relay address, remote = peer address``; the peer's own socket is the row with those
swapped, and its uid column is the peer's user::

    sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  ...
     3: 0100007F:A2F4 0100007F:223D 01 00000000:00000000 00:00000000 00000000  1000  ...
        └ peer 127.0.0.1:41716      └ relay 127.0.0.1:8765 (ESTABLISHED)         └ peer's uid

Addresses are the kernel's in-memory words printed as hex in host byte order (each 32-bit word
of an IPv6 address likewise); ports are plain hex. A connection that is not found (not Linux,
no ``/proc``, already gone) has no known owner, and the relay refuses it.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Final

#: Where the kernel lists TCP sockets (overridable for tests that feed a table).
TCP_TABLES: Final = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_ESTABLISHED: Final = "01"

Endpoint = tuple[str, int]


def peer_uid(peer: Endpoint, relay: Endpoint, tables: Iterable[Path] = TCP_TABLES) -> int | None:
    """Return the uid that owns the socket at ``peer`` connected to ``relay``, or None.

    ``peer`` and ``relay`` are ``(ip, port)`` as the relay's accepted socket reports them
    (``getpeername`` and ``getsockname``; IPv6 scope ids are ignored). None when no established
    row matches (the caller treats an unknown owner as a stranger).
    """
    want = (_normal(peer), _normal(relay))
    for table in tables:
        try:
            lines = table.read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != _ESTABLISHED:
                continue
            try:
                row = (_endpoint(fields[1]), _endpoint(fields[2]))
            except ValueError:
                continue
            if row == want:
                return int(fields[7])
    return None


def _normal(endpoint: Endpoint) -> Endpoint:
    host, port = endpoint[0], endpoint[1]
    return str(ipaddress.ip_address(host.partition("%")[0])), int(port)


def _endpoint(text: str) -> Endpoint:
    """``0100007F:A2F4`` -> ``("127.0.0.1", 41716)``; the address's words are host-order."""
    address, _, port = text.partition(":")
    if len(address) not in (8, 32):
        raise ValueError("not an address of /proc/net/tcp")
    raw = b"".join(
        struct.pack("=I", int(address[i : i + 8], 16)) for i in range(0, len(address), 8)
    )
    return str(ipaddress.ip_address(raw)), int(port, 16)
