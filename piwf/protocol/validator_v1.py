"""The private validation protocol ``piwf.validator.v1`` between the server and one validation
child (:mod:`piwf.runner.validator`, ``ChildKind.VALIDATOR``).

One pipe, canonical JSON frames of at most 1 MiB (``send_bytes``/``recv_bytes(maxlength)``;
nothing is pickled). One child validates one candidate output of one agent request::

    server → child  validate  {schema, kind: "validate", validationId, runId, requestId,
                               projectPath?, workflowSource: {root, mounted}, definitionDigest,
                               timeoutMs, context}
                    context: {"savedRun": SavedRun, "candidate": output} inline, or, when that
                    frame would pass the bound, a content reference {"$content": {sha256, bytes}}
    child → server  read      {schema, kind: "read", validationId, sha256, offset}
    server → child  part      {schema, kind: "part", validationId, data, nextOffset, complete}
                              (only for a referenced context; parts of at most 512 KiB)
    child → server  result    {schema, kind: "result", validationId, outcome: "accepted",
                               value}                             the (normalised) output
                           or {..., outcome: "rejected", error}   what to submit instead

The child verifies every source hash before it imports anything of the workflow. A normalised
``value`` whose result frame would pass the bound is not sent: the child rejects the candidate
instead, saying so. The server checks ``validationId`` before it reads anything else, and only a
``validating`` submission whose current validation id it is may be settled by the reply.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from piwf import canonical
from piwf.protocol import content

SCHEMA: Final = "piwf.validator.v1"


class _Model(BaseModel):
    # Built on first use (``defer_build``): only a run with a validated output needs them.
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, populate_by_name=True, defer_build=True
    )

    def encode(self) -> bytes:
        """Canonical JSON bytes of the message."""
        return canonical.encode(self.model_dump(by_alias=True, exclude_none=True))


class Validate(_Model):
    """The one request a validation child gets: what to load, which visit, which candidate."""

    schema_: Literal["piwf.validator.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["validate"] = "validate"
    validation_id: str = Field(alias="validationId", min_length=1, max_length=256)
    run_id: str = Field(alias="runId", min_length=1, max_length=256)
    request_id: str = Field(alias="requestId", min_length=1, max_length=256)
    project_path: str | None = Field(default=None, alias="projectPath")
    workflow_source: dict[str, Any] = Field(alias="workflowSource")
    definition_digest: str = Field(alias="definitionDigest", min_length=64, max_length=64)
    timeout_ms: int = Field(alias="timeoutMs", ge=1, le=3_600_000)
    #: ``{"savedRun": ..., "candidate": ...}`` or a content reference to that object.
    context: dict[str, Any]


class Read(_Model):
    """The child asks for the part of the referenced context at ``offset``."""

    schema_: Literal["piwf.validator.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["read"] = "read"
    validation_id: str = Field(alias="validationId", min_length=1, max_length=256)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    offset: int = Field(ge=0, le=content.MAX_CONTENT_BYTES)


class Part(_Model):
    """One part of the referenced context (:func:`piwf.protocol.content.part`)."""

    schema_: Literal["piwf.validator.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["part"] = "part"
    validation_id: str = Field(alias="validationId", min_length=1, max_length=256)
    data: str
    next_offset: int = Field(alias="nextOffset", ge=0)
    complete: bool


class Result(_Model):
    """The child's verdict: ``value`` when accepted, ``error`` when rejected."""

    schema_: Literal["piwf.validator.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["result"] = "result"
    validation_id: str = Field(alias="validationId", min_length=1, max_length=256)
    outcome: Literal["accepted", "rejected"]
    value: Any = None
    error: str | None = Field(default=None, max_length=8000)


def child_message(data: bytes) -> Read | Result:
    """Parse one child frame (raises ``CanonicalJsonError`` or pydantic ``ValidationError``)."""
    body = canonical.decode(data)
    if isinstance(body, dict) and body.get("kind") == "read":
        return Read.model_validate(body)
    return Result.model_validate(body)
