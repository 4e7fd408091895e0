"""Payloads and receipts of the agent interactions of ``piwf.client.v1``: an agent's output
for one exact request (``interaction.submit``) and a progress update on it
(``interaction.update``). Same conventions as :mod:`piwf.protocol.payloads`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from piwf import canonical
from piwf.protocol.client_v1 import OpaqueId
from piwf.protocol.payloads import ContentRef, WireModel

#: Canonical JSON bytes one agent progress update (``interaction.update``) may carry.
MAX_UPDATE_DATA_BYTES = 64 * 1024


class SubmitPayload(WireModel):
    """An agent's output for one exact agent request (``interaction.submit``)."""

    request_id: OpaqueId
    output: Any = None
    #: The origin session's active coordinator epoch (required for an interactive run).
    coordinator_epoch: str | None = Field(default=None, max_length=256)


class SubmissionReceipt(WireModel):
    """The durable outcome of one submission: ``accepted`` (``value`` is the output as
    ``validate`` normalised it; the request is answered) or ``rejected`` (``error`` says what
    to submit instead; the request stays pending)."""

    submission_id: str
    request_id: str
    run_id: str
    outcome: Literal["accepted", "rejected"]
    value: Any = None
    value_ref: ContentRef | None = None
    error: str | None = None
    submitted_at: int
    settled_at: int


class UpdatePayload(WireModel):
    """A non-completing progress update on one exact agent request (``interaction.update``);
    ``data`` is at most :data:`MAX_UPDATE_DATA_BYTES` of canonical JSON."""

    request_id: OpaqueId
    data: Any = None
    #: The origin session's active coordinator epoch (required for an interactive run).
    coordinator_epoch: str | None = Field(default=None, max_length=256)

    @field_validator("data")
    @classmethod
    def _a_small_update(cls, value: Any) -> Any:
        if len(canonical.encode(value)) > MAX_UPDATE_DATA_BYTES:
            raise ValueError(
                f"a progress update is at most {MAX_UPDATE_DATA_BYTES:,} bytes (64 KiB) of JSON;"
                " send a shorter summary of the progress"
            )
        return value


class UpdateReceipt(WireModel):
    """Receipt of an update: recorded as the latest update of the request's attempt."""

    request_id: str
    run_id: str
    recorded_at: int
