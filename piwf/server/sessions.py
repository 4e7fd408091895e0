"""The origin-session operations: ``session.view``, ``session.list`` and
``workflowMessage.reportBranch`` (``session.attach`` is :mod:`piwf.server.coordinators`), and
the authority check that submissions, updates and answers of an interactive run pass first.

A view is one read: the session's message window (every message of an unfinished run and
every pending one, in session order, bounded at MAX_WINDOW_MESSAGES, with the complete count),
its content inline up to 16 KiB or by content reference, and the next message to send, named
only to the active epoch. Reading creates no receipt. A branch report is durable: its receipt
commits with the messages it marks sent and the presentations it makes again.
"""

from __future__ import annotations

from piwf.errors import SessionAuthorityError, SessionError
from piwf.lifecycle import Conflict
from piwf.protocol.client_v1 import Request, Response
from piwf.protocol.session_payloads import (
    MAX_WINDOW_MESSAGES,
    FollowUpQueuePayload,
    FollowUpReceipt,
    FollowUpRemovePayload,
    ReportBranchPayload,
    ReportBranchReceipt,
    SessionInfo,
    SessionList,
    SessionListPayload,
    SessionView,
    SessionViewPayload,
    TurnInfo,
    TurnReceipt,
    TurnReportPayload,
    WorkflowMessageInfo,
)
from piwf.server.commands import CommandResult
from piwf.server.content_offer import ContentOffer
from piwf.server.context import ServerContext
from piwf.server.loop import Reply
from piwf.server.replies import InvalidPayloadError, error_response, no_run, ok, payload_of
from piwf.state import Transaction
from piwf.state.enums import ActorType, TurnStopReason
from piwf.state.execution import messages, requests, turns
from piwf.state.execution.messages import MessageRow
from piwf.state.execution.runs import load_run
from piwf.state.records import Actor


class SessionHandlers:
    """Answers the session operations from the store and the coordinators."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context

    def session_view(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, SessionViewPayload)
        session_id = payload.session_id
        coordinators = self.context.coordinators
        active = coordinators.is_active(session_id, payload.coordinator_epoch)
        with self.context.db.read() as tx:
            rows, total = messages.window(tx, session_id, MAX_WINDOW_MESSAGES)
            offer = ContentOffer(tx)
            listed = [_message_info(offer, row) for row in rows]
            following = messages.next_eligible(tx, session_id) if active else None
            holder = messages.session_holder(tx, session_id)
            runs = messages.session_run_count(tx, session_id)
        view = SessionView(
            session_id=session_id,
            active_run_id=holder,
            runs=runs,
            coordinated=coordinators.coordinated(session_id),
            active_epoch=active,
            messages=listed,
            total=total,
            next_message_id=None if following is None else following.message_id,
        )
        reply(ok(request, view))

    def session_list(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, SessionListPayload)
        with self.context.db.read() as tx:
            rows = messages.list_sessions(tx, payload.limit)
        coordinated = self.context.coordinators.coordinated
        sessions = [
            SessionInfo(
                session_id=row.session_id,
                runs=row.runs,
                active_run_id=row.active_run_id,
                pending_messages=row.pending_messages,
                coordinated=coordinated(row.session_id),
                last_run_at=row.last_run_at,
            )
            for row in rows
        ]
        reply(ok(request, SessionList(sessions=sessions)))

    def report_branch(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, ReportBranchPayload)
        session_id = payload.session_id
        if not self.context.coordinators.is_active(session_id, payload.coordinator_epoch):
            # Answered before the command runs, so nothing is stored: the same report from
            # the epoch that replaces this one (a retry after reconnecting) is still applied.
            error = not_the_coordinator(session_id, payload.coordinator_epoch)
            reply(error_response(request, "rejected", error.code, str(error)))
            return
        found = [(entry.message_id, entry.entry_id) for entry in payload.found]
        context = self.context

        def change(tx: Transaction) -> CommandResult:
            try:
                outcome = messages.apply_branch_report(
                    tx, session_id, found, payload.missing, idle=payload.idle
                )
                if payload.idle:  # an idle session runs no turn: an open one is over
                    turns.end_open_turns_lost(
                        tx,
                        session_id,
                        actor=Actor(ActorType.SESSION, session_id),
                        control_owner_id=context.server_id,
                        lease_ms=context.run_lease_ms,
                    )
            except messages.NotInSessionError as error:
                stranger = InvalidPayloadError(
                    f"message {error.args[0]} is not a message of session {session_id}; a"
                    " report names only messages of its session's view"
                )
                return CommandResult.failed("rejected", stranger)
            receipt = ReportBranchReceipt(
                session_id=session_id, sent=outcome.sent, presented_again=outcome.presented_again
            )
            return CommandResult.accepted(receipt.to_wire())

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()

    def turn_report(self, request: Request, reply: Reply) -> None:
        """``workflowTurn.report``: a turn's start or end, applied with its rules."""
        payload = payload_of(request, TurnReportPayload)
        session_id = payload.session_id
        if not self.context.coordinators.is_active(session_id, payload.coordinator_epoch):
            error = not_the_coordinator(session_id, payload.coordinator_epoch)
            reply(error_response(request, "rejected", error.code, str(error)))
            return
        if (payload.phase == "end") != (payload.stop_reason is not None):
            raise InvalidPayloadError("stopReason: an end carries one, a start none")
        context = self.context
        actor = Actor(ActorType.SESSION, session_id)

        def change(tx: Transaction) -> CommandResult:
            if payload.phase == "start":
                result = turns.start_turn(
                    tx,
                    session_id=session_id,
                    turn_id=payload.turn_id,
                    message_id=payload.message_id,
                    run_id=payload.run_id,
                    actor=actor,
                    control_owner_id=context.server_id,
                    lease_ms=context.run_lease_ms,
                )
            else:
                assert payload.stop_reason is not None
                result = turns.end_turn(
                    tx,
                    session_id=session_id,
                    turn_id=payload.turn_id,
                    stop_reason=TurnStopReason(payload.stop_reason),
                    response_entry_id=payload.response_entry_id,
                    response_text=payload.response_text,
                    actor=actor,
                    control_owner_id=context.server_id,
                    lease_ms=context.run_lease_ms,
                )
            if isinstance(result, Conflict):
                return CommandResult.failed("conflict", SessionError(result.evidence))
            return CommandResult.accepted(_turn_receipt(result).to_wire(), run_id=payload.run_id)

        response = context.commands.execute(request, change)
        reply(response)
        submission = (response.receipt or {}).get("submissionId")
        if response.outcome == "accepted" and isinstance(submission, str):
            context.request_validation(submission, payload.run_id)  # an assistant's reply
        if response.outcome == "accepted":
            context.wake_scheduler()  # a given-up step is runnable now
            context.run_changed(payload.run_id)

    def follow_up_queue(self, request: Request, reply: Reply) -> None:
        """``followUp.queue``: a prompt to follow the session's run (module docstring)."""
        payload = payload_of(request, FollowUpQueuePayload)

        def change(tx: Transaction) -> CommandResult:
            if load_run(tx, payload.run_id) is None:
                return no_run(payload.run_id, self.context.home)
            if messages.session_of(tx, payload.run_id) not in (None, payload.session_id):
                refused = SessionError(
                    f"run {payload.run_id} belongs to another session; queue its follow-ups there"
                )
                return CommandResult.failed("rejected", refused)
            queued = messages.queue_follow_up(tx, payload.run_id, payload.prompt)
            if isinstance(queued, str):
                return CommandResult.failed("rejected", SessionError(queued))
            receipt = FollowUpReceipt(
                message_id=queued.message_id, run_id=queued.run_id, state=queued.status.value
            )
            return CommandResult.accepted(receipt.to_wire(), run_id=payload.run_id)

        reply(self.context.commands.execute(request, change))

    def follow_up_remove(self, request: Request, reply: Reply) -> None:
        """``followUp.remove``: withdraw a pending follow-up of the session."""
        payload = payload_of(request, FollowUpRemovePayload)

        def change(tx: Transaction) -> CommandResult:
            found = messages.get_message(tx, payload.message_id)
            if found is None or found.session_id != payload.session_id:
                missing = SessionError(
                    f"no follow-up {payload.message_id} in session {payload.session_id}"
                )
                return CommandResult.failed("notFound", missing)
            if not messages.remove_follow_up(tx, payload.message_id):
                state = found.status.value
                refused = SessionError(
                    f"message {payload.message_id} is a {found.kind.value} ({state}): only a"
                    " pending follow-up can be removed"
                )
                return CommandResult.failed("rejected", refused)
            receipt = FollowUpReceipt(
                message_id=found.message_id, run_id=found.run_id, state="cancelled"
            )
            return CommandResult.accepted(receipt.to_wire(), run_id=found.run_id)

        reply(self.context.commands.execute(request, change))


def _turn_receipt(result: turns.TurnReceipt) -> TurnReceipt:
    saved = result.turn
    info = (
        None
        if saved is None
        else TurnInfo(
            turn_id=saved.turn_id,
            message_id=saved.message_id,
            run_id=saved.run_id,
            state=saved.state.value,
            stop_reason=None if saved.stop_reason is None else saved.stop_reason.value,
            response_entry_id=saved.response_entry_id,
            started_at=saved.started_at,
            ended_at=saved.ended_at,
        )
    )
    return TurnReceipt(
        ownership=result.ownership,
        turn=info,
        reminder_message_id=result.reminded,
        paused=result.paused,
        gave_up=result.gave_up,
        submission_id=result.submission_id,
        refusal=result.refusal,
    )


def refuse_without_authority(
    context: ServerContext, request: Request, request_id: str, epoch: str | None
) -> Response | None:
    """The refusal to answer when ``request_id`` belongs to an interactive run and ``epoch``
    is not its session's active coordinator epoch; None otherwise (a headless run, an unknown
    request: the operation itself answers those).

    The model-facing actions of an interactive run (a submission, an update, a checkpoint
    answer) belong to its session. The refusal is answered before the command runs, so
    nothing is stored and the same request from the active epoch is applied.
    """
    with context.db.read() as tx:
        found = requests.get_request(tx, request_id)
        session_id = None if found is None else messages.session_of(tx, found.run_id)
    if session_id is None or context.coordinators.is_active(session_id, epoch):
        return None
    error = not_the_coordinator(session_id, epoch)
    return error_response(request, "rejected", error.code, str(error))


def not_the_coordinator(session_id: str, epoch: str | None) -> SessionAuthorityError:
    """The refusal of a request that needs the session's active coordinator ``epoch``.

    A request that carried an epoch comes from a coordinator, which knows how to attach: it
    is told its epoch is over (fenced by a newer attach). One without (``piwf submit``) is told
    how to act as the session.
    """
    if epoch is not None:
        return SessionAuthorityError(
            f"another coordinator took over session {session_id}: the coordinator epoch sent"
            " is no longer active (a newer attach fenced it, or its connection ended); attach"
            " again to take the session back"
        )
    return SessionAuthorityError(
        f"only the active coordinator of session {session_id} may do this: act as the session"
        f" with piwf session attach {session_id}, or from Python with"
        f" Client.session({session_id!r})"
    )


def _message_info(offer: ContentOffer, row: MessageRow) -> WorkflowMessageInfo:
    content = offer.json("run", row.run_id, row.content_hash)
    return WorkflowMessageInfo(
        message_id=row.message_id,
        run_id=row.run_id,
        kind=row.kind.value,
        reason=None if row.reason is None else row.reason.value,
        source_id=row.source_id,
        order=row.order_number,
        state=row.status.value,
        entry_id=row.entry_id,
        content=content.value,
        content_ref=content.ref,
        created_at=row.created_at,
    )
