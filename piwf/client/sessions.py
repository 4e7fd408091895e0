"""The origin-session side of the client: :meth:`Client.session` and :class:`SessionCoordinator`.

A program that hosts a conversation (a chat host, an agent loop, a notebook) coordinates an
origin session: it starts runs with ``session=``, and the server fills the session with
workflow messages (steps, decisions, notifications, terminal results) that the coordinator
shows in order and proves shown with a branch report (docs/SESSIONS.md)::

    with Client() as client:
        session = client.session("chat-1", inspect_branch=my_branch)
        run = client.start_run("review.py", session="chat-1")
        while (message := session.next_message(timeout_s=60)) is not None:
            entry_id = my_chat.show(message.content)       # put it in the conversation
            session.delivered(message.message_id, entry_id) # the evidence: now it is sent
            if message.kind == "step":
                session.submit(message.content["requestId"], my_model.answer(message.content))
            if message.kind == "terminal":
                break

One coordinator per session: attaching fences the previous one, whose reports, submissions and
answers are refused from then on (code ``sessionAuthority``:
:class:`~piwf.errors.SessionAuthorityCommandError`, which its ``next_message`` raises too). An
epoch belongs to one connection, so after a reconnect the coordinator attaches again and,
before anything else, reports what the conversation holds (``inspect_branch``), as the seed
requires.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.client.arguments import (
    build_payload,
    invalid_argument_error,
    timeout_argument,
    wait_timeout_argument,
)
from piwf.client.connection import ServerConnection
from piwf.client.content import resolve_references
from piwf.client.interactions import SUBMIT_EXTRA_WAIT_S
from piwf.errors import InvalidArgumentError, SessionAuthorityCommandError, SessionError
from piwf.protocol.agent_payloads import SubmissionReceipt, UpdateReceipt
from piwf.protocol.payloads import AnswerReceipt

if TYPE_CHECKING:
    from piwf.client.client import Client
    from piwf.protocol.session_capture_payloads import (
        CapturedEntry,
        CapturedEvent,
        CaptureRecordReceipt,
    )
    from piwf.protocol.session_payloads import (
        FollowUpReceipt,
        ReportBranchReceipt,
        SessionAttachReceipt,
        SessionInfo,
        SessionView,
        TurnInfo,
        TurnReceipt,
        WorkflowMessageInfo,
    )
    from piwf.protocol.settings_payloads import SettingsScopeInfo

_Item = TypeVar("_Item", "CapturedEntry", "CapturedEvent")

#: What a conversation holds, as a host finds it: message id -> entry id for the workflow
#: messages found, the ids searched for and not found, and whether the session is idle with no
#: pending input (absence counts only then).
BranchEvidence = tuple[Mapping[str, str], Sequence[str], bool]

#: How often :meth:`SessionCoordinator.next_message` asks again while nothing is eligible.
DEFAULT_POLL_S = 0.25


class SessionMethods:
    """The session methods of :class:`piwf.client.Client`."""

    def session(
        self,
        session_id: str,
        *,
        inspect_branch: Callable[[list[WorkflowMessageInfo]], BranchEvidence] | None = None,
        poll_s: float = DEFAULT_POLL_S,
    ) -> SessionCoordinator:
        """Return the coordinator of origin session ``session_id`` (it attaches on first use).

        ``inspect_branch`` is called with the session's messages after every attach and
        returns what the conversation holds (:data:`BranchEvidence`); the coordinator reports
        it before it hands out any message, so a message shown before a crash is adopted
        instead of shown twice. Without it, nothing is reported (a host that keeps no history).
        Raises :class:`~piwf.errors.SessionError` for a malformed ``session_id``, as
        :meth:`start_run` does, and :class:`~piwf.errors.InvalidArgumentError` for a ``poll_s``
        that is no number of seconds above 0 or an ``inspect_branch`` that is not callable.
        """
        from piwf.protocol.session_payloads import session_id_problem

        if (problem := session_id_problem(session_id)) is not None:
            raise SessionError(problem)
        poll_s = timeout_argument("poll_s", poll_s)
        if inspect_branch is not None and not callable(inspect_branch):
            raise InvalidArgumentError(
                "invalid argument: inspect_branch: a function of the session's messages, or None"
            )
        client: Client = self  # type: ignore[assignment]  # a mixin of Client
        return SessionCoordinator(client, session_id, inspect_branch=inspect_branch, poll_s=poll_s)

    def list_sessions(self, limit: int = 50) -> list[SessionInfo]:
        """The sessions runs were bound to, most recently used first (``session.list``)."""
        from piwf.protocol.session_payloads import SessionList, SessionListPayload

        client: Client = self  # type: ignore[assignment]  # a mixin of Client
        payload = build_payload(SessionListPayload, limit=limit)
        return client._call("session.list", payload, SessionList).sessions


class SessionCoordinator:
    """The one coordinator of an origin session, on one client (not thread-safe)."""

    def __init__(
        self,
        client: Client,
        session_id: str,
        *,
        inspect_branch: Callable[[list[WorkflowMessageInfo]], BranchEvidence] | None,
        poll_s: float,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.inspect_branch = inspect_branch
        self.poll_s = poll_s
        #: The epoch this coordinator holds (None before the first attach).
        self.epoch: str | None = None
        self._connection: ServerConnection | None = None

    # -- attaching -----------------------------------------------------------------------------

    def attach(self) -> SessionAttachReceipt:
        """Become the session's coordinator on the current connection (a new epoch), then
        report the branch when ``inspect_branch`` was given."""
        from piwf.protocol.session_payloads import SessionAttachPayload, SessionAttachReceipt

        payload = SessionAttachPayload(session_id=self.session_id)
        receipt = self.client._call("session.attach", payload, SessionAttachReceipt)
        self.epoch = receipt.coordinator_epoch
        self._connection = self.client._connection
        if self.inspect_branch is not None:
            found, missing, idle = self.inspect_branch(self.view().messages)
            self.report_branch(found, missing, idle=idle)
        return receipt

    def _ensure_attached(self) -> str:
        connection = self.client._connection
        if (
            self.epoch is None
            or connection is None
            or connection is not self._connection
            or connection.broken
        ):
            self.client._connected()
            self.attach()
        assert self.epoch is not None
        return self.epoch

    # -- reading -------------------------------------------------------------------------------

    def view(self) -> SessionView:
        """The session's messages (content read in full) and, for this epoch, the next one."""
        from piwf.protocol.session_payloads import SessionView, SessionViewPayload

        payload = SessionViewPayload(session_id=self.session_id, coordinator_epoch=self.epoch)
        view = self.client._call("session.view", payload, SessionView)
        return resolve_references(view, self.client.read_content)

    def next_message(self, timeout_s: float | None = None) -> WorkflowMessageInfo | None:
        """The message to show next, once one is eligible (None when ``timeout_s`` passes).

        The same message comes back until :meth:`delivered` reports it shown (or its source
        withdraws it): a host that dies between showing and reporting shows nothing twice, as
        long as ``inspect_branch`` finds it next time.

        Raises :class:`~piwf.errors.SessionAuthorityCommandError` once another coordinator
        attached after this one (it is told nothing more); :meth:`attach` takes the session
        back. A reconnect is not that: the coordinator attaches again on the new connection.
        ``timeout_s`` is None (wait for one) or a number of seconds (0 or less: look once);
        anything else is an :class:`~piwf.errors.InvalidArgumentError`.
        """
        timeout_s = wait_timeout_argument("timeout_s", timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._ensure_attached()
            attached_on = self._connection
            view = self.view()
            if not view.active_epoch:
                if attached_on is not None and attached_on is self.client._connection:
                    raise SessionAuthorityCommandError(
                        f"another coordinator took over session {self.session_id}: a newer"
                        " attach fenced this coordinator; attach again to take the session back",
                        error_code=SessionAuthorityCommandError.code,
                    )
                continue  # the view was read on a new connection: attach there first
            if view.next_message_id is not None:
                for message in view.messages:
                    if message.message_id == view.next_message_id:
                        return message
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            threading.Event().wait(self.poll_s if left is None else min(self.poll_s, left))

    # -- reporting and acting --------------------------------------------------------------

    def report_branch(
        self,
        found: Mapping[str, str] | None = None,
        missing: Sequence[str] = (),
        *,
        idle: bool = True,
        idempotency_key: str | None = None,
    ) -> ReportBranchReceipt:
        """Report what the conversation holds (``workflowMessage.reportBranch``): ``found``
        maps message ids to the entries that hold them (those become ``sent``), ``missing``
        lists ids looked for and not found (a sent step or decision whose request is still
        open is presented again, once), ``idle``: no model turn runs and no input waits."""
        from piwf.protocol.session_payloads import ReportBranchReceipt

        if found is not None and not (
            isinstance(found, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in found.items())
        ):
            raise InvalidArgumentError(
                "invalid argument: found: a mapping of message ids to entry ids (str to str)"
            )
        _require_strings("missing", missing, "message ids")
        epoch = self._ensure_attached() if self.epoch is None else self.epoch
        payload: dict[str, Any] = {
            "sessionId": self.session_id,
            "coordinatorEpoch": epoch,
            "found": [
                {"messageId": message_id, "entryId": entry_id}
                for message_id, entry_id in (found or {}).items()
            ],
            "missing": list(missing),
            "idle": idle,
        }
        response = self.client.request(
            "workflowMessage.reportBranch", payload, idempotency_key=idempotency_key
        )
        return ReportBranchReceipt.model_validate(response.receipt or {})

    def start_turn(
        self, message: WorkflowMessageInfo, *, turn_id: str | None = None
    ) -> TurnReceipt:
        """Report a model turn starting on ``message`` (``workflowTurn.report``); the server
        decides whether it is workflow work (``ownership``: ``active`` or ``absent``). Report
        the same ``turn_id`` again after a reconnect: the saved turn comes back."""
        from piwf.protocol.session_payloads import WorkflowMessageInfo

        if not isinstance(message, WorkflowMessageInfo):
            raise InvalidArgumentError(
                "invalid argument: message: a WorkflowMessageInfo, as next_message returns"
            )
        return self._turn(
            {
                "turnId": turn_id or f"turn-{secrets.token_hex(8)}",
                "messageId": message.message_id,
                "runId": message.run_id,
                "phase": "start",
            }
        )

    def end_turn(
        self,
        turn: TurnInfo,
        stop_reason: str,
        *,
        response_entry_id: str | None = None,
        response_text: str | None = None,
    ) -> TurnReceipt:
        """Report how a turn ended: ``completed``, ``aborted`` (the person stopped it: the
        run pauses), ``error`` or ``lost``. An end on a step still pending counts toward the
        reminder rule (two ``reminder`` steps, then the visit fails ``missingSubmission``).
        ``response_text`` is the turn's visible reply: on an assistant-message step it becomes
        the step's output (the receipt's ``submission_id``; ``refusal`` says why not)."""
        from piwf.protocol.session_payloads import TurnInfo

        if not isinstance(turn, TurnInfo):
            raise InvalidArgumentError(
                "invalid argument: turn: a TurnInfo, as start_turn's receipt carries it"
            )
        payload: dict[str, Any] = {
            "turnId": turn.turn_id,
            "messageId": turn.message_id,
            "runId": turn.run_id,
            "phase": "end",
            "stopReason": stop_reason,
        }
        if response_entry_id is not None:
            payload["responseEntryId"] = response_entry_id
        if response_text is not None:
            payload["responseText"] = response_text
        return self._turn(payload)

    def _turn(self, fields: dict[str, Any]) -> TurnReceipt:
        from piwf.protocol.session_payloads import TurnReceipt

        payload = {"sessionId": self.session_id, "coordinatorEpoch": self._ensure_attached()}
        response = self.client.request("workflowTurn.report", {**payload, **fields})
        return TurnReceipt.model_validate(response.receipt or {})

    def queue_follow_up(self, run_id: str, prompt: str) -> FollowUpReceipt:
        """Queue ``prompt`` to follow run ``run_id`` (``followUp.queue``): it comes as a
        ``followUp`` message once the run completed, its terminal message was shown (and any
        turn on it ended), and earlier follow-ups likewise; a run that fails or is cancelled
        cancels it."""
        from piwf.protocol.session_payloads import FollowUpReceipt

        payload = {"sessionId": self.session_id, "runId": run_id, "prompt": prompt}
        response = self.client.request("followUp.queue", payload)
        return FollowUpReceipt.model_validate(response.receipt or {})

    def remove_follow_up(self, message_id: str) -> FollowUpReceipt:
        """Withdraw a follow-up that was not shown yet (``followUp.remove``)."""
        from piwf.protocol.session_payloads import FollowUpReceipt

        payload = {"sessionId": self.session_id, "messageId": message_id}
        response = self.client.request("followUp.remove", payload)
        return FollowUpReceipt.model_validate(response.receipt or {})

    def record(
        self,
        turn: TurnInfo | str,
        *,
        entries: Sequence[CapturedEntry | Mapping[str, Any]] = (),
        events: Sequence[CapturedEvent | Mapping[str, Any]] = (),
        idempotency_key: str | None = None,
    ) -> CaptureRecordReceipt:
        """Record what the conversation holds of an accepted turn (``sessionCapture.record``):
        its entries (``CapturedEntry(entry_id=..., kind=..., content=..., role=...)``, the
        conversation's own entry ids) and events (``CapturedEvent(event_type=...,
        payload=..., tool_call_id=...)``), in order, before the turn's end is reported. An
        entry recorded again is adopted; events are kept once per ``idempotency_key``. The
        turn's segment keeps at most 2000 entries and 5000 events; the receipt counts what it
        dropped beyond. Read it back with :meth:`Client.read_capture`. A content or payload
        that is no canonical JSON (a set, bytes, NaN) is a
        :class:`~piwf.errors.CanonicalJsonError` before anything is sent."""
        from piwf.protocol.session_capture_payloads import (
            CapturedEntry,
            CapturedEvent,
            CaptureRecordPayload,
            CaptureRecordReceipt,
        )
        from piwf.protocol.session_payloads import TurnInfo

        if not isinstance(turn, (str, TurnInfo)):
            raise InvalidArgumentError("invalid argument: turn: a TurnInfo or its turn id (a str)")
        turn_id = turn if isinstance(turn, str) else turn.turn_id
        _require_sequence("entries", entries)
        _require_sequence("events", events)
        entry_models = [_model(CapturedEntry, entry) for entry in entries]  # before attaching
        event_models = [_model(CapturedEvent, event) for event in events]
        # Sent as given, not through pydantic's JSON conversion (a set would become a list).
        for entry in entry_models:
            canonical.check_value(entry.content, "entries.content")
        for event in event_models:
            canonical.check_value(event.payload, "events.payload")
        payload = build_payload(
            CaptureRecordPayload,
            session_id=self.session_id,
            coordinator_epoch=self._ensure_attached(),
            turn_id=turn_id,
            entries=entry_models,
            events=event_models,
        )
        return self.client._call(
            "sessionCapture.record",
            payload,
            CaptureRecordReceipt,
            idempotency_key=idempotency_key,
        )

    def delivered(self, message_id: str, entry_id: str) -> ReportBranchReceipt:
        """Report one message shown: it is in the conversation as ``entry_id``."""
        if not (isinstance(message_id, str) and isinstance(entry_id, str)):
            raise InvalidArgumentError("invalid argument: message_id and entry_id: each a str")
        return self.report_branch({message_id: entry_id})

    def submit(
        self, request_id: str, output: JsonValue, *, idempotency_key: str | None = None
    ) -> SubmissionReceipt:
        """Submit an agent step's output as this session (:meth:`Client.submit`, with the
        epoch): the receipt comes once its validation is durable."""
        canonical.check_value(output, "output")
        payload = {
            "requestId": request_id,
            "output": output,
            "coordinatorEpoch": self._ensure_attached(),
        }
        response = self.client.request(
            "interaction.submit",
            payload,
            idempotency_key=idempotency_key,
            timeout_s=self.client.request_timeout_s + SUBMIT_EXTRA_WAIT_S,
        )
        receipt = SubmissionReceipt.model_validate(response.receipt or {})
        return resolve_references(receipt, self.client.read_content)

    def update(
        self, request_id: str, data: JsonValue, *, idempotency_key: str | None = None
    ) -> UpdateReceipt:
        """Record a progress update of an agent step as this session."""
        canonical.check_value(data, "data")
        payload = {
            "requestId": request_id,
            "data": data,
            "coordinatorEpoch": self._ensure_attached(),
        }
        response = self.client.request(
            "interaction.update", payload, idempotency_key=idempotency_key
        )
        return UpdateReceipt.model_validate(response.receipt or {})

    def answer(
        self, request_id: str, response: JsonValue, *, idempotency_key: str | None = None
    ) -> AnswerReceipt:
        """Answer a checkpoint as this session (``checkpoint.answer`` with the epoch). A
        protected decision is a person's: ``piwf answer`` or :meth:`Client.answer`."""
        canonical.check_value(response, "response")
        payload = {
            "requestId": request_id,
            "response": response,
            "coordinatorEpoch": self._ensure_attached(),
        }
        answered = self.client.request(
            "checkpoint.answer", payload, idempotency_key=idempotency_key
        )
        return AnswerReceipt.model_validate(answered.receipt or {})

    def change_settings(
        self,
        run_id: str,
        patch: Sequence[dict[str, Any]],
        *,
        mount_path: str = "",
        expected_change: int | None = None,
        idempotency_key: str | None = None,
    ) -> SettingsScopeInfo:
        """Change the live settings of this session's run as the session
        (:meth:`Client.change_settings` with this coordinator's epoch): only paths the
        workflow grants to ``"session"`` can be changed."""
        return self.client.change_settings(
            run_id,
            patch,
            mount_path=mount_path,
            expected_change=expected_change,
            coordinator_epoch=self._ensure_attached(),
            idempotency_key=idempotency_key,
        )


def _model(kind: type[_Item], item: _Item | Mapping[str, Any]) -> _Item:
    """An entry or event as its wire model (a mapping may use Python or wire names); raise
    :class:`~piwf.errors.InvalidArgumentError` naming what it refuses."""
    if isinstance(item, kind):
        return item
    if not isinstance(item, Mapping):
        raise InvalidArgumentError(
            f"invalid argument: each of entries and events: a {kind.__name__} or a mapping of"
            " its fields"
        )
    try:
        return kind.model_validate(item)
    except ValidationError as error:
        raise invalid_argument_error(error) from None


def _require_sequence(name: str, value: object) -> None:
    """Refuse a ``value`` that is no list or tuple (a str, None, a mapping)."""
    if not isinstance(value, (list, tuple)):
        raise InvalidArgumentError(f"invalid argument: {name}: a list (or tuple)")


def _require_strings(name: str, value: object, what: str) -> None:
    """Refuse a ``value`` that is no list or tuple of str."""
    if not (isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)):
        raise InvalidArgumentError(f"invalid argument: {name}: a list of {what} (str)")
