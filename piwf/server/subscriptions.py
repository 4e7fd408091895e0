"""Subscriptions of client connections: ``view.run.watch``, ``view.runs.watch``, ``view.unwatch``.

A subscription belongs to one connection and ends with it (or with ``view.unwatch``). The
server pushes ``event`` frames on it::

    runView   one run's whole view (piwf.run-view.v1), at a revision newer than the last sent
    runList   the run list page the subscription asked for (newest first, ``status`` filter)

Changes are found by looking, not by hooks in every writer: while any subscription exists a
timer looks every :data:`LOOK_S` (one read: the watched runs' revisions and the newest event's
sequence number), so pushes cost nothing when nobody watches and a burst of changes becomes
one snapshot. A subscriber gets a new snapshot only once its connection has written out
everything before it (the server waits for the drain and coalesces): a slow reader has at most
one snapshot buffered in the server at a time, and always gets the newest state next. Every
push is a snapshot (no patches); a client that reconnects resubscribes with ``fromRevision``
and is sent the view as soon as the run is past it. Reading views creates no receipt and
repairs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from piwf.errors import PiwfError
from piwf.protocol.client_v1 import Event, Request, Response, encode_message
from piwf.protocol.payloads import RunInfo
from piwf.protocol.view_payloads import (
    ViewRunsWatchPayload,
    ViewRunWatchPayload,
    ViewUnwatchPayload,
    WatchReceipt,
)
from piwf.server.connections import ClientConnection
from piwf.server.context import ServerContext
from piwf.server.loop import EventLoop, Reply, Timer
from piwf.server.replies import error_response, not_found, ok, payload_of, run_id_of, run_info
from piwf.server.runs.views import RunViews
from piwf.state import records
from piwf.state.execution import runs as run_store

log = logging.getLogger("piwf.server")

#: How often watched runs are looked at while any subscription exists.
LOOK_S = 0.1
#: Subscriptions one connection may hold.
MAX_SUBSCRIPTIONS_PER_CONNECTION = 32
#: The operations this module answers (the listener hands them over with their connection).
SUBSCRIPTION_OPERATIONS = frozenset({"view.run.watch", "view.runs.watch", "view.unwatch"})


@dataclass(eq=False)
class Subscription:
    """One subscription and what was last sent on it."""

    connection: ClientConnection
    subscription_id: str
    kind: Literal["run", "runs"]
    run_id: str | None = None
    step_limit: int = 50
    limit: int = 50
    status: str | None = None
    #: The run revision (``run``) or newest event sequence (``runs``) last sent; None: none yet.
    sent: int | None = None
    #: A change to send once the connection has drained.
    pending: bool = True


class Subscriptions:
    """Every subscription of the server's connections."""

    def __init__(
        self,
        context: ServerContext,
        loop: EventLoop,
        send: Callable[[ClientConnection, bytes], None],
    ) -> None:
        self.context = context
        self.loop = loop
        self.send = send
        self.views = RunViews(context)
        self.by_connection: dict[int, dict[str, Subscription]] = {}
        self._timer: Timer | None = None

    # -- operations -------------------------------------------------------------------------

    def handle(self, connection: ClientConnection, request: Request, reply: Reply) -> None:
        """Answer one subscription operation of ``connection``."""
        if request.operation == "view.unwatch":
            payload = payload_of(request, ViewUnwatchPayload)
            removed = self.by_connection.get(connection.fd, {}).pop(payload.subscription_id, None)
            receipt = WatchReceipt(subscription_id=payload.subscription_id, active=False)
            reply(ok(request, receipt) if removed is not None else _unknown(request))
            return
        mine = self.by_connection.setdefault(connection.fd, {})
        if request.operation == "view.run.watch":
            watch = payload_of(request, ViewRunWatchPayload)
            run_id = run_id_of(request)
            with self.context.db.read() as tx:
                view = run_store.load_run(tx, run_id)
            if view is None:
                reply(not_found(request, run_id, self.context.home))
                return
            subscription = Subscription(
                connection,
                watch.subscription_id,
                "run",
                run_id=run_id,
                step_limit=watch.step_limit,
                sent=watch.from_revision,
            )
            revision: int | None = view.revision
        else:
            listing = payload_of(request, ViewRunsWatchPayload)
            subscription = Subscription(
                connection,
                listing.subscription_id,
                "runs",
                limit=listing.limit,
                status=listing.status,
            )
            revision = None
        if (
            subscription.subscription_id not in mine
            and len(mine) >= MAX_SUBSCRIPTIONS_PER_CONNECTION
        ):
            reply(
                error_response(
                    request,
                    "rejected",
                    "tooManySubscriptions",
                    f"a connection may hold {MAX_SUBSCRIPTIONS_PER_CONNECTION} subscriptions;"
                    " end one with view.unwatch first",
                )
            )
            return
        mine[subscription.subscription_id] = subscription
        reply(
            ok(
                request,
                WatchReceipt(subscription_id=subscription.subscription_id, revision=revision),
            )
        )
        self._push(subscription)  # the first snapshot follows the answer
        self._keep_looking()

    # -- the listener's hooks ---------------------------------------------------------------

    def drained(self, connection: ClientConnection) -> None:
        """``connection`` wrote out all it had: send what is pending on it."""
        for subscription in list(self.by_connection.get(connection.fd, {}).values()):
            if subscription.pending:
                self._push(subscription)

    def closed(self, connection: ClientConnection) -> None:
        """``connection`` closed: its subscriptions end."""
        self.by_connection.pop(connection.fd, None)

    # -- looking and pushing ----------------------------------------------------------------

    def _keep_looking(self) -> None:
        if self._timer is None and any(self.by_connection.values()):
            self._timer = self.loop.call_later(LOOK_S, self._look)

    def _look(self) -> None:
        self._timer = None
        subscriptions = [s for mine in self.by_connection.values() for s in mine.values()]
        if not subscriptions:
            return
        try:
            with self.context.db.read() as tx:
                latest = records.latest_event_seq(tx)
                revisions = {
                    s.run_id: run_store.read_run_revision(tx, s.run_id)
                    for s in subscriptions
                    if s.kind == "run" and s.run_id is not None
                }
        except PiwfError as error:
            log.warning("looking at watched runs failed: %s", error.code)
            self._keep_looking()
            return
        for subscription in subscriptions:
            now = latest if subscription.run_id is None else revisions.get(subscription.run_id)
            if now is not None and now != subscription.sent:
                subscription.pending = True
                self._push(subscription)
        self._keep_looking()

    def _push(self, subscription: Subscription) -> None:
        """Send the subscription's snapshot now, or once its connection has drained."""
        connection = subscription.connection
        if connection.closed:
            return
        if connection.output:
            subscription.pending = True  # at most one snapshot waits in the server
            return
        subscription.pending = False
        try:
            event = self._snapshot(subscription)
        except PiwfError as error:
            log.warning("a subscription snapshot failed: %s", error.code)
            return
        if event is not None:
            self.send(connection, encode_message(event))

    def _snapshot(self, subscription: Subscription) -> Event | None:
        with self.context.db.read() as tx:
            if subscription.kind == "runs":
                latest = records.latest_event_seq(tx)
                if latest == subscription.sent:
                    return None
                runs = run_store.list_runs(
                    tx, limit=subscription.limit, display=subscription.status
                )
                subscription.sent = latest
                listed: list[RunInfo] = [run_info(run) for run in runs]
                return Event(
                    subscription_id=subscription.subscription_id,
                    event="runList",
                    payload={"runs": [run.to_wire() for run in listed]},
                )
            assert subscription.run_id is not None
            view = run_store.load_run(tx, subscription.run_id)
            if view is None:  # pruned while watched: the subscription has nothing left
                return None
            if subscription.sent is not None and view.revision <= subscription.sent:
                return None
            document = self.views.run_view(tx, view, subscription.step_limit)
        subscription.sent = view.revision
        return Event(
            subscription_id=subscription.subscription_id,
            event="runView",
            revision=view.revision,
            run_id=subscription.run_id,
            payload=document.to_wire(),
        )


def _unknown(request: Request) -> Response:
    return error_response(
        request, "notFound", "subscriptionNotFound", "no such subscription on this connection"
    )
