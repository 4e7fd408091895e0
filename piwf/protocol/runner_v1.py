"""The private runner protocol ``piwf.runner.v1`` between the server and one runner child.

One ``multiprocessing.connection`` pipe per child; every message is canonical JSON, at most
1 MiB (``send_bytes``/``recv_bytes(maxlength)``; nothing is ever pickled)::

    server → child   launch    {schema, kind: "launch", runId, generation, runnerEpoch,
                                serverEpoch, projectPath?, workflowSource: {root, mounted},
                                definitionDigest, protocolVersion: 1, executionMode,
                                runAgentCommand?, serverAgentCommand?, stateHome?}
    child → server   ready     {schema, kind: "ready", runId, generation, runnerEpoch}
                  or sourceChanged {..., kind: "sourceChanged", files: [location, ...],
                                    missing: [location, ...]}  (files: changed bytes;
                                    missing: unreadable)
    server → child   command   {schema, kind: "command", command: {command, runId, ...},
                                revision, run?, stepCount?}
    child → server   call      {schema, kind: "call", runId, generation, runnerEpoch,
                                messageId, expectedRevision?, operation, payload}
                                (operation: one of OPERATIONS, declared below)
    server → child   response  {schema, kind: "response", messageId, outcome, result?, error?}
    server → child   interaction.settled {schema, kind, requestId}   (unsolicited: the agent
                                request the runner's command works on is no longer pending)
    child → server   exiting   {schema, kind: "exiting", runId, generation, runnerEpoch,
                                status}

Headless agent steps (docs/AGENTS.md) add two calls, declared once in
:data:`AGENT_OPERATIONS`: ``process.register`` (the agent command process the runner started,
before it writes the prompt; under the runner's live claim; the answer starts a turn) and
``process.unregister`` (after the command's process group is shut down; valid after the claim
is released; the answer carries the request's state).

A ``batch`` call (:class:`Batch`) carries up to :data:`MAX_BATCH_CALLS` state-changing port
calls, each with its own message id and receipt, applied in order in one transaction: the
runner sends a node's end with the next node's start, and the run's start with its first
node's, so a node costs one commit. Its result lists one response per call judged.

A payload or result whose frame would pass 1 MiB travels as a digest-bound content reference
(:mod:`piwf.protocol.content`), moved in 512 KiB parts with the ``content.part`` (child to
server) and ``content.read`` (server to child) calls.

A saved run is never sent whole when it is long: ``read_run`` answers (and the command carries)
the run with its first steps and the count of all of them (:class:`RunHead`), and the runner
reads the other steps in pages of about :data:`STEP_PAGE_BYTES` with ``steps.read``, so a run of
any length resumes with bounded frames and bounded server work per call.

The server checks ``runId``, ``generation`` and ``runnerEpoch`` of every child message before it
reads the payload; a message from another generation gets one ``claimLost`` response and the
child exits. Outcomes: ``accepted`` (a new change), ``adopted`` (a repeat of a stored message
answers identically), ``rejected`` (the payload failed validation), ``claimLost``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.workflow import port

SCHEMA: Final = "piwf.runner.v1"
PROTOCOL_VERSION: Final = 1
#: An agent request's unproductive turns after which its attempt fails ``missingSubmission``;
#: the turns before that each get one reminder turn (the server counts, the runner decides).
MAX_UNPRODUCTIVE_TURNS: Final = 3


@dataclass(frozen=True)
class PortOperation:
    """One method of :class:`~piwf.workflow.port.WorkflowPort`, as a runner calls it.

    ``message`` is the dataclass the call's payload decodes to (strictly, by
    :func:`piwf.workflow.port_codec.from_json`). A call that ``changes_state`` is applied by the
    store function named ``apply_<name>`` under the runner's own claim, with a stored receipt,
    and names the run revision it expects; any other call is a read.
    """

    name: str
    message: type[Any]
    changes_state: bool


#: Every port operation, declared once: the codec, the store's dispatch table, the runner's
#: port and the operations table of docs/EXECUTION.md are derived from (and tested against) it.
PORT_OPERATIONS: tuple[PortOperation, ...] = (
    PortOperation("read_run", port.RunRead, changes_state=False),
    PortOperation("begin_run", port.RunBegun, changes_state=True),
    PortOperation("node_started", port.NodeStarted, changes_state=True),
    PortOperation("node_finished", port.NodeFinished, changes_state=True),
    PortOperation("node_failed", port.NodeFailed, changes_state=True),
    PortOperation("reserve_effect", port.EffectReservation, changes_state=True),
    PortOperation("settle_effect", port.EffectSettlement, changes_state=True),
    PortOperation("publish_update", port.UpdatePublished, changes_state=True),
    PortOperation("notify", port.NotificationRequested, changes_state=True),
    PortOperation("request_interaction", port.InteractionRequested, changes_state=True),
    PortOperation("park", port.RunParked, changes_state=True),
    PortOperation("finish", port.RunFinished, changes_state=True),
)

#: Transport calls that move values too large for one frame (:mod:`piwf.protocol.content`).
CONTENT_OPERATIONS = ("content.read", "content.part")

#: The call that reads a saved run's steps after its first ones, a page at a time: ``read_run``
#: (and the command) carry the run with its first steps and the count of them all
#: (:class:`RunHead`), and ``steps.read`` (:class:`StepsRead` → :class:`StepsPage`) the rest.
STEPS_OPERATION = "steps.read"

#: What a page of steps may hold: its stored outputs and errors plus a fixed cost per step
#: (one step is always sent, whatever its size; a page whose frame passes 1 MiB travels by
#: content reference like any result).
STEP_PAGE_BYTES: Final = 512 * 1024

#: Port operation name → its declaration.
PORT_OPERATION: Mapping[str, PortOperation] = {op.name: op for op in PORT_OPERATIONS}

#: Port message type → the operation that carries it.
OPERATION_OF_MESSAGE: Mapping[type[Any], PortOperation] = {op.message: op for op in PORT_OPERATIONS}

_ID = Field(min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def encode(self) -> bytes:
        """Canonical JSON bytes of the message."""
        return canonical.encode(self.model_dump(by_alias=True, exclude_none=True))


class _Call(_Model):
    """A call payload or result model (camelCase on the wire)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    def to_json(self) -> dict[str, JsonValue]:
        """The wire form (what the call carries)."""
        value: dict[str, JsonValue] = self.model_dump(by_alias=True, exclude_none=True)
        return value


class ProcessRegistration(_Call):
    """``process.register``: the agent command process a runner started for an agent request,
    registered before the runner writes its prompt. ``pgid`` is its own process group."""

    run_id: str = Field(alias="runId", min_length=1, max_length=256)
    request_id: str = Field(alias="requestId", min_length=1, max_length=256)
    pid: int = Field(gt=0)
    start_identity: str = Field(alias="startIdentity", min_length=1, max_length=256)
    pgid: int = Field(gt=0)


class ProcessUnregistration(_Call):
    """``process.unregister``: the registered process's group is shut down; ``exitCode`` is the
    command's own (a negative number: the signal that ended it), when known."""

    run_id: str = Field(alias="runId", min_length=1, max_length=256)
    request_id: str = Field(alias="requestId", min_length=1, max_length=256)
    start_identity: str = Field(alias="startIdentity", min_length=1, max_length=256)
    exit_code: int | None = Field(default=None, alias="exitCode")


class AgentRequestState(_Call):
    """Where an agent request stands: ``answered`` (an accepted submission: ``value``),
    ``pending`` (``rejection``: the latest rejected submission's error, if any), ``expired``
    (its active-time deadline passed) or ``cancelled`` (its run or visit ended)."""

    status: Literal["pending", "answered", "expired", "cancelled"]
    value: Any = None
    rejection: str | None = None


class TurnStarted(_Call):
    """The answer to ``process.register``: the turn number, how many earlier turns ended
    unproductive (1 or 2: this turn is a reminder), the stored prompt and the request's state
    (anything but ``pending``: stop the command, the step is decided)."""

    turn: int = Field(ge=1)
    unproductive_turns: int = Field(alias="unproductiveTurns", ge=0)
    prompt: str
    request: AgentRequestState


class TurnEnded(_Call):
    """The answer to ``process.unregister``: the request's state after the turn and the
    unproductive turns counted so far (this one included when the request is still pending)."""

    unproductive_turns: int = Field(alias="unproductiveTurns", ge=0)
    request: AgentRequestState


@dataclass(frozen=True)
class AgentOperation:
    """A runner call about its headless agent command (not a port operation).

    ``message`` is the payload model and ``result`` the model of an accepted answer. A call
    that ``needs_live_claim`` is applied under the runner's own live claim (its renewal fails
    the call ``claimLost``); the other stays valid after the claim was released. Neither
    changes the run revision: they are supervision records, like the runner rows.
    """

    name: str
    message: type[_Call]
    result: type[_Call]
    needs_live_claim: bool


#: The headless agent calls, declared once.
AGENT_OPERATIONS: tuple[AgentOperation, ...] = (
    AgentOperation("process.register", ProcessRegistration, TurnStarted, needs_live_claim=True),
    AgentOperation("process.unregister", ProcessUnregistration, TurnEnded, needs_live_claim=False),
)

#: Agent operation name → its declaration.
AGENT_OPERATION: Mapping[str, AgentOperation] = {op.name: op for op in AGENT_OPERATIONS}

#: The call that carries several state-changing port calls in one frame (:class:`Batch`).
BATCH_OPERATION: Final = "batch"
#: The most port calls one batch carries.
MAX_BATCH_CALLS: Final = 4

#: Every operation a ``call`` may name.
OPERATIONS: tuple[str, ...] = (
    tuple(op.name for op in PORT_OPERATIONS)
    + CONTENT_OPERATIONS
    + (STEPS_OPERATION,)
    + tuple(op.name for op in AGENT_OPERATIONS)
    + (BATCH_OPERATION,)
)


class BatchedCall(_Call):
    """One port call inside a :class:`Batch`: its own message id (its receipt's) and a
    state-changing port operation with its payload, inline (never a content reference)."""

    message_id: str = Field(
        alias="messageId", min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$"
    )
    operation: str = Field(max_length=64)
    payload: dict[str, Any]

    @field_validator("operation")
    @classmethod
    def _state_changing(cls, value: str) -> str:
        declared = PORT_OPERATION.get(value)
        if declared is None or not declared.changes_state:
            raise ValueError("a batch carries state-changing port operations only")
        return value


class Batch(_Call):
    """``batch``: port calls the runner sends together, applied in order in one transaction.

    The batch call's ``expectedRevision`` is the first call's; each later call is judged
    against the revision the one before it left (nothing else commits in between). The first
    call that is not applied ends the batch: the calls after it are not applied, and the
    answer lists a response for each call up to that one.
    """

    calls: list[BatchedCall] = Field(min_length=2, max_length=MAX_BATCH_CALLS)

    @field_validator("calls")
    @classmethod
    def _distinct_ids(cls, value: list[BatchedCall]) -> list[BatchedCall]:
        if len({call.message_id for call in value}) != len(value):
            raise ValueError("every call of a batch has its own message id")
        return value


class BatchedResponse(_Call):
    """The answer to one call of a batch (the fields of a :class:`CallResponse`)."""

    message_id: str = Field(alias="messageId", min_length=1, max_length=256)
    outcome: Literal["accepted", "adopted", "rejected", "claimLost"]
    result: Any = None
    error: str | None = Field(default=None, max_length=1024)


class BatchResult(_Call):
    """The result of an ``accepted`` batch call: one response per call that was judged."""

    responses: list[BatchedResponse] = Field(min_length=1, max_length=MAX_BATCH_CALLS)


class Launch(_Model):
    """What one runner generation may do; recorded in ``run_runners`` before the spawn."""

    schema_: Literal["piwf.runner.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["launch"] = "launch"
    run_id: str = Field(alias="runId", min_length=1, max_length=256)
    generation: int = Field(ge=1)
    runner_epoch: str = Field(alias="runnerEpoch", min_length=1, max_length=256)
    server_epoch: int = Field(alias="serverEpoch", ge=1)
    project_path: str | None = Field(default=None, alias="projectPath")
    workflow_source: dict[str, Any] = Field(alias="workflowSource")
    definition_digest: str = Field(alias="definitionDigest", min_length=64, max_length=64)
    protocol_version: Literal[1] = Field(default=PROTOCOL_VERSION, alias="protocolVersion")
    #: ``headless`` runs give agent steps to an agent command (docs/AGENTS.md).
    execution_mode: Literal["headless", "interactive"] = Field(
        default="headless", alias="executionMode"
    )
    #: The run's own agent command (``--agent-command``); it wins over the node's.
    run_agent_command: list[str] | None = Field(default=None, alias="runAgentCommand")
    #: The server's agent command (``PIWF_AGENT_COMMAND``), used when neither the run nor
    #: the node names one.
    server_agent_command: list[str] | None = Field(default=None, alias="serverAgentCommand")
    #: The server's state home: the agent command's ``PIWF_HOME``.
    state_home: str | None = Field(default=None, alias="stateHome")

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class InteractionSettled(_Model):
    """Server → runner, unsolicited: the agent request ``requestId`` is no longer pending (a
    submission was accepted, it expired or it was cancelled) while the runner's command still
    runs; the runner stops the command after a short grace and asks for the state."""

    schema_: Literal["piwf.runner.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["interaction.settled"] = "interaction.settled"
    request_id: str = Field(alias="requestId", min_length=1, max_length=256)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class ChildMessage(_Model):
    """Any message a child sends; ``kind`` decides which optional fields it carries."""

    schema_: Literal["piwf.runner.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["ready", "sourceChanged", "call", "exiting"]
    run_id: str = Field(alias="runId", min_length=1, max_length=256)
    generation: int = Field(ge=1)
    runner_epoch: str = Field(alias="runnerEpoch", min_length=1, max_length=256)
    message_id: str | None = Field(default=None, alias="messageId", max_length=256)
    expected_revision: int | None = Field(default=None, alias="expectedRevision", ge=0)
    operation: str | None = Field(default=None, max_length=64)
    payload: dict[str, Any] | None = None
    files: list[str] | None = None
    missing: list[str] | None = None
    status: str | None = Field(default=None, max_length=64)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @field_validator("operation")
    @classmethod
    def _declared_operation(cls, value: str | None) -> str | None:
        if value is not None and value not in OPERATIONS:
            raise ValueError("not a runner.v1 operation")
        return value


class RunHead(_Call):
    """A saved run with its first steps: the answer to ``read_run``. ``run`` is a ``SavedRun``
    in its port JSON form whose ``steps`` are the first of the run's ``stepCount`` steps; the
    reader asks for the rest with ``steps.read``. Steps are append-only, so every later page
    is exactly a step this head counted."""

    run: dict[str, Any]
    step_count: int = Field(alias="stepCount", ge=0)


class StepsRead(_Call):
    """``steps.read``: the saved steps of ``runId`` from index ``start`` on, before ``stop``."""

    run_id: str = Field(alias="runId", min_length=1, max_length=256)
    start: int = Field(ge=0)
    stop: int = Field(ge=1)

    @model_validator(mode="after")
    def _a_range(self) -> StepsRead:
        if self.start >= self.stop:
            raise ValueError("steps.read needs start < stop")
        return self


class StepsPage(_Call):
    """The answer to ``steps.read``: the next steps in order (``StepRecord`` port JSON), at
    least one and at most ``stop - start``, within :data:`STEP_PAGE_BYTES` unless one step
    alone is larger."""

    steps: list[dict[str, Any]] = Field(min_length=1)


class Command(_Model):
    """The one explicit command the server sends after ``ready``."""

    schema_: Literal["piwf.runner.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["command"] = "command"
    command: dict[str, Any]
    #: The run revision the child starts from; every state-changing call names the revision it
    #: expects, and a call made against another revision changes nothing.
    revision: int = Field(ge=0)
    #: The run's saved state at ``revision`` (a ``SavedRun`` in its port JSON form), read in
    #: the transaction that read ``revision``, so the child's first ``read_run`` of its own run
    #: needs no round trip. Absent when it would not fit in one frame: the child reads it then.
    #: Its ``steps`` are the first of the run's ``stepCount`` steps (:class:`RunHead`); the
    #: child reads the rest with ``steps.read``.
    run: dict[str, Any] | None = None
    step_count: int | None = Field(default=None, alias="stepCount", ge=0)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class CallResponse(_Model):
    """The server's answer to one ``call``."""

    schema_: Literal["piwf.runner.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["response"] = "response"
    message_id: str = Field(alias="messageId", min_length=1, max_length=256)
    outcome: Literal["accepted", "adopted", "rejected", "claimLost"]
    result: Any = None
    error: str | None = Field(default=None, max_length=1024)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


def decode_json(data: bytes) -> JsonValue:
    """Decode one canonical JSON message body (raises ``CanonicalJsonError``)."""
    return canonical.decode(data)
