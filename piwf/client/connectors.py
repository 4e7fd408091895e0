"""The default :class:`~piwf.client.transport.Connector`: the state home's own Unix socket.

A :class:`~piwf.client.Client` without ``remote`` connects here: the socket path is checked
(:func:`~piwf.client.sockets.check_socket_path`), and when nothing listens a server is
started (:func:`~piwf.client.launcher.ensure_server`) if the client allows it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from piwf.client.sockets import NotListeningError, TransportError, connect_socket
from piwf.client.transport import SocketTransport
from piwf.config import ServerPaths, socket_path_problem
from piwf.errors import ServerNotRunningError, ServerUnavailableError


class UnixSocketConnector:
    """Connects to ``<home>/server/server.sock``, starting a server when allowed."""

    def __init__(self, home: Path, start_timeout_s: float) -> None:
        self.home = home
        self.socket_path = ServerPaths(home).socket
        self.start_timeout_s = start_timeout_s

    @property
    def where(self) -> str:
        return f"the piwf server at {self.socket_path}"

    def silent_hint(self) -> str:
        """The server's pid, read from its lock file, and the commands for a stopped or a hung
        server; ``""`` when the lock file names none."""
        pid = _lock_holder_pid(ServerPaths(self.home).lock)
        if pid is None:
            return ""
        return (
            f"; it accepts connections but does not answer: if its process (pid {pid}) was"
            f" stopped (kill -STOP, Ctrl-Z), `kill -CONT {pid}` lets it go on; if it hangs,"
            f" `kill {pid}` ends it (runs recover at the next start) and its log is"
            f" {ServerPaths(self.home).log}"
        )

    def connect(self, *, autostart: bool, timeout_s: float) -> SocketTransport:
        """Connect (see :class:`~piwf.client.transport.Connector`); with ``autostart``, a
        missing server is started first. Raises :class:`ServerNotRunningError` when none runs
        and ``autostart`` is off."""
        path = self.socket_path
        problem = socket_path_problem(path)
        if problem is not None:
            raise ServerUnavailableError(problem)
        try:
            sock = connect_socket(path, timeout_s)
        except NotListeningError:
            if not autostart:
                raise ServerNotRunningError(not_running_message(self.home)) from None
            from piwf.client import launcher  # only a start needs it

            launcher.ensure_server(self.home, timeout_s=self.start_timeout_s)
            try:
                sock = connect_socket(path, timeout_s)
            except NotListeningError:
                # Another process's server holds the home but is still starting or stopping.
                raise TransportError("the server is starting or stopping") from None
        return SocketTransport(sock)


def _lock_holder_pid(lock: Path) -> int | None:
    """The pid the server recorded in its lock file (``{"pid": N, ...}``), or None when the
    file cannot be read or names none (a client never takes the lock)."""
    try:
        with open(lock, "rb") as handle:
            record = json.loads(handle.read(4096))
    except (OSError, ValueError):
        return None
    pid = record.get("pid") if isinstance(record, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def not_running_message(home: Path) -> str:
    """What a client that may not start a server says when none listens for ``home``, with
    the two ways to have one."""
    return (
        f"no piwf server is running for {home}; start one with "
        f"`PIWF_HOME={shlex.quote(str(home))} piwf server start`, or construct the Client with "
        "autostart=True to start it on first use"
    )
