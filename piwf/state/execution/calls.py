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

The operations and their message types are declared once
(:data:`piwf.protocol.runner_v1.PORT_OPERATIONS`); each state-changing one is applied by the
store function named ``apply_<operation>``, found by that name in ``visits``, ``effects`` or
``outcomes``.

``claim`` is always the claim of the run the sending runner was launched for; nothing in the
payload chooses the authority a call is applied under. A refused decode is a protocol violation
(failure class ``protocolRejected``): the server answers it, stops that runner and parks its run.

The runner's headless agent calls (:data:`~piwf.protocol.runner_v1.AGENT_OPERATIONS`) take the
same two steps, without a receipt (both are idempotent on the registry row itself)::

    decode_agent_call(claim, operation, payload)      the same refusals as above
    apply_agent_call(tx, claim, runner_epoch, call)
        process.register     under ``claim`` (renewed; ClaimLostError when it is stale)
        process.unregister   no claim: valid after the runner's claim was released
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import PiwfError
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.protocol.runner_v1 import (
    AGENT_OPERATION,
    AGENT_OPERATIONS,
    PORT_OPERATION,
    PORT_OPERATIONS,
    AgentOperation,
    ProcessRegistration,
    ProcessUnregistration,
)
from piwf.state.database import Transaction
from piwf.state.execution import effects, headless, outcomes, visits
from piwf.state.execution.runners import RunnerReply, apply_runner_message
from piwf.state.execution.runs import run_resource_id
from piwf.state.leases import Claim
from piwf.state.records import read_revision
from piwf.workflow import port
from piwf.workflow.port_codec import from_json

Applier = Callable[..., port.PortResult]


def _appliers() -> dict[str, Applier]:
    """Find ``apply_<name>`` for every state-changing operation of the declaration.

    Each applier lives in exactly one of the store modules that apply runner calls; a missing or
    doubled one fails at import, so a new operation cannot be declared without its applier.
    """
    found: dict[str, Applier] = {}
    for operation in PORT_OPERATIONS:
        if not operation.changes_state:
            continue
        name = f"apply_{operation.name}"
        owners = [module for module in (visits, effects, outcomes) if hasattr(module, name)]
        if len(owners) != 1:
            raise ImportError(f"{name} must be defined by exactly one store module")
        found[operation.name] = getattr(owners[0], name)
    return found


#: State-changing port operation → the store function that applies it in the caller's transaction.
_APPLY: dict[str, Applier] = _appliers()


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
    declared = PORT_OPERATION.get(operation or "")
    if operation is None or declared is None or not declared.changes_state:
        raise RunnerCallRejectedError(f"unknown runner operation {str(operation)[:64]!r}")
    try:
        message = from_json(declared.message, payload)
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
                return Conflict(f"run is at revision {current}, not {expected_revision}")
        return apply(tx, claim, call.message, lease_ms=lease_ms)

    return apply_runner_message(tx, claim, runner_epoch, message_id, call.fingerprint, guarded)


@dataclass(frozen=True)
class AgentCall:
    """A decoded headless agent call: its declaration and its typed payload."""

    operation: AgentOperation
    message: ProcessRegistration | ProcessUnregistration


#: What an agent call answers: a turn started (register) or ended (unregister).
AgentCallResult = (
    Applied[headless.TurnStart]
    | Adopted[headless.TurnStart]
    | Applied[headless.TurnEnd]
    | Adopted[headless.TurnEnd]
    | Conflict
)

if {op.name for op in AGENT_OPERATIONS} != {"process.register", "process.unregister"}:
    raise ImportError("every agent operation needs its applier in apply_agent_call")


def decode_agent_call(claim: Claim, operation: str | None, payload: JsonValue) -> AgentCall:
    """Decode one agent call of the runner that holds ``claim``.

    Raises :class:`RunnerCallRejectedError` for an operation that is not an agent call, a
    payload that is not its declared model (strictly: unknown, missing or mistyped fields), or
    one that names a run other than the one ``claim`` is on.
    """
    declared = AGENT_OPERATION.get(operation or "")
    if declared is None:
        raise RunnerCallRejectedError(f"unknown agent operation {str(operation)[:64]!r}")
    try:
        message = declared.message.model_validate(payload)
    except ValidationError:
        raise RunnerCallRejectedError(
            f"{declared.name}: the payload is not a {declared.message.__name__}"
        ) from None
    assert isinstance(message, (ProcessRegistration, ProcessUnregistration))
    if run_resource_id(message.run_id) != claim.resource_id:
        raise RunnerCallRejectedError(f"{declared.name} names another run than the runner's own")
    return AgentCall(declared, message)


def apply_agent_call(
    tx: Transaction, claim: Claim, runner_epoch: str, call: AgentCall, *, lease_ms: int
) -> AgentCallResult:
    """Apply a decoded agent call of runner ``runner_epoch`` (launched with ``claim``).

    ``process.register`` is applied under ``claim`` (renewed first; :class:`ClaimLostError`
    when it is stale, nothing written); ``process.unregister`` needs no claim. Results and
    refusals are those of :func:`~piwf.state.execution.headless.apply_process_register` and
    :func:`~piwf.state.execution.headless.apply_process_unregister`.
    """
    if isinstance(call.message, ProcessRegistration):
        return headless.apply_process_register(
            tx, claim, runner_epoch, call.message, lease_ms=lease_ms
        )
    return headless.apply_process_unregister(tx, runner_epoch, call.message)
