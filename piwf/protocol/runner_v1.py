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

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from piwf import canonical
from piwf.canonical import JsonValue

SCHEMA: Final = "piwf.runner.v1"
PROTOCOL_VERSION: Final = 1

#: Port methods a runner may call, plus ``read_run``.
OPERATIONS = (
    "read_run",
    "begin_run",
    "node_started",
    "node_finished",
    "node_failed",
    "reserve_effect",
    "settle_effect",
    "publish_update",
    "notify",
    "request_interaction",
    "reject_answer",
    "park",
    "finish",
    "content.read",
    "content.part",
)

Operation = Literal[
    "read_run",
    "begin_run",
    "node_started",
    "node_finished",
    "node_failed",
    "reserve_effect",
    "settle_effect",
    "publish_update",
    "notify",
    "request_interaction",
    "reject_answer",
    "park",
    "finish",
    "content.read",
    "content.part",
]

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
    operation: Operation | None = None
    payload: dict[str, Any] | None = None
    files: list[str] | None = None
    status: str | None = Field(default=None, max_length=64)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


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
