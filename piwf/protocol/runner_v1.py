"""The private runner protocol ``piwf.runner.v1`` between the server and one runner child.

One ``multiprocessing.connection`` pipe per child; every message is canonical JSON, at most
1 MiB (``send_bytes``/``recv_bytes(maxlength)``; nothing is ever pickled)::

    server → child   launch    {schema, kind: "launch", runId, generation, runnerEpoch,
                                serverEpoch, projectPath?, workflowSource: {root, mounted},
                                definitionDigest, protocolVersion: 1}
    child → server   ready     {schema, kind: "ready", runId, generation, runnerEpoch}
                  or sourceChanged {..., kind: "sourceChanged", files: [location, ...]}
    server → child   command   {schema, kind: "command", command: {command, runId, ...},
                                revision}
    child → server   call      {schema, kind: "call", runId, generation, runnerEpoch,
                                messageId, expectedRevision?, operation, payload}
                                (operation: one of OPERATIONS, declared below)
    server → child   response  {schema, kind: "response", messageId, outcome, result?, error?}
    child → server   exiting   {schema, kind: "exiting", runId, generation, runnerEpoch,
                                status}

A payload or result whose frame would pass 1 MiB travels as a digest-bound content reference
(:mod:`piwf.protocol.content`), moved in 512 KiB parts with the ``content.part`` (child to
server) and ``content.read`` (server to child) calls.

The server checks ``runId``, ``generation`` and ``runnerEpoch`` of every child message before it
reads the payload; a message from another generation gets one ``claimLost`` response and the
child exits. Outcomes: ``accepted`` (a new change), ``adopted`` (a repeat of a stored message
answers identically), ``rejected`` (the payload failed validation), ``claimLost``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.workflow import port

SCHEMA: Final = "piwf.runner.v1"
PROTOCOL_VERSION: Final = 1


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

#: Port operation name → its declaration.
PORT_OPERATION: Mapping[str, PortOperation] = {op.name: op for op in PORT_OPERATIONS}

#: Port message type → the operation that carries it.
OPERATION_OF_MESSAGE: Mapping[type[Any], PortOperation] = {op.message: op for op in PORT_OPERATIONS}

#: Every operation a ``call`` may name.
OPERATIONS: tuple[str, ...] = tuple(op.name for op in PORT_OPERATIONS) + CONTENT_OPERATIONS

_ID = Field(min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def encode(self) -> bytes:
        """Canonical JSON bytes of the message."""
        return canonical.encode(self.model_dump(by_alias=True, exclude_none=True))


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
    status: str | None = Field(default=None, max_length=64)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @field_validator("operation")
    @classmethod
    def _declared_operation(cls, value: str | None) -> str | None:
        if value is not None and value not in OPERATIONS:
            raise ValueError("not a runner.v1 operation")
        return value


class Command(_Model):
    """The one explicit command the server sends after ``ready``."""

    schema_: Literal["piwf.runner.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["command"] = "command"
    command: dict[str, Any]
    #: The run revision the child starts from; every state-changing call names the revision it
    #: expects, and a call made against another revision changes nothing.
    revision: int = Field(ge=0)

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
