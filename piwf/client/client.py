"""The Python client of the piwf server (synchronous, thread-safe, auto-starting).

::

    from piwf.client import Client

    with Client() as client:                          # $PIWF_HOME, starts a server if needed
        run = client.start_run("flows/release.py", input={"targets": ["a"]})
        final = client.wait_run(run.run_id, timeout_s=600)

One :class:`Client` holds at most one connection to the server's Unix socket (or, with
``remote``, to a piwf relay's loopback WebSocket: docs/REMOTE.md), opened on first use. The
server greets every connection with a ``hello``; the client refuses a server of another
package version. Requests may be in flight from several threads at once: a reader thread matches
each response to its request by ``requestId``, whatever order the server answers in.

Retries (the receipt rule of docs/PROTOCOL.md §6)::

    attempt 1:  requestId=r1  idempotencyKey=K  ──► connection lost before the response
                (reconnect after a jittered wait: 0.1 s · 2^n, at most 2 s per wait)
    attempt 2:  requestId=r2  idempotencyKey=K  ──► "adopted" (or "accepted" if r1 never arrived)

A durable operation always travels with an idempotency key (generated once per call unless the
caller gives one) and every attempt of that call reuses it with a fresh request id, so the
server applies the command at most once. Reads carry no key and are simply sent again. Retrying
stops after ``retry_timeout_s`` seconds; then :class:`~piwf.errors.ServerUnavailableError` says
that the outcome of a durable command is unknown.

Outcomes other than ``accepted``/``adopted`` raise the :class:`~piwf.errors.CommandError` of the
outcome (see :data:`OUTCOME_ERRORS`), or the finer class of its error code when there is one
(:data:`CODE_ERRORS`: ``stateFull`` is a :class:`~piwf.errors.StateFullCommandError`, an
:class:`~piwf.errors.UnavailableError`), carrying the server's error code and message.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from piwf.client.arguments import (
    flag_argument,
    invalid_argument_error,
    opaque_id_argument,
    path_argument,
    request_arguments,
    request_key,
    timeout_argument,
)
from piwf.client.calls import outcome_unknown, parse_receipt
from piwf.client.channels import ChannelMethods
from piwf.client.connection import ServerConnection
from piwf.client.connectors import UnixSocketConnector
from piwf.client.control import RunControlMethods
from piwf.client.database import StateMethods
from piwf.client.interactions import InteractionMethods
from piwf.client.logs import RunLogMethods
from piwf.client.resources import ResourceMethods
from piwf.client.runs import RunReadMethods
from piwf.client.session_capture import CaptureMethods
from piwf.client.sessions import SessionMethods
from piwf.client.settings import SettingsMethods
from piwf.client.sockets import SilentServerError, TransportError
from piwf.client.transport import Connector
from piwf.client.workflows import WorkflowMethods
from piwf.config import DEFAULT_START_TIMEOUT_S, MAX_FRAME_BYTES, ServerPaths, state_home
from piwf.errors import (
    BackupFailedError,
    ClaimLostCommandError,
    ClientClosedError,
    CommandError,
    ConflictError,
    InternalServerError,
    InvalidArgumentError,
    NotFoundError,
    RejectedError,
    RequestTooLargeError,
    ServerError,
    ServerNotRunningError,
    ServerUnavailableError,
    SessionAuthorityCommandError,
    StateCorruptCommandError,
    StateFullCommandError,
    StateIoCommandError,
    SubmissionRejectedCommandError,
    UnavailableError,
    ValidationPendingCommandError,
)
from piwf.protocol import (
    FrameTooLargeError,
    Hello,
    Operation,
    Request,
    Response,
    encode_message,
)
from piwf.protocol.operations import REVISION_OPERATIONS, RUN_OPERATIONS
from piwf.protocol.payloads import (
    EmptyPayload,
    ServerStatus,
    StopReceipt,
    WireModel,
)

DEFAULT_CONNECT_TIMEOUT_S: Final = 2.0
DEFAULT_REQUEST_TIMEOUT_S: Final = 60.0
DEFAULT_RETRY_TIMEOUT_S: Final = 10.0
#: Backoff between attempts: full jitter over 0.1 s · 2^(attempt-1), each wait at most 2 s.
RETRY_BASE_S: Final = 0.1
RETRY_MAX_WAIT_S: Final = 2.0
RETRY_MAX_ATTEMPTS: Final = 20
#: How long ``stop_server`` waits for the server to close the connection after acknowledging.
DEFAULT_STOP_WAIT_S: Final = 10.0


#: The error raised for each non-success outcome.
OUTCOME_ERRORS: Mapping[str, type[CommandError]] = {
    "rejected": RejectedError,
    "conflict": ConflictError,
    "notFound": NotFoundError,
    "unavailable": UnavailableError,
    "claimLost": ClaimLostCommandError,
}

#: Finer errors by wire code; used only when the class fits the outcome (a subclass of it).
CODE_ERRORS: Mapping[str, type[CommandError]] = {
    error.code: error
    for error in (
        BackupFailedError,
        InternalServerError,
        SessionAuthorityCommandError,
        SubmissionRejectedCommandError,
        ValidationPendingCommandError,
        StateFullCommandError,
        StateIoCommandError,
        StateCorruptCommandError,
    )
}

_Receipt = TypeVar("_Receipt", bound=BaseModel)
_T = TypeVar("_T")


class Client(
    RunControlMethods,
    RunReadMethods,
    ChannelMethods,
    RunLogMethods,
    InteractionMethods,
    ResourceMethods,
    SessionMethods,
    CaptureMethods,
    WorkflowMethods,
    SettingsMethods,
    StateMethods,
):
    """A connection to the piwf server of one state home.

    ``home`` (a ``str`` or ``os.PathLike``; relative: against the current directory) defaults
    to :func:`piwf.config.state_home` (``PIWF_HOME``). With ``autostart``
    (the default) a missing server is started with
    :func:`piwf.client.launcher.ensure_server`; without it, :class:`ServerNotRunningError` is
    raised when nothing listens. ``client_id`` names this client in the server's receipts
    (default: a fresh ``py-<uuid>``); a retry must come from the same client id to adopt its
    receipt. Timeouts are in seconds: ``connect_timeout_s`` bounds
    connecting and reading the hello, ``request_timeout_s`` one response (a ``run.wait`` gets its
    wait on top), ``retry_timeout_s`` the retrying of one call (0: no retry; the time the server
    holds a ``run.wait`` does not count), ``start_timeout_s``
    a server start; each is a number of seconds above 0 (one beyond a year, the most a wait
    takes, waits a year), else the constructor raises
    :class:`~piwf.errors.InvalidArgumentError` naming it, as it does for a malformed
    ``client_id``, an ``autostart`` that is not a ``bool`` or a ``remote`` that is no loopback
    ``ws://`` URL. Constructing a client opens nothing (a ``remote``'s host name is looked up,
    to check it is loopback); the first request connects. With ``remote``
    (``ws://127.0.0.1:PORT``, a loopback URL: :func:`~piwf.client.websocket.check_remote_url`)
    the client talks to that piwf relay's server instead of ``home``'s and never starts one.

    Use it as a context manager or call :meth:`close`; a closed client reconnects on next use.
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        *,
        client_id: str | None = None,
        autostart: bool = True,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        remote: str | None = None,
    ) -> None:
        self.home = state_home().absolute() if home is None else path_argument("home", home)
        self.client_id = (
            f"py-{uuid.uuid4().hex}"
            if client_id is None
            else opaque_id_argument("client_id", client_id)
        )
        self.connect_timeout_s = timeout_argument("connect_timeout_s", connect_timeout_s)
        self.request_timeout_s = timeout_argument("request_timeout_s", request_timeout_s)
        self.retry_timeout_s = timeout_argument(
            "retry_timeout_s", retry_timeout_s, zero_allowed=True
        )
        self.start_timeout_s = timeout_argument("start_timeout_s", start_timeout_s)
        self.autostart = flag_argument("autostart", autostart) and remote is None
        #: The relay URL this client talks through, or None for this home's own socket.
        self.remote = remote
        self._connector: Connector
        if remote is None:
            self._connector = UnixSocketConnector(self.home, self.start_timeout_s)
        else:
            from piwf.client.websocket import RemoteConnector  # only a remote client needs it

            try:
                self._connector = RemoteConnector(remote)
            except InvalidArgumentError as error:
                raise InvalidArgumentError(f"invalid argument: remote: {error}") from None
        self._lock = threading.Lock()
        self._connection: ServerConnection | None = None
        #: How often :meth:`close` ran: a call that sees it change while it waits ends.
        self._closes = 0

    @property
    def socket_path(self) -> Path:
        """The server socket this client connects to."""
        return ServerPaths(self.home).socket

    @property
    def hello(self) -> Hello | None:
        """The current connection's hello (server epoch, version), or None when not connected."""
        connection = self._connection
        return connection.hello if connection is not None else None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> Hello:
        """Connect now (starting a server if allowed) and return the server's hello.

        Raises :class:`ServerNotRunningError`, :class:`IncompatibleServerError`,
        :class:`~piwf.errors.ServerStartError` or, when retrying runs out,
        :class:`~piwf.errors.ServerUnavailableError`.
        """
        return self._connected().hello

    def close(self) -> None:
        """Close the connection, if any. A call still waiting on it (in another thread) raises
        :class:`~piwf.errors.ClientClosedError` rather than being sent again; a call made
        afterwards connects again."""
        with self._lock:
            connection, self._connection = self._connection, None
            self._closes += 1
        if connection is not None:
            connection.close()

    def request(
        self,
        operation: Operation,
        payload: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        expected_revision: int | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        """Send one operation and return its successful (``accepted``/``adopted``) response.

        ``operation`` is an operation name of docs/PROTOCOL.md and ``payload`` a mapping (None:
        ``{}``). A durable operation gets a fresh idempotency key unless ``idempotency_key`` is
        given; a read must not be given one. Each attempt uses a new request id; lost
        connections are retried as the module docstring describes. ``timeout_s`` bounds the wait
        for one response (default ``request_timeout_s``). The receipt is the server's as sent:
        large values in it are content references (``outputRef`` and the like), which
        :meth:`read_content` reads; the typed methods resolve them.

        Raises the :data:`OUTCOME_ERRORS` class of a non-success outcome (with the server's
        ``error_code`` and message), :class:`~piwf.errors.ServerUnavailableError` (or a subclass)
        when no server could be reached in time, :class:`~piwf.errors.ServerStartError`, and,
        before anything connects, :class:`~piwf.errors.InvalidArgumentError` (a ``ValueError``)
        naming an operation, payload, id, key, revision or timeout it cannot take, or its
        :class:`~piwf.errors.RequestTooLargeError` when the request does not fit in a frame.
        """
        request_arguments(operation, payload)
        return self._request(
            operation,
            payload,
            run_id=run_id,
            expected_revision=expected_revision,
            idempotency_key=idempotency_key,
            timeout_s=timeout_s,
            autostart=self.autostart,
        )

    def _request(
        self,
        operation: Operation,
        payload: Mapping[str, Any] | None,
        *,
        run_id: str | None,
        expected_revision: int | None,
        idempotency_key: str | None,
        timeout_s: float | None,
        autostart: bool,
        payload_at_send: Callable[[], Mapping[str, Any]] | None = None,
        held_s: float = 0.0,
    ) -> Response:
        """Send ``operation`` until it is answered (see :meth:`request`).

        ``payload_at_send`` (reads only) makes each attempt's payload anew once its connection
        is open, for a payload that depends on the time left (``run.wait``'s wait, see
        :meth:`wait_run`); an attempt after a reconnect then asks only for what is left.
        ``held_s``: how long the server was asked to hold the answer (that wait); that much of
        an attempt does not count toward ``retry_timeout_s`` (see :meth:`_retrying`).
        """
        idempotency_key = request_key(operation, idempotency_key)
        assert idempotency_key is None or not payload_at_send, "a command sends one payload"
        wait_s = self.request_timeout_s
        if timeout_s is not None:
            wait_s = timeout_argument("timeout_s", timeout_s)
        # Checked once, before anything connects: the ids (InvalidArgumentError) and the size.
        if run_id is None and operation in RUN_OPERATIONS:
            opaque_id_argument("run_id", run_id)
        first = self._envelope(operation, payload, run_id, expected_revision, idempotency_key)
        try:
            first_frame = encode_message(first)
        except FrameTooLargeError:
            raise RequestTooLargeError(
                f"invalid argument: payload: the {operation} request is larger than the "
                f"{MAX_FRAME_BYTES:,} bytes (1 MiB) of JSON one request carries; nothing was "
                "sent. Send large values as files the workflow reads instead"
            ) from None
        # The first attempt sends the frame checked above, unless its payload is made at send.
        unsent = [(first.request_id, first_frame)] if payload_at_send is None else []
        closes = self._closes

        def attempt() -> Response:
            if self._closes != closes:
                unknown = outcome_unknown(idempotency_key, self.client_id)
                raise ClientClosedError(f"the client was closed during {operation}{unknown}")
            connection = self._current_connection(autostart)
            if unsent:
                request_id, frame = unsent.pop()
            else:
                changes: dict[str, Any] = {"request_id": f"req-{uuid.uuid4().hex}"}
                if payload_at_send is not None:
                    changes["payload"] = dict(payload_at_send())
                request = first.model_copy(update=changes)
                request_id, frame = request.request_id, encode_message(request)
            return self._send(connection, request_id, frame, wait_s)

        response = self._retrying(operation, attempt, idempotency_key, held_s=held_s)
        error_type = OUTCOME_ERRORS.get(response.outcome)
        if error_type is not None:
            error = response.error
            message = error.message if error else f"{operation} was answered {response.outcome}"
            finer = CODE_ERRORS.get(error.code) if error else None
            if finer is not None and issubclass(finer, error_type):
                error_type = finer
            raise error_type(message, error_code=error.code if error else None)
        return response

    # -- typed operations -------------------------------------------------------------------

    def server_status(self) -> ServerStatus:
        """Return the server's privacy-safe status counts (``server.status``)."""
        return self._call("server.status", EmptyPayload(), ServerStatus)

    def stop_server(self, *, wait_s: float = DEFAULT_STOP_WAIT_S) -> StopReceipt:
        """Ask the server to stop, wait until it closes the connection, then close the client.

        Never starts a server. Raises :class:`ServerNotRunningError` when none is running. A
        server that answers ``unavailable`` is already stopping and is waited for. If
        the connection is lost after the request was sent and no server answers afterwards,
        the server is gone, which is what was asked: ``StopReceipt(stopping=True)`` is returned.
        Raises :class:`~piwf.errors.ServerError` when the server acknowledged but still holds
        the connection after ``wait_s`` seconds (a number, 0 or more; anything else is an
        :class:`~piwf.errors.InvalidArgumentError` before anything is sent).
        """
        wait_s = timeout_argument("wait_s", wait_s, zero_allowed=True)
        try:
            self._retrying("connect", lambda: self._current_connection(autostart=False))
            try:
                response = self._request(
                    "server.stop",
                    {},
                    run_id=None,
                    expected_revision=None,
                    idempotency_key=None,
                    timeout_s=None,
                    autostart=False,
                )
            except ServerNotRunningError:
                return StopReceipt(stopping=True)
            except UnavailableError:
                # Another caller already asked it to stop; wait for the same end.
                receipt = StopReceipt(stopping=True)
            else:
                receipt = parse_receipt(StopReceipt, response)
            connection = self._connection
            if connection is not None and not connection.wait_closed(wait_s):
                raise ServerError(
                    f"the piwf server acknowledged stop but did not close within {wait_s:g} s"
                )
            return receipt
        finally:
            self.close()

    # -- internals --------------------------------------------------------------------------

    def _call(
        self,
        operation: Operation,
        payload: WireModel | Callable[[], WireModel],
        receipt_type: type[_Receipt],
        *,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
        held_s: float = 0.0,
    ) -> _Receipt:
        """Send ``payload`` and validate the receipt; a callable ``payload`` (reads only) is
        called again for each attempt, once its connection is open, and ``held_s`` is the
        server's wait (see :meth:`_request`)."""
        payload_at_send: Callable[[], dict[str, Any]] | None = None
        if callable(payload):
            make_payload = payload

            def payload_at_send() -> dict[str, Any]:
                return make_payload().to_wire()

            payload = make_payload()
        response = self._request(
            operation,
            payload.to_wire(),
            run_id=run_id,
            expected_revision=None,
            idempotency_key=idempotency_key,
            timeout_s=timeout_s,
            autostart=self.autostart,
            payload_at_send=payload_at_send,
            held_s=held_s,
        )
        return parse_receipt(receipt_type, response)

    def _retrying(
        self,
        what: str,
        attempt: Callable[[], _T],
        idempotency_key: str | None = None,
        *,
        held_s: float = 0.0,
    ) -> _T:
        """Run ``attempt`` until it returns, retrying transport errors with jittered backoff.

        The first attempt counts toward ``retry_timeout_s`` except for its first ``held_s``
        seconds, the wait the server was asked to hold the answer for: a ``run.wait`` whose
        server dies 20 s into a 30 s wait is still sent again (unless ``retry_timeout_s`` is 0),
        while a response that never comes is not retried past ``retry_timeout_s``.
        When retrying runs out, raise ServerUnavailableError; for a durable operation it says
        that the outcome is unknown and names the key under which a later retry adopts it.
        """
        started = time.monotonic()
        try:
            return attempt()
        except TransportError as error:
            failed = [error]
        # tenacity is imported only once an attempt failed. Its loop takes that failure as its
        # own first attempt, and its deadline is what is left of retry_timeout_s, so attempt
        # numbers, waits and the deadline are those of one loop run from the start.
        from tenacity import (
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
            stop_after_delay,
            wait_random_exponential,
        )

        def again() -> _T:
            if failed:
                raise failed.pop()
            return attempt()

        left_s = self.retry_timeout_s - max(time.monotonic() - started - held_s, 0.0)
        retrying = Retrying(
            retry=retry_if_exception_type(TransportError),
            wait=wait_random_exponential(multiplier=RETRY_BASE_S, max=RETRY_MAX_WAIT_S),
            stop=stop_after_delay(left_s) | stop_after_attempt(RETRY_MAX_ATTEMPTS),
            reraise=True,
        )
        try:
            return retrying(again)
        except TransportError as error:
            silent = self._connector.silent_hint() if isinstance(error, SilentServerError) else ""
            raise ServerUnavailableError(
                f"lost {self._connector.where} during {what}: {error}{silent}"
                f"{outcome_unknown(idempotency_key, self.client_id)}"
            ) from None

    def _envelope(
        self,
        operation: Operation,
        payload: Mapping[str, Any] | None,
        run_id: str | None,
        expected_revision: int | None,
        idempotency_key: str | None,
    ) -> Request:
        """The request of a first attempt; :class:`InvalidArgumentError` names a malformed id,
        revision or key, or a revision the operation would not compare."""
        if expected_revision is not None and operation not in REVISION_OPERATIONS:
            raise InvalidArgumentError(
                f"invalid argument: expected_revision: {operation} compares none; leave it out"
                f" (only {', '.join(sorted(REVISION_OPERATIONS))} take one)"
            )
        try:
            return Request(
                request_id=f"req-{uuid.uuid4().hex}",
                client_id=self.client_id,
                operation=operation,
                idempotency_key=idempotency_key,
                run_id=run_id,
                expected_revision=expected_revision,
                payload=dict(payload or {}),
            )
        except ValidationError as error:
            raise invalid_argument_error(error) from None

    def _send(
        self, connection: ServerConnection, request_id: str, frame: bytes, timeout_s: float
    ) -> Response:
        try:
            return connection.call(request_id, frame, timeout_s)
        except TransportError:
            with self._lock:
                if self._connection is connection:
                    self._connection = None
            connection.close()
            raise

    def _connected(self) -> ServerConnection:
        """The open connection, opened (a server started when ``autostart``) with the retries
        of every call."""
        return self._retrying("connect", lambda: self._current_connection(self.autostart))

    def _current_connection(self, autostart: bool) -> ServerConnection:
        with self._lock:
            if self._connection is not None and not self._connection.broken:
                return self._connection
            stale, self._connection = self._connection, None
            if stale is not None:
                stale.close()
            self._connection = self._open_connection(autostart)
            return self._connection

    def _open_connection(self, autostart: bool) -> ServerConnection:
        transport = self._connector.connect(autostart=autostart, timeout_s=self.connect_timeout_s)
        return ServerConnection.open(transport, self.connect_timeout_s, self.request_timeout_s)
