"""A runner's state-changing calls: decoded, queued for the loop turn's group commit, answered
once it committed.

A call carries one port message, or a ``batch`` of them (a node's end with the next node's
start; piwf.protocol.runner_v1.Batch)::

    call | batch ─▶ decode each message under the runner's claim
                    (a message naming another run is a protocol violation: nothing is queued)
                 ─▶ drain the child's output into the attempt it was printed for
                 ─▶ queue (piwf/state/group_commit.py)
    the turn's transaction, this call's own savepoint:
                    verify the server epoch, then apply each message in order with its receipt
                    under the runner's claim; the first one not applied ends the batch
    after COMMIT:   switch the output target, answer, then act on each applied message:
                    claim lost → stop the runner; parked or finished → its command is over;
                    a node started → watch its deadline

A refusal of the whole call (this server lost its epoch, a check raised) undoes the call's own
changes alone; a failing file undoes the turn's group and the call is served again later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from piwf import faults
from piwf.canonical import JsonValue
from piwf.errors import ClaimLostError, PiwfError, StateUnavailableError
from piwf.protocol.runner_v1 import (
    BATCH_OPERATION,
    STEP_PAGE_BYTES,
    Batch,
    BatchedResponse,
    BatchResult,
)
from piwf.server.runs.attempt_output import NODE_MESSAGES
from piwf.state import Transaction
from piwf.state import execution as ex
from piwf.state.enums import RunnerMessageOutcome, RunnerStatus
from piwf.state.records import read_revision
from piwf.workflow import port
from piwf.workflow.port_codec import result_to_json

if TYPE_CHECKING:
    from piwf.protocol.runner_v1 import ChildMessage
    from piwf.server.runs.session import RunnerSession

_APPLIED = (RunnerMessageOutcome.ACCEPTED, RunnerMessageOutcome.ADOPTED)

#: One message of a call: its own message id (its receipt's) and the decoded change.
Change = tuple[str, ex.RunnerCall]


def serve_state_call(
    session: RunnerSession,
    message: ChildMessage,
    payload: dict[str, Any],
    again: Callable[[], None],
) -> None:
    """Decode ``message`` (its ``payload`` resolved) and queue it; ``again`` serves it anew
    when the file failed."""
    assert message.message_id is not None
    try:
        changes = _decode(session, message, payload)
    except ex.RunnerCallRejectedError as error:
        session.respond(message.message_id, "rejected", error=f"{error.code}: {error}")
        session.reject_protocol(str(error))
        return
    except ValidationError:
        session.respond(message.message_id, "rejected", error="protocolRejected: not a batch")
        session.reject_protocol("the runner sent a batch that is not runner.v1")
        return
    output = session.attempt_output
    assert output is not None, "calls are served once the child is attached"
    for _, call in changes:
        output.before(call.message)  # what the node printed goes to its own log first
    session.queued_call = message
    session.host.db.group.defer(QueuedCalls(session, message, tuple(changes), again))


def _decode(session: RunnerSession, message: ChildMessage, payload: JsonValue) -> list[Change]:
    """The messages of one call; raise ``RunnerCallRejectedError`` (or ``ValidationError``
    for a malformed batch) for a protocol violation."""
    message_id = message.message_id
    assert message_id is not None
    if message.operation != BATCH_OPERATION:
        return [(message_id, ex.decode_runner_call(session.claim, message.operation, payload))]
    batch = Batch.model_validate(payload)
    if any(call.message_id == message_id for call in batch.calls):
        raise ex.RunnerCallRejectedError("a call of a batch reuses the batch's own message id")
    return [
        (call.message_id, ex.decode_runner_call(session.claim, call.operation, call.payload))
        for call in batch.calls
    ]


@dataclass(frozen=True)
class QueuedCalls:
    """One call of a runner in the loop turn's group commit (a ``DeferredWrite``)."""

    session: RunnerSession
    message: ChildMessage
    changes: tuple[Change, ...]
    again: Callable[[], None]

    @property
    def message_id(self) -> str:
        return self.message.message_id or ""

    def apply(self, tx: Transaction) -> Callable[[], None]:
        session = self.session
        output = session.attempt_output
        assert output is not None
        session.host.verify_server_claim(tx)
        replies: list[ex.RunnerReply] = []
        for index, (message_id, call) in enumerate(self.changes):
            reply = ex.apply_runner_call(
                tx,
                session.claim,
                session.runner_epoch,
                message_id,
                call,
                # Later messages follow the revision the one before left: nothing else
                # commits inside this transaction.
                expected_revision=self.message.expected_revision if index == 0 else None,
                lease_ms=session.host.lease_ms,
            )
            output.within(tx, call.message, reply.outcome)
            replies.append(reply)
            if reply.outcome not in _APPLIED:
                break
        return lambda: self._committed(replies)

    def refused(self, error: PiwfError) -> Callable[[], None]:
        return lambda: self._refused(error)

    def unavailable(self, error: StateUnavailableError) -> None:
        session = self.session
        session.queued_call = None
        what = f"serving {self.message.operation}"
        session.host.retry_later(session, what, error, self.again)

    def _committed(self, replies: list[ex.RunnerReply]) -> None:
        session = self.session
        session.queued_call = None
        faults.point("runner.after_message_commit")
        judged = list(zip((call for _, call in self.changes), replies, strict=False))
        output = session.attempt_output
        assert output is not None
        moved = [(c.message, r.outcome) for c, r in judged if isinstance(c.message, NODE_MESSAGES)]
        if moved:
            applied = [move for move in moved if move[1] in _APPLIED]
            output.after(*(applied[-1] if applied else moved[-1]))
        self._answer(replies)
        for call, reply in judged:
            if reply.outcome is RunnerMessageOutcome.CLAIM_LOST:
                session.server_lost_claim = True
                session.host.stop(session, RunnerStatus.CLAIM_LOST)
                return
            if isinstance(call.message, (port.RunParked, port.RunFinished)):
                if reply.outcome in _APPLIED:
                    # The command is over: the child exits next, and its exit is not a crash.
                    session.ended = True
                    session.host.run_changed(session.run_id)
            elif isinstance(call.message, port.NodeStarted):
                session.watch_deadline(call.message)

    def _answer(self, replies: list[ex.RunnerReply]) -> None:
        if self.message.operation != BATCH_OPERATION:
            (reply,) = replies
            self.session.respond(self.message_id, reply.outcome.value, *_result_of(reply))
            return
        responses = [
            BatchedResponse(
                messageId=message_id,
                outcome=reply.outcome.value,
                result=_result_of(reply)[0],
                error=_result_of(reply)[1],
            )
            for (message_id, _), reply in zip(self.changes, replies, strict=False)
        ]
        self.session.respond(
            self.message_id, "accepted", BatchResult(responses=responses).to_json()
        )

    def _refused(self, error: PiwfError) -> None:
        """The call's changes were undone: this server lost its claim, or a check refused it."""
        session = self.session
        session.queued_call = None
        if isinstance(error, ClaimLostError):
            session.respond(self.message_id, "claimLost", error="claim lost")
            session.server_lost_claim = True
            session.host.stop(session, RunnerStatus.CLAIM_LOST)
        else:
            session.respond(self.message_id, "rejected", error=str(error))


def _result_of(reply: ex.RunnerReply) -> tuple[JsonValue, str | None]:
    error = None if reply.error is None else reply.error[:1000]
    return (None if reply.result is None else result_to_json(reply.result)), error


@dataclass(frozen=True)
class ReadyReport:
    """A runner's ``ready`` in the loop turn's group commit (a ``DeferredWrite``): the runner
    is marked ready and the run's revision read in the same transaction, and its one command
    is sent only after the commit, so the command's revision is committed state."""

    session: RunnerSession

    def apply(self, tx: Transaction) -> Callable[[], None]:
        session = self.session
        result = ex.mark_runner_ready(
            tx, session.claim, session.runner_epoch, lease_ms=session.host.lease_ms
        )
        revision = read_revision(tx, session.claim.resource_id) or 0
        # The run as the command's revision leaves it, with its first steps: sent with the
        # command, it spares the child's first read_run a round trip.
        saved = ex.read_saved_run_head(tx, session.run_id, STEP_PAGE_BYTES)
        return lambda: session.ready_committed(result, revision, saved)

    def refused(self, error: PiwfError) -> Callable[[], None]:
        return lambda: self.session.ready_refused(error)

    def unavailable(self, error: StateUnavailableError) -> None:
        # The child waits for its command meanwhile.
        session = self.session
        session.host.retry_later(session, "marking it ready", error, session.queue_ready_report)
