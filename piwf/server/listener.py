"""The client socket: bound inside the 0700 server directory, mode 0600, peer uid checked.

Binding happens with ``umask(0o177)`` inside a directory only this user can enter, so the socket
is never observable wider than ``0600``. A leftover socket of a dead server is replaced; a live
one (it accepts a connection) is never unlinked. Paths longer than the kernel's ``sun_path``
limit are refused before anything is created, because Linux would otherwise bind elsewhere.

Accepting can fail for two kinds of reasons (:func:`accept_failure`)::

    peer     the one pending connection went away (ECONNABORTED, EPROTO, EPERM): accept the next
    pause    the process is out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), or
             something unexpected: the listener stays readable, so retrying at once would spin;
             stop watching it for AcceptBackoff's delay (50 ms doubling to 2 s, reset by the
             next successful accept). accept() takes a descriptor before it looks for a
             connection, so with a full table it fails even when nobody waits
             (has_pending_connection tells the two apart: only a waiting client needs a pause).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import selectors
import socket
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal

from piwf.config import FILE_MODE, socket_path_problem
from piwf.errors import ServerRunningError, ServerStartError, TooManyConnectionsError
from piwf.protocol.client_v1 import ErrorInfo, Response, encode_message

log = logging.getLogger("piwf.server")

_PEERCRED = struct.Struct("3i")

#: Errors that concern only the one connection being accepted.
_PEER_ERRORS: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
#: Errors that say the process (or the system) has no room for another descriptor.
EXHAUSTION_ERRORS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

AcceptFailure = Literal["peer", "exhausted", "other"]


def accept_failure(error: OSError) -> AcceptFailure:
    """Classify an ``accept()`` error: ``peer`` (skip it), ``exhausted`` or ``other`` (pause)."""
    if error.errno in _PEER_ERRORS:
        return "peer"
    if error.errno in EXHAUSTION_ERRORS:
        return "exhausted"
    return "other"


def has_pending_connection(listener: socket.socket) -> bool:
    """Whether a connection waits to be accepted (``poll``, which needs no descriptor)."""
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class AcceptBackoff:
    """How long to stop accepting after a failed accept: ``first_s`` doubling to ``max_s``.

    :meth:`failed` returns the next pause and doubles it (unless a descriptor was just freed);
    :meth:`succeeded` starts over. ``failures`` counts the failed accepts since the last success.
    """

    def __init__(self, first_s: float = 0.05, max_s: float = 2.0) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError("the first pause must be positive and at most the longest one")
        self.first_s = first_s
        self.max_s = max_s
        self.failures = 0
        self._next_s = first_s

    def failed(self, *, freed: bool = False) -> float:
        """Record a failed accept and return how long to pause accepting, in seconds.

        With ``freed`` (the caller just closed a descriptor) the pause is ``first_s`` and the
        next one does not grow.
        """
        self.failures += 1
        if freed:
            return self.first_s
        pause = self._next_s
        self._next_s = min(self.max_s, self._next_s * 2)
        return pause

    def succeeded(self) -> None:
        """Record a successful accept: the next failure pauses for ``first_s`` again."""
        self.failures = 0
        self._next_s = self.first_s


def check_socket_path(path: Path) -> None:
    """Raise :class:`ServerStartError` when ``path`` does not fit in ``sun_path``."""
    problem = socket_path_problem(path)
    if problem is not None:
        raise ServerStartError(problem)


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


class Acceptor:
    """Takes connections off the listening socket, pausing instead of spinning when it cannot.

    ``admit`` receives every accepted socket; ``shed`` closes one idle connection to free a
    descriptor and says whether there was one. At most ``per_turn`` accepts are tried for one
    readiness report. ``call_later(delay_s, callback)`` schedules the end of a pause.
    """

    def __init__(
        self,
        listener: socket.socket,
        selector: selectors.BaseSelector,
        call_later: Callable[[float, Callable[[], None]], object],
        *,
        admit: Callable[[socket.socket], None],
        shed: Callable[[], bool],
        per_turn: int,
    ) -> None:
        self.listener = listener
        self.backoff = AcceptBackoff()
        self._selector = selector
        self._call_later = call_later
        self._admit = admit
        self._shed = shed
        self._per_turn = per_turn
        self._watching = False
        self._closed = False
        self._watch()

    def close(self) -> None:
        """Stop accepting for good and close the listening socket."""
        self._closed = True
        self._unwatch()
        self.listener.close()

    def _on_readable(self, _mask: int) -> None:
        for _ in range(self._per_turn):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                failure = accept_failure(error)
                if failure == "peer":
                    continue
                if failure == "exhausted" and not has_pending_connection(self.listener):
                    return  # a full table fails accept() even when nobody waits: nothing to do
                self._pause(error, exhausted=failure == "exhausted")
                return
            if self.backoff.failures:
                log.info(
                    "accepting clients again after %d failed accept(s)",
                    self.backoff.failures,
                    extra={"rate_key": "accept-resumed"},
                )
            self.backoff.succeeded()
            self._admit(sock)

    def _pause(self, error: OSError, *, exhausted: bool) -> None:
        # The listener stays readable while the failure lasts: watching it would wake the loop
        # at once, again and again. Shedding frees a descriptor, so then the pause is short.
        freed = exhausted and self._shed()
        pause_s = self.backoff.failed(freed=freed)
        self._unwatch()
        self._call_later(pause_s, self._watch)
        log.warning(
            "accept failed (%s); not accepting for %.2f s",
            error.strerror or type(error).__name__,
            pause_s,
        )

    def _watch(self) -> None:
        if not self._watching and not self._closed:
            self._selector.register(self.listener, selectors.EVENT_READ, self._on_readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(self.listener)


def refuse_connection(sock: socket.socket, open_connections: int) -> None:
    """Close an accepted ``sock`` that finds every connection busy, saying so first.

    The client gets one ``response`` (requestId ``-``, outcome ``unavailable``, error code
    ``tooManyConnections``) instead of the ``hello``, if it fits into the fresh socket's buffer
    without blocking; otherwise it just sees the connection close.
    """
    error = TooManyConnectionsError(
        f"all {open_connections} connections of the piwf server are busy; retry later, or "
        "close clients you do not need"
    )
    refusal = Response(request_id="-", outcome="unavailable", error=ErrorInfo.of(error))
    try:
        sock.setblocking(False)
        sock.send(encode_message(refusal))
    except OSError:
        pass  # the client learns it from the closed connection instead
    finally:
        sock.close()


def _remove_stale_socket(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ServerStartError(f"{path} exists and is not a socket; move it away")
    if info.st_uid != os.geteuid():
        # Never probe (or unlink) a socket another user placed here: it is not ours to judge.
        raise ServerStartError(f"{path} belongs to another user; move it away")
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
