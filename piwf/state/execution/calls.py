"""One runner call, applied under the sending runner's own claim: the only way in for a runner.

The server and the store tests both apply a runner's port call through these two functions, so
the composition that fences a call cannot differ between them::

    decode_runner_call(claim, operation, payload)     outside any transaction
        unknown operation, a payload of the wrong shape,
        or a payload that names another run than the claim's ──▶ RunnerCallRejectedError
    apply_runner_call(tx, claim, runner_epoch, message_id, call, expected_revision)
        apply_runner_message: stored receipt? ─▶ same answer again
        guard: the run revision is ``expected_revision`` (when given), else Conflict
        apply_<operation>(tx, claim, message)    under ``claim``, never one the payload names

``claim`` is always the claim of the run the sending runner was launched for; nothing in the
payload chooses the authority a call is applied under. A refused decode is a protocol violation
(failure class ``protocolRejected``): the server answers it, stops that runner and parks its run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import PiwfError
from piwf.state.database import Transaction
from piwf.state.execution.core import run_resource_id
from piwf.state.execution.effects import apply_reserve_effect, apply_settle_effect
from piwf.state.execution.outcomes import (
    apply_finish,
    apply_park,
    apply_reject_answer,
    apply_request_interaction,
)
from piwf.state.execution.runners import RunnerReply, apply_runner_message
from piwf.state.execution.visits import (
    apply_begin_run,
    apply_node_failed,
    apply_node_finished,
    apply_node_started,
    apply_notify,
    apply_publish_update,
)
from piwf.state.leases import Claim
from piwf.state.records import read_revision
from piwf.workflow import port
from piwf.workflow.port_codec import MESSAGE_TYPES, from_json

#: Port operation → the store function that applies it in the caller's transaction.
_APPLY: dict[str, Callable[..., port.PortResult]] = {
    "begin_run": apply_begin_run,
    "node_started": apply_node_started,
    "node_finished": apply_node_finished,
    "node_failed": apply_node_failed,
    "publish_update": apply_publish_update,
    "notify": apply_notify,
    "reserve_effect": apply_reserve_effect,
    "settle_effect": apply_settle_effect,
    "request_interaction": apply_request_interaction,
    "reject_answer": apply_reject_answer,
    "park": apply_park,
    "finish": apply_finish,
}
assert set(_APPLY) == set(MESSAGE_TYPES), "every port operation needs exactly one applier"


class RunnerCallRejectedError(PiwfError):
    """A runner call broke the runner protocol; nothing was read or written for it."""

    code = "protocolRejected"


@dataclass(frozen=True)
class RunnerCall:
    """A decoded runner call: its operation, typed message and request fingerprint."""

    operation: str
    message: Any
    fingerprint: bytes


def decode_runner_call(claim: Claim, operation: str | None, payload: JsonValue) -> RunnerCall:
    """Decode one port call of the runner that holds ``claim``.

    Raises :class:`RunnerCallRejectedError` for an unknown operation, a payload that is not the
    operation's message shape (unknown, missing or mistyped fields), or a message that names a
    run other than the one ``claim`` is on. The fingerprint covers the operation and the
    payload, so a reused message id with another request is told apart.
    """
    message_type = MESSAGE_TYPES.get(operation or "")
    if operation is None or message_type is None:
        raise RunnerCallRejectedError(f"unknown runner operation {str(operation)[:64]!r}")
    try:
        message = from_json(message_type, payload)
    except PiwfError as error:
        raise RunnerCallRejectedError(f"{operation}: {error}") from None
    named = getattr(message, "run_id", None)
    if not isinstance(named, str) or run_resource_id(named) != claim.resource_id:
        raise RunnerCallRejectedError(f"{operation} names another run than the runner's own")
    fingerprint = canonical.digest({"operation": operation, "payload": payload})
    return RunnerCall(operation, message, fingerprint)


def apply_runner_call(
    tx: Transaction,
    claim: Claim,
    runner_epoch: str,
    message_id: str,
    call: RunnerCall,
    *,
    expected_revision: int | None,
    lease_ms: int,
) -> RunnerReply:
    """Apply a decoded call at most once, under ``claim``, and return its stored answer.

    ``claim`` is the launched claim of the runner ``runner_epoch``. Receipts, claim checks and
    outcomes are those of :func:`~piwf.state.execution.runners.apply_runner_message`; a call
    proposed against another revision than the stored one (``expected_revision``) is a
    ``rejected`` Conflict and changes nothing.
    """
    apply = _APPLY[call.operation]

    def guarded() -> port.PortResult:
        if expected_revision is not None:
            current = read_revision(tx, claim.resource_id)
            if current != expected_revision:
                return port.Conflict(f"run is at revision {current}, not {expected_revision}")
        return apply(tx, claim, call.message, lease_ms=lease_ms)

    return apply_runner_message(tx, claim, runner_epoch, message_id, call.fingerprint, guarded)
