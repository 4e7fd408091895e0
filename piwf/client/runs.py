"""The reading methods of :class:`piwf.client.Client`: runs, waits, pending requests, content;
and the ``run.start`` payload it sends.

Kept in their own module so that ``client.py`` stays one screenful per concern; ``Client``
inherits them. Every method returns complete values: whatever the server sent by content
reference (docs/PROTOCOL.md, "Content references") is read in ``view.content`` parts and
verified by :mod:`piwf.client.content` before the method returns, unless ``content_limit``
says to leave references to longer values in place (the ``*_ref`` fields).
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from pydantic import BaseModel

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.client.arguments import (
    build_payload,
    content_limit_argument,
    opaque_id_argument,
    path_argument,
    project_argument,
    timeout_argument,
    wait_timeout_argument,
    whole_number_argument,
)
from piwf.client.calls import ClientCalls
from piwf.client.content import read_content, resolve_references
from piwf.config import MAX_FRAME_BYTES, SESSION_OR_AGENT_COMMAND, agent_command_problem
from piwf.errors import (
    AgentCommandError,
    ClientClosedError,
    InvalidArgumentError,
    PiwfError,
    SessionError,
    WatchIdleError,
)
from piwf.protocol import Operation
from piwf.protocol.payloads import (
    MAX_WAIT_MS,
    REQUEST_PAGE,
    ContentRef,
    EmptyPayload,
    OpenRequestInfo,
    RequestCursor,
    RequestList,
    RequestsListPayload,
    RunCursor,
    RunDetail,
    RunInfo,
    RunListPayload,
    RunPage,
    RunStartPayload,
    RunWaitPayload,
    RunWaitReceipt,
    WireModel,
)

if TYPE_CHECKING:
    from piwf.protocol.view_payloads import RunView, Step

#: One ``run.wait`` request waits at most this long on the server; longer waits loop.
WAIT_SLICE_S: Final = 30.0

_Receipt = TypeVar("_Receipt", bound=BaseModel)


class RunReadMethods(ClientCalls):
    """``Client`` methods that read runs and the values they hold."""

    def list_runs(
        self, limit: int = 50, before: RunCursor | None = None, *, status: str | None = None
    ) -> RunPage:
        """Return one page of runs, newest first (``run.list``); ``next_cursor`` pages on;
        ``status``: only runs with that display status (``waiting``, ``failed`` …)."""
        payload = build_payload(RunListPayload, limit=limit, before=before, status=status)
        return self._call("run.list", payload, RunPage)

    def get_run(self, run_id: str, *, content_limit: int | None = None) -> RunDetail:
        """Return one run in full (``run.get``); NotFoundError if unknown.

        Values the server sent by content reference (a large output, error, prompt or answer)
        are read and verified first (:meth:`read_content`), so the detail holds complete
        values. With ``content_limit``, values longer than that many bytes are left as their
        references (``output_ref`` and the like) and not read.
        """
        content_limit = content_limit_argument(content_limit)
        detail = self._call("run.get", EmptyPayload(), RunDetail, run_id=run_id)
        return resolve_references(detail, self.read_content, content_limit=content_limit)

    def run_view(
        self, run_id: str, *, step_limit: int = 50, content_limit: int | None = None
    ) -> RunView:
        """Return the live run view (``view.run.get``, ``piwf.run-view.v1``): the run, its
        display (status, activity, controls, current node or request, reason) and its first
        ``step_limit`` steps; ``steps.next_cursor`` pages on (:meth:`run_steps` reads them all).
        Referenced values are read as :meth:`get_run` reads them."""
        from piwf.protocol.view_payloads import RunView, ViewRunPayload

        content_limit = content_limit_argument(content_limit)
        payload = build_payload(ViewRunPayload, step_limit=step_limit)
        view = self._call("view.run.get", payload, RunView, run_id=run_id)
        return resolve_references(view, self.read_content, content_limit=content_limit)

    def run_steps(
        self,
        run_id: str,
        *,
        after: int | None = None,
        page_limit: int = 50,
        content_limit: int | None = None,
    ) -> list[Step]:
        """Return the finished steps of the run in order (node, visit, attempt, outcome,
        duration, output or error, failure record, published updates), reading the view's
        pages (``view.page``) until the last; with ``after``, only the steps whose index is
        above it (the index of the last step a caller has; -1 or None: all)."""
        from piwf.protocol.view_payloads import (
            MAX_STEP_INDEX,
            MAX_STEP_PAGE_ITEMS,
            StepPage,
            ViewPagePayload,
        )

        content_limit = content_limit_argument(content_limit)
        whole_number_argument(
            "after",
            after,
            f"a step index (a whole number up to {MAX_STEP_INDEX}), or None",
            least=None,
            most=MAX_STEP_INDEX,
        )
        rule = f"a number of steps from 1 to {MAX_STEP_PAGE_ITEMS}"
        whole_number_argument(
            "page_limit", page_limit, rule, least=1, most=MAX_STEP_PAGE_ITEMS, optional=False
        )
        if after is None or after < 0:
            page = self.run_view(run_id, step_limit=page_limit, content_limit=content_limit).steps
        else:
            page = StepPage(steps=[], total=0, next_cursor=str(after))
        steps = list(page.steps)
        while page.next_cursor is not None:
            payload = build_payload(
                ViewPagePayload, kind="steps", cursor=page.next_cursor, limit=page_limit
            )
            page = self._call("view.page", payload, StepPage, run_id=run_id)
            page = resolve_references(page, self.read_content, content_limit=content_limit)
            steps.extend(page.steps)
        return steps

    def watch_run(
        self,
        run_id: str,
        *,
        step_limit: int = 50,
        content_limit: int | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[RunView]:
        """Yield the run's view now and again after every change (``view.run.watch``: the
        server pushes each new revision; a burst of changes comes as its newest state), and
        stop after the view of the run's final state. Referenced values are read as
        :meth:`run_view` reads them.

        A dropped connection is reopened and the watch resumed from the last revision seen
        (nothing older comes again); :meth:`close` (from another thread) ends the watch
        with :class:`~piwf.errors.ClientClosedError`. ``idle_timeout_s``: raise
        :class:`~piwf.errors.WatchIdleError` (a ``TimeoutError``) when nothing comes for that
        long (None: wait as long as the run takes). Stopping the iteration (``break``) ends
        the subscription on the server.
        """
        from piwf.protocol.view_payloads import RunView, ViewRunWatchPayload

        run_id = opaque_id_argument("run_id", run_id)  # a watch connects before it asks
        content_limit = content_limit_argument(content_limit)
        last: int | None = None

        def watch(subscription_id: str) -> WireModel:
            return build_payload(
                ViewRunWatchPayload,
                subscription_id=subscription_id,
                from_revision=last,
                step_limit=step_limit,
            )

        pushes = self._watch("view.run.watch", watch, "runView", idle_timeout_s, run_id=run_id)
        for payload in pushes:
            view = RunView.model_validate(payload)
            view = resolve_references(view, self.read_content, content_limit=content_limit)
            last = view.revision
            yield view
            if view.detail.run.finished_at is not None:
                return

    def watch_runs(
        self,
        *,
        limit: int = 50,
        status: str | None = None,
        idle_timeout_s: float | None = None,
    ) -> Generator[list[RunInfo], None, None]:
        """Yield the newest ``limit`` runs (newest first; ``status``: only that display
        status) now and again whenever any run changes (``view.runs.watch``), until the caller
        stops iterating. A dropped connection is reopened and the list sent again;
        ``idle_timeout_s`` and :meth:`close` as for :meth:`watch_run`."""
        from piwf.protocol.view_payloads import ViewRunsWatchPayload

        def watch(subscription_id: str) -> WireModel:
            return build_payload(
                ViewRunsWatchPayload, subscription_id=subscription_id, limit=limit, status=status
            )

        for pushed in self._watch("view.runs.watch", watch, "runList", idle_timeout_s):
            yield RunPage.model_validate(pushed).runs

    def _watch(
        self,
        operation: Operation,
        payload_for: Callable[[str], WireModel],
        event_name: str,
        idle_timeout_s: float | None,
        *,
        run_id: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Subscribe with ``operation`` and yield the payload of each ``event_name`` push,
        subscribing again (``payload_for`` gives the payload) on every new connection; the
        subscription ends on the server when the iteration stops. Connects as every call does
        (starting a server when the client may)."""
        from piwf.protocol.view_payloads import ViewUnwatchPayload, WatchReceipt

        if idle_timeout_s is not None:
            idle_timeout_s = timeout_argument("idle_timeout_s", idle_timeout_s)
        subscription_id = f"watch-{secrets.token_hex(8)}"
        what = "the run list" if run_id is None else f"run {run_id}"
        closes = self._closes
        while True:
            if self._closes != closes:
                raise ClientClosedError(f"the client was closed while watching {what}")
            payload = payload_for(subscription_id)  # a refused argument: before connecting
            connection = self._connected()
            events = connection.subscribe(subscription_id)
            try:
                self._call(operation, payload, WatchReceipt, run_id=run_id)
                if self._connection is not connection:
                    continue  # the watch went out on a new connection: subscribe there
                while True:
                    try:
                        event = events.get(timeout=idle_timeout_s)
                    except queue.Empty:
                        raise WatchIdleError(
                            f"no change of {what} came in {idle_timeout_s:g} s"
                            " (idle_timeout_s), so the watch ended; watch again to go on, or"
                            " give idle_timeout_s=None to wait as long as it takes"
                        ) from None
                    if event is None:
                        break  # the connection ended: resume on a new one
                    if event.event == event_name:
                        yield event.payload
            finally:
                connection.unsubscribe(subscription_id)
                if not connection.broken and self._connection is connection:
                    with contextlib.suppress(PiwfError):
                        self._call(
                            "view.unwatch",
                            ViewUnwatchPayload(subscription_id=subscription_id),
                            WatchReceipt,
                        )

    def wait_run(
        self, run_id: str, timeout_s: float | None = None, *, content_limit: int | None = None
    ) -> RunWaitReceipt:
        """Wait until the run is terminal or needs an operator, or ``timeout_s`` seconds pass
        (None: no limit).

        Sends ``run.wait`` requests of at most 30 s each; one resent after a lost connection
        (the server restarted, say) waits only for what is left of ``timeout_s``, so the call
        ends by then plus the time reconnecting took, with the same timed-out receipt as
        without a reconnect. Returns the last receipt: its ``run``
        is the run's latest state and ``timed_out`` says whether the wait ended before the run
        became terminal or stopped for an operator; a terminal run's ``output`` or ``error``
        comes complete (referenced values read as :meth:`get_run` reads them,
        ``content_limit`` likewise). A run that will not go on until someone acts (paused, or
        parked ``runnerNoProgress``, ``sourceChanged``, ``effectAmbiguous`` …) is returned at
        once, not raised: ``timed_out`` is False, ``run.needs_action`` True, ``run.error_code``
        and ``parked_reason`` say why (``piwf run explain`` says what to do). A run that waits
        on a request or a timer goes on by itself and is waited for. A non-positive
        ``timeout_s`` asks once without waiting.
        """
        timeout_s = wait_timeout_argument("timeout_s", timeout_s)
        content_limit = content_limit_argument(content_limit)
        deadline = None if timeout_s is None else time.monotonic() + max(timeout_s, 0.0)

        def wait_payload() -> RunWaitPayload:
            # Made as each attempt is sent, so a wait resent after a reconnect (a server
            # restarted meanwhile) asks only for what is left of timeout_s: none once it passed.
            slice_s = WAIT_SLICE_S
            if deadline is not None:
                slice_s = min(slice_s, max(deadline - time.monotonic(), 0.0))
            return RunWaitPayload(timeout_ms=min(int(slice_s * 1000), MAX_WAIT_MS))

        while True:
            longest_s = wait_payload().timeout_ms / 1000
            receipt = self._call(
                "run.wait",
                wait_payload,
                RunWaitReceipt,
                run_id=run_id,
                timeout_s=self.request_timeout_s + longest_s,
                held_s=longest_s,
            )
            if not receipt.timed_out or (deadline is not None and time.monotonic() >= deadline):
                return resolve_references(receipt, self.read_content, content_limit=content_limit)

    def list_requests(
        self, run_id: str | None = None, *, content_limit: int | None = None
    ) -> list[OpenRequestInfo]:
        """Return the pending checkpoints and decisions, oldest first (``requests.list``, a
        page of at most :data:`~piwf.protocol.payloads.REQUEST_PAGE` per answer, read until the
        last); with ``run_id``, only that run's (a malformed id is an
        :class:`~piwf.errors.InvalidArgumentError`, as for :meth:`get_run`).

        Referenced content is read as :meth:`get_run` reads it (``content_limit`` likewise).
        """
        content_limit = content_limit_argument(content_limit)
        if run_id is not None:
            run_id = opaque_id_argument("run_id", run_id)
        listed: list[OpenRequestInfo] = []
        after: RequestCursor | None = None
        while True:  # a page per frame; each cursor is after the one before
            payload = build_payload(
                RequestsListPayload, run_id=run_id, after=after, limit=REQUEST_PAGE
            )
            page = self._call("requests.list", payload, RequestList)
            found = resolve_references(page, self.read_content, content_limit=content_limit)
            listed.extend(found.requests)
            if page.next_cursor is None or page.next_cursor == after:
                return listed
            after = page.next_cursor

    def read_content(self, ref: ContentRef) -> JsonValue:
        """Return the complete value ``ref`` names: read in ``view.content`` parts of at most
        512 KiB, checked against its length and SHA-256, then decoded.

        Raises :class:`~piwf.errors.ContentMismatchError` when what arrived does not match the
        reference (never a partial value) and :class:`~piwf.errors.NotFoundError` when its
        owner no longer holds it (for example, the run was deleted since).
        """
        if not isinstance(ref, ContentRef):
            raise InvalidArgumentError(
                "invalid argument: ref: a ContentRef, as a receipt's outputRef and the like carry"
            )
        return read_content(lambda payload: self.request("view.content", payload).receipt, ref)


def start_payload(
    workflow: str | os.PathLike[str],
    *,
    input: Any,
    project: str | os.PathLike[str] | None,
    title: str | None,
    agent_command: Sequence[str] | None,
    session: str | None = None,
) -> dict[str, Any]:
    """The wire payload of ``run.start`` (see :meth:`piwf.client.Client.start_run`).

    Raises :class:`~piwf.errors.CanonicalJsonError` for an ``input`` that is not canonical
    JSON, :class:`~piwf.errors.AgentCommandError` for an ``agent_command`` that is not a
    list of non-empty strings, :class:`~piwf.errors.SessionError` for a malformed
    ``session`` id or a ``session`` together with an ``agent_command`` (they are exclusive)
    and :class:`~piwf.errors.InvalidArgumentError` for another argument.
    """
    canonical.check_value(input, "input")
    problem = None if agent_command is None else agent_command_problem(agent_command)
    if problem is not None:
        raise AgentCommandError(problem)
    command = None if agent_command is None else list(agent_command)
    if session is not None:
        from piwf.protocol.session_payloads import session_id_problem

        if (session_problem := session_id_problem(session)) is not None:
            raise SessionError(session_problem)
        if command is not None:
            raise SessionError(SESSION_OR_AGENT_COMMAND)
    payload = build_payload(
        RunStartPayload,
        workflow=workflow_reference(workflow),
        project_path=str(project_argument(project)),
        title=title,
        agent_command=command,
        session=session,
    )
    wire = payload.to_wire()
    # The input is sent as given (canonical JSON checks it), not through pydantic's JSON
    # conversion, which would quietly turn tuples, bytes or dates into something else.
    wire.pop("input", None)
    if input is not None:
        wire["input"] = input
    return wire


def input_too_large(input: Any) -> str:
    """The message for a run input that does not fit in one ``run.start`` request: its size,
    the limit and what to send instead (docs/PROTOCOL.md, frames)."""
    size = len(canonical.encode(input))
    return (
        f"invalid argument: input: the run's input is {size:,} bytes of JSON, but one request "
        f"carries at most {MAX_FRAME_BYTES:,} bytes (1 MiB) with the input in it; nothing was "
        "sent. Pass a path to a file that holds the data instead, and let the workflow read it"
    )


def workflow_reference(workflow: str | os.PathLike[str]) -> str:
    """Return what ``run.start`` sends for ``workflow``: an absolute path or a name.

    An ``os.PathLike``, an existing file, or text that contains ``/`` or ends with ``.py`` is
    a path, made absolute against the current directory; any other text is a name. Raises
    :class:`~piwf.errors.InvalidArgumentError` for anything else (an empty text, or one holding
    a NUL character, which no name or path can, too).
    """
    if isinstance(workflow, os.PathLike):
        return str(path_argument("workflow", workflow))
    if not isinstance(workflow, str) or not workflow or "\x00" in workflow:
        raise InvalidArgumentError(
            "invalid argument: workflow: a workflow name or file path (a non-empty str or"
            " PathLike without NUL characters)"
        )
    if "/" in workflow or workflow.endswith(".py") or _is_file(workflow):
        return str(path_argument("workflow", workflow))
    return workflow


def _is_file(text: str) -> bool:
    """Whether ``text`` names an existing file; False for a name no file can have (one longer
    than NAME_MAX, say), which then goes to the server as a workflow name."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False
