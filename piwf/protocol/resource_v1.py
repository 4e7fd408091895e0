"""The private resource-runner protocol ``piwf.resource.v1`` between the server and one child.

Same transport and rules as the workflow runner (:mod:`piwf.protocol.runner_v1`): one
``multiprocessing.connection`` pipe per child, canonical JSON frames of at most 1 MiB
(``send_bytes``/``recv_bytes(maxlength)``; nothing pickled), and the server checks
``reconcileId`` and ``generation`` of every child message before it reads the payload::

    server → child   launch    {schema, kind: "launch", reconcileId, generation, serverEpoch,
                                manager, projectPath?, stateHome, deadlineMs, resource,
                                protocolVersion: 1}
    child → server   ready     {schema, kind: "ready", reconcileId, generation, sourceDigest}
    server → child   start     {schema, kind: "start"}
    child → server   call      {schema, kind: "call", reconcileId, generation, messageId,
                                operation, payload}
    server → child   response  {schema, kind: "response", messageId, outcome, result?, error?,
                                errorCode?}
    child → server   exiting   {schema, kind: "exiting", reconcileId, generation}

Operations and payloads (each payload model refuses unknown fields)::

    effect.reserve    {key, kind, request}                 -> {effectId, status, attempt, ...}
    effect.begin      {effectId}                           -> {effectId, status, attempt}
    effect.settle     {effectId, attempt, outcome, observed, result?, error?} -> effect state
    workflow.ensure   {requestKey, workflow, input, resolved?} -> {found: false} | child run
    reconcile.finish  {kind, afterMs?, patch: {status?, conditions?, finalizers?}} -> {outcome}
    reconcile.fail    {error}                               -> {dueAt}

Outcomes: ``accepted``, ``rejected`` (the request was refused; ``error``/``errorCode`` say why)
and ``claimLost`` (another owner holds the resource now: the child stops and writes nothing).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from piwf import canonical
from piwf.resource.definition import (
    CONDITION_TYPE_PATTERN,
    FINALIZER_PATTERN,
    MAX_CONDITIONS,
    MAX_FINALIZERS,
    MAX_REQUEUE_AFTER_MS,
    MAX_STATUS_BYTES,
)

SCHEMA: Final = "piwf.resource.v1"
PROTOCOL_VERSION: Final = 1

Operation = Literal[
    "effect.reserve",
    "effect.begin",
    "effect.settle",
    "workflow.ensure",
    "reconcile.finish",
    "reconcile.fail",
]


class _Frame(BaseModel):
    # Built on first use (``defer_build``), here and in ``_Payload``: only a server whose
    # runs use a resource manager, and its reconcile children, ever validate these.
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        defer_build=True,
    )

    def encode(self) -> bytes:
        """Canonical JSON bytes of the message."""
        return canonical.encode(self.model_dump(by_alias=True, exclude_none=True))


class _Payload(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        defer_build=True,
    )


class ReconcileLaunch(_Frame):
    """What one reconcile may do; its runner row is recorded before the spawn."""

    schema_: Literal["piwf.resource.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["launch"] = "launch"
    reconcile_id: str = Field(min_length=1, max_length=256)
    generation: int = Field(ge=1)
    server_epoch: int = Field(ge=1)
    manager: str = Field(min_length=1, max_length=64)
    project_path: str | None = None
    state_home: str
    deadline_ms: int = Field(ge=0)
    resource: dict[str, Any]
    protocol_version: Literal[1] = PROTOCOL_VERSION


class ChildFrame(_Frame):
    """Any message a resource runner sends; ``kind`` decides which optional fields it has."""

    schema_: Literal["piwf.resource.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["ready", "call", "exiting"]
    reconcile_id: str = Field(min_length=1, max_length=256)
    generation: int = Field(ge=1)
    message_id: str | None = Field(default=None, max_length=256)
    operation: Operation | None = None
    payload: dict[str, Any] | None = None
    source_digest: str | None = Field(default=None, min_length=64, max_length=64)


class StartFrame(_Frame):
    """The server's go-ahead after ``ready``."""

    schema_: Literal["piwf.resource.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["start"] = "start"


class ResponseFrame(_Frame):
    """The server's answer to one ``call``."""

    schema_: Literal["piwf.resource.v1"] = Field(default=SCHEMA, alias="schema")
    kind: Literal["response"] = "response"
    message_id: str = Field(min_length=1, max_length=256)
    outcome: Literal["accepted", "rejected", "claimLost"]
    result: Any = None
    error: str | None = Field(default=None, max_length=1024)
    error_code: str | None = Field(default=None, max_length=64)


class EffectReserve(_Payload):
    """Reserve (or find) one effect of the resource."""

    key: str = Field(min_length=1, max_length=256)
    kind: str = Field(min_length=1, max_length=256)
    request: Any = None


class EffectBegin(_Payload):
    """Open the next attempt of a pending or ambiguous effect."""

    effect_id: str = Field(min_length=1, max_length=256)


class EffectSettle(_Payload):
    """How the open attempt ended; ``observed`` says observe (not apply) decided it."""

    effect_id: str = Field(min_length=1, max_length=256)
    attempt: int = Field(ge=1)
    outcome: Literal["applied", "rejected", "indeterminate"]
    observed: bool = False
    result: Any = None
    error: str | None = Field(default=None, max_length=4000)


class ResolvedWorkflow(_Payload):
    """A child workflow resolved by the resource runner (as the source resolver would)."""

    workflow_name: str = Field(min_length=1, max_length=256)
    workflow_ref: str = Field(min_length=1, max_length=4096)
    definition_digest: str = Field(min_length=64, max_length=64)
    snapshot: Any
    title: str | None = None
    #: The title the child run is committed with (the source resolver's ``runTitle``).
    run_title: str | None = None
    sources: dict[str, Any]


class WorkflowEnsure(_Payload):
    """Find the child run of ``requestKey``; with ``resolved``, create it when missing."""

    request_key: str = Field(min_length=1, max_length=256)
    workflow: str = Field(min_length=1, max_length=4096)
    input: Any = None
    resolved: ResolvedWorkflow | None = None


class ConditionIn(_Payload):
    """One condition of a status patch."""

    type: str = Field(min_length=1, max_length=64)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(min_length=1, max_length=128)
    message: str | None = Field(default=None, max_length=1024)

    @field_validator("type")
    @classmethod
    def _type_shape(cls, value: str) -> str:
        if not CONDITION_TYPE_PATTERN.fullmatch(value):
            raise ValueError("a condition type is a letter, then letters, digits, '.', '_', '-'")
        return value


class PatchIn(_Payload):
    """The status part of a result."""

    status: dict[str, Any] | None = None
    conditions: list[ConditionIn] | None = Field(default=None, max_length=MAX_CONDITIONS)
    finalizers: list[str] | None = Field(default=None, max_length=MAX_FINALIZERS)

    @field_validator("finalizers")
    @classmethod
    def _finalizer_shape(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not FINALIZER_PATTERN.fullmatch(name):
                raise ValueError(f"finalizer {name[:64]!r} is not a finalizer name")
        return value

    @field_validator("status")
    @classmethod
    def _status_size(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and len(canonical.encode(value)) > MAX_STATUS_BYTES:
            raise ValueError(f"status exceeds {MAX_STATUS_BYTES} bytes")
        return value


class ReconcileFinish(_Payload):
    """A reconcile's result."""

    kind: Literal["settled", "requeue", "requeueAfter"]
    after_ms: int | None = Field(default=None, ge=1, le=MAX_REQUEUE_AFTER_MS)
    patch: PatchIn = Field(default_factory=PatchIn)

    @model_validator(mode="after")
    def _delay_iff_requeue_after(self) -> ReconcileFinish:
        if (self.kind == "requeueAfter") != (self.after_ms is not None):
            raise ValueError("afterMs is required by requeueAfter and refused otherwise")
        return self


class ReconcileFail(_Payload):
    """The reconcile raised: the server backs off and retries."""

    error: str = Field(min_length=1, max_length=4000)


#: Payload model of each operation.
PAYLOADS: dict[str, type[_Payload]] = {
    "effect.reserve": EffectReserve,
    "effect.begin": EffectBegin,
    "effect.settle": EffectSettle,
    "workflow.ensure": WorkflowEnsure,
    "reconcile.finish": ReconcileFinish,
    "reconcile.fail": ReconcileFail,
}
