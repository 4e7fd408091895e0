"""The client socket: bound inside the 0700 server directory, mode 0600, peer uid checked.

Binding happens with ``umask(0o177)`` inside a directory only this user can enter, so the socket
is never observable wider than ``0600``. A leftover socket of a dead server is replaced; a live
one (it accepts a connection) is never unlinked. Paths longer than the kernel's ``sun_path``
limit are refused before anything is created, because Linux would otherwise bind elsewhere.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from pathlib import Path

from piwf.config import FILE_MODE, MAX_SOCKET_PATH_BYTES
from piwf.errors import ServerRunningError, ServerStartError

_PEERCRED = struct.Struct("3i")


def check_socket_path(path: Path) -> None:
    """Raise :class:`ServerStartError` when ``path`` does not fit in ``sun_path``."""
    length = len(os.fsencode(path))
    if length > MAX_SOCKET_PATH_BYTES:
        raise ServerStartError(
            f"the socket path is {length} bytes, over the OS limit of {MAX_SOCKET_PATH_BYTES};"
            " set PIWF_HOME to a shorter directory"
        )


def bind_listener(path: Path, backlog: int = 128) -> socket.socket:
    """Return a non-blocking listening socket at ``path``, replacing a stale one."""
    check_socket_path(path)
    _remove_stale_socket(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        previous = os.umask(0o177)
        try:
            listener.bind(str(path))
        finally:
            os.umask(previous)
        path.chmod(FILE_MODE)
        listener.listen(backlog)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener


def peer_credentials(connection: socket.socket) -> tuple[int, int, int]:
    """Return ``(pid, uid, gid)`` of the peer as they were at ``connect()``."""
    data = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(data)
    return pid, uid, gid


def _remove_stale_socket(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ServerStartError(f"{path} exists and is not a socket; move it away")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    except OSError as error:
        raise ServerStartError(f"cannot probe the existing socket: {error.strerror}") from None
    finally:
        probe.close()
    raise ServerRunningError("a live piwf server answers on this state home's socket")
