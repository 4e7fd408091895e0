"""``piwf relay``: the client protocol over a loopback WebSocket, for SSH tunnels (docs/REMOTE.md).

The relay is a client of the server like the CLI: every WebSocket it accepts gets exactly one
connection to the server's Unix socket, the two coupled one to one (either closing closes the
other), each client-protocol frame carried as one binary message. It opens no database, parses
no message and never multiplexes. The ``websockets`` package is the ``piwf[relay]`` extra; only
this package and :mod:`piwf.client.websocket` import it.

Modules: :mod:`.server` (listening, admission, signals), :mod:`.bridge` (one coupled pair),
:mod:`.peer` (the uid owning a loopback peer, from ``/proc/net/tcp``).
"""
