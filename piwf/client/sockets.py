"""The server's Unix socket: the path checks that come before connecting, and the connect.

Before connecting, :func:`check_socket_path` makes sure the path is this user's own server
socket: the state home, its ``server`` directory and the socket are each ``lstat``-ed, never
followed, so a symlink planted anywhere on that path cannot lead the client into another home's
live server (which would then receive this client's commands). Nothing here imports the
protocol's models, so ``piwf run list``'s quick read (:mod:`piwf.client.quick_read`) uses it too.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path
from typing import Final

from piwf.errors import ServerError, ServerUnavailableError

_NOT_LISTENING: Final = frozenset({errno.ENOENT, errno.ECONNREFUSED})


class TransportError(Exception):
    """The connection failed before the response arrived; the request may be retried."""


class SilentServerError(TransportError):
    """The connection was accepted but the server sent no hello in time: it may be stopped
    (``kill -STOP``, Ctrl-Z) or hung, or just too busy."""


class NotListeningError(Exception):
    """Nothing accepts connections on the socket path (missing file or refused)."""


class UnsafeSocketError(ServerError):
    """The server socket path is a symlink, not a socket, or not this user's; nothing was sent."""

    code = "unsafeSocket"


def check_socket_path(path: Path) -> None:
    """Check the socket ``<home>/server/server.sock`` before anything connects to it.

    Raises :class:`NotListeningError` when the socket or a directory on the way to it does not
    exist, and :class:`UnsafeSocketError` when the home, the server directory or the socket is
    a symlink or another kind of file, or belongs to another user. Nothing is opened.
    """
    server_dir = path.parent
    for directory in (server_dir.parent, server_dir):
        info = _lstat(directory)
        if stat.S_ISLNK(info.st_mode):
            raise UnsafeSocketError(
                f"{directory} is a symlink; piwf does not follow it to a server socket. Point "
                "PIWF_HOME at the real directory, or remove the symlink"
            )
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafeSocketError(
                f"{directory} is not a directory; move it away, or set PIWF_HOME to another"
                " directory (piwf creates it)"
            )
        _require_own(directory, info)
    info = _lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeSocketError(
            f"{path} is a symlink, not this state home's server socket; piwf does not follow "
            f"it. Remove it (rm {path}) and start the server again: piwf server start"
        )
    if not stat.S_ISSOCK(info.st_mode):
        raise UnsafeSocketError(
            f"{path} is not a socket; move it away, then start the server: piwf server start"
        )
    _require_own(path, info)


def _lstat(path: Path) -> os.stat_result:
    try:
        return path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        raise NotListeningError from None


def _require_own(path: Path, info: os.stat_result) -> None:
    if info.st_uid != os.geteuid():
        raise UnsafeSocketError(
            f"{path} belongs to another user (uid {info.st_uid}); piwf talks only to a server "
            "of its own user. Remove it, or set PIWF_HOME to a home of your own"
        )


def connect_socket(path: Path, timeout_s: float) -> socket.socket:
    """Connect to the server socket at ``path`` (checked first, see :func:`check_socket_path`).

    Raises :class:`NotListeningError` when nothing listens (no socket, or connection refused),
    :class:`UnsafeSocketError` for an unsafe path, :class:`TransportError` on a timeout and
    :class:`~piwf.errors.ServerUnavailableError` for other connection failures.
    """
    check_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(os.fsencode(path))
    except OSError as error:
        sock.close()
        if error.errno in _NOT_LISTENING:
            raise NotListeningError from None
        if isinstance(error, TimeoutError):
            raise TransportError("connecting timed out") from None
        raise ServerUnavailableError(
            f"cannot connect to {path}: {error.strerror or error}"
        ) from None
    return sock
