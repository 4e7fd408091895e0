"""Shared pieces of the operation handlers: payload validation, answers and typed errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import ValidationError

from piwf.canonical import JsonValue
from piwf.config import REQUEST_ID_PREFIX
from piwf.errors import PiwfError, RunCommandError, StaleRevisionError
from piwf.lifecycle import Adopted, Applied, Conflict, RecoveryRequired
from piwf.protocol.client_v1 import ErrorInfo, Request, Response
from piwf.protocol.payloads import EffectInfo, RunInfo, RunReceipt, WireModel
from piwf.server.commands import CommandResult
from piwf.state import Transaction
from piwf.state import effects as fx
from piwf.state.execution import list_open_requests
from piwf.state.execution import runs as run_store
from piwf.state.execution.requests import agent_request_host
from piwf.state.resources.managed import RESOURCE_UID_PREFIX
from piwf.state.resources.runners import RECONCILE_ID_PREFIX

P = TypeVar("P", bound=WireModel)


class InvalidPayloadError(PiwfError):
    """A request payload does not match its operation's schema; nothing was done."""

    code = "invalidPayload"


class UnknownRunError(PiwfError):
    """The request names a run that does not exist."""

    code = "runNotFound"


class UnknownEffectError(PiwfError):
    """The request names an effect that does not exist."""

    code = "effectNotFound"


def effect_info(effect: fx.Effect) -> EffectInfo:
    """The wire form of an effect (no request or result payloads)."""
    return EffectInfo(
        effect_id=effect.effect_id,
        effect_type=effect.effect_type,
        recovery=effect.recovery.value,
        status=effect.status.value,
        attempt_count=effect.attempt_count,
    )


def run_result(result: object, run_id: str) -> CommandResult:
    """Turn a typed run transition result into a stored command result: ``Applied`` is a
    receipt with ``outcome: changed``, ``Adopted`` (nothing to do) one with ``unchanged``."""
    if isinstance(result, Conflict):
        return CommandResult.failed("rejected", RunCommandError(result.evidence), run_id=run_id)
    if isinstance(result, RecoveryRequired):
        return CommandResult.failed("rejected", RunCommandError(result.reason), run_id=run_id)
    assert isinstance(result, (Applied, Adopted))
    view = result.value
    assert isinstance(view, run_store.RunRow)
    outcome: Literal["changed", "unchanged"] = (
        "changed" if isinstance(result, Applied) else "unchanged"
    )
    receipt = RunReceipt(run=run_info(view), outcome=outcome).to_wire()
    return CommandResult.accepted(receipt, run_id=view.run_id, revision=view.revision)


def stale_revision(request: Request, run: run_store.RunRow) -> CommandResult | None:
    """The ``conflict`` (``staleRevision``) for a request whose ``expectedRevision`` is not the
    run's current revision, checked before anything else so that a compare-and-set never acts
    on a run that changed since the client read it; None when it matches or none was sent."""
    expected = request.expected_revision
    if expected is None or expected == run.revision:
        return None
    stale = StaleRevisionError(
        f"run {run.run_id}",
        expected,
        run.revision,
        next_step=f"read it again (piwf run show {run.run_id}) and decide with its current state",
    )
    return CommandResult.failed("conflict", stale, run_id=run.run_id)


def payload_of(request: Request, model: type[P]) -> P:
    """Validate the request payload; raise :class:`InvalidPayloadError` naming the field."""
    try:
        return model.model_validate(request.payload)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        raise InvalidPayloadError(f"{request.operation} payload: {where}: {first['msg']}") from None


def project_of(project_path: str | None) -> Path | None:
    """The project directory a payload names; raise :class:`InvalidPayloadError` for a relative
    one (the server's working directory means nothing to the client that sent it)."""
    if project_path is None:
        return None
    project = Path(project_path)
    if not project.is_absolute():
        raise InvalidPayloadError("projectPath must be an absolute path: the project's full path")
    return project


def run_id_of(request: Request) -> str:
    """The run id of a request that needs one; raise :class:`InvalidPayloadError` if absent."""
    if request.run_id is None:
        raise InvalidPayloadError(f"{request.operation} needs a runId")
    return request.run_id


def run_info(view: run_store.RunRow) -> RunInfo:
    """The wire form of a run view."""
    return RunInfo.model_validate(view.to_json())


def ok(request: Request, receipt: WireModel, *, revision: int | None = None) -> Response:
    """An ``accepted`` answer carrying ``receipt``."""
    return Response(
        request_id=request.request_id,
        outcome="accepted",
        receipt=receipt.to_wire(),
        revision=revision,
    )


def error_response(request: Request, outcome: str, code: str, message: str) -> Response:
    """A non-success answer with an error code and a bounded message."""
    return Response(
        request_id=request.request_id,
        outcome=outcome,  # type: ignore[arg-type]
        error=ErrorInfo(code=code, message=message[:1000]),
    )


def not_found(request: Request, run_id: str, home: Path) -> Response:
    """The ``notFound`` answer for an unknown run of the state home ``home``."""
    return error_response(request, "notFound", "runNotFound", unknown_run(run_id, home))


def no_run(run_id: str, home: Path) -> CommandResult:
    """The ``notFound`` outcome of a command naming a run the state home ``home`` lacks."""
    return CommandResult.failed("notFound", UnknownRunError(unknown_run(run_id, home)))


def unknown_run(run_id: str, home: Path) -> str:
    """What to say about a run id the state home ``home`` does not have, and where to look
    (another kind's id: what it is instead, :func:`wrong_kind`)."""
    return wrong_kind(f"no run {run_id}", run_id, "run") or (
        f"no run {run_id} (piwf run list shows the runs of this state home, PIWF_HOME={home})"
    )


#: The command that settles a pending request of each kind (``{request}``: its id).
REQUEST_COMMANDS: dict[str, str] = {
    "checkpoint": "piwf answer {request} VALUE",
    "human_decision": """piwf answer {request} '{{"choice": "<choice>"}}'""",
    "agent": "piwf submit {request} '<json>'",
}


def request_command(kind: str) -> str:
    """The command template (``{request}`` for the id) that settles a request of ``kind``."""
    return REQUEST_COMMANDS.get(kind, REQUEST_COMMANDS["checkpoint"])


@dataclass(frozen=True)
class IdKind:
    """One kind of id piwf makes, told by how it starts, and the command a person runs for it."""

    name: str
    prefix: str
    #: What the id is, after "that is" (``a run id``).
    called: str
    #: The command to run instead; ``{id}`` is the id given, or ``placeholder`` when the id
    #: has a character a shell would read (the hint is there to be copied).
    command: str
    placeholder: str = ""


#: The kinds of ids a person copies from piwf's output, each with the command that takes it.
#: Only the commands ``piwf --help`` lists: a request and an effect have no ``show`` of their own.
ID_KINDS: tuple[IdKind, ...] = (
    IdKind("run", run_store.RUN_ID_PREFIX, "a run id", "piwf run show {id}", "RUN_ID"),
    IdKind(
        "request",
        REQUEST_ID_PREFIX,
        "a request id",
        "piwf requests lists it while it is pending; "
        + " or ".join(
            request_command(kind).format(request="{id}") for kind in ("checkpoint", "agent")
        )
        + " settles it",
        "REQUEST_ID",
    ),
    IdKind(
        "effect",
        fx.EFFECT_ID_PREFIX,
        "an effect id",
        "piwf run show RUN_ID lists a run's effects; piwf effect resolve {id} --applied |"
        " --retry settles an ambiguous one",
        "EFFECT_ID",
    ),
    IdKind(
        "resource",
        RESOURCE_UID_PREFIX,
        "a managed resource's uid",
        "piwf resource list shows the resources; piwf resource get MANAGER KEY shows one",
    ),
    IdKind(
        "reconcile",
        RECONCILE_ID_PREFIX,
        "a reconcile id",
        "piwf resource get MANAGER KEY lists a resource's recent reconciles",
    ),
)

#: An id that is safe to print inside a command a person may paste into a shell.
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_.:@+=,/-]+")


def wrong_kind(head: str, given: str, expected: str) -> str | None:
    """``head`` (``no run request-1f2e``) and what ``given`` is instead, when it starts as
    another kind's id than ``expected`` (an :class:`IdKind` name): ``no run request-1f2e: that
    is a request id (piwf requests ...)``. None when it starts as none of them or as
    ``expected``: the caller says what it says of an unknown id of the right kind.

    The id is printable ASCII (the protocol's id rule), so it needs no escaping here; the
    CLI escapes what it prints. It is named in the command only when a shell takes it as is.
    """
    for kind in ID_KINDS:
        if kind.name != expected and given.startswith(kind.prefix):
            shown = given if _SHELL_SAFE.fullmatch(given) else kind.placeholder
            return f"{head}: that is {kind.called} ({kind.command.format(id=shown)})"
    return None


def unknown_request(tx: Transaction, request_id: str, home: Path) -> str:
    """What to say about a request id the state home ``home`` does not have.

    A run's id given where a request id belongs (``piwf answer RUN_ID ...``) is named as such,
    with the run's open requests and the command that settles each, or the fact it has none;
    an unknown id of another kind, as :func:`wrong_kind` says.
    """
    run = run_store.load_run(tx, request_id)
    if run is None:
        return wrong_kind(f"no request {request_id}", request_id, "request") or (
            f"no request {request_id} (piwf requests lists the pending requests of this state"
            f" home, PIWF_HOME={home})"
        )
    run_id = request_id  # the id given names a run, not a request
    head = f"{run_id} is a run id, not a request id"
    found = list_open_requests(tx, run_id)
    if not found:
        return (
            f"{head}; the run waits on no request now"
            f" (piwf run explain {run_id} says what it is doing)"
        )
    waits = "; ".join(
        f'request {item.request_id} ({item.kind} at node "{item.path}"): '
        + (
            agent_request_host(tx, run_id, item.kind)
            or request_command(item.kind).format(request=item.request_id)
        )
        + (f" (choices: {', '.join(item.choices)})" if item.choices else "")
        for item in found
    )
    paused = f" (the run is paused: piwf run resume {run_id} first)" if run.paused else ""
    return f"{head}; the run waits on {waits}{paused}"


def unknown_effect(effect_id: str, home: Path) -> str:
    """What to say about an effect id the state home ``home`` does not have (another kind's id:
    what it is instead, :func:`wrong_kind`)."""
    return wrong_kind(f"no effect {effect_id}", effect_id, "effect") or (
        f"no effect {effect_id} (piwf run show RUN_ID lists the effects of a run of this state"
        f" home, PIWF_HOME={home})"
    )


def unknown_channel_send(effect_id: str, home: Path) -> str:
    """What to say about an effect id that is no channel send of the state home ``home``: where
    the ambiguous sends are listed, and the command for another kind of effect (another kind's
    id: what it is instead, :func:`wrong_kind`)."""
    return wrong_kind(f"no channel send {effect_id}", effect_id, "effect") or (
        f"no channel send {effect_id} (piwf channel status lists the ambiguous sends of this"
        f" state home, PIWF_HOME={home}; the effect of a run step is settled with piwf effect"
        " resolve EFFECT_ID --applied | --retry)"
    )


def unknown_resource(manager: str, key: str, home: Path) -> str:
    """What to say about a managed resource the state home ``home`` does not have."""
    return (
        f"no resource {key!r} of manager {manager!r} (piwf resource list shows the resources"
        f" of this state home, PIWF_HOME={home})"
    )


def as_int(value: JsonValue) -> int:
    """A count from a status mapping (0 for anything that is not a number)."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def as_int_map(value: JsonValue) -> dict[str, int]:
    """A mapping of counts from a status mapping."""
    if not isinstance(value, dict):
        return {}
    return {key: as_int(item) for key, item in value.items()}
