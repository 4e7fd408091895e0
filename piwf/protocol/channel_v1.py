"""The private channel-adapter protocol ``piwf.channel.v1`` between the server and one adapter.

Same transport as every child (one ``multiprocessing.connection`` pipe, canonical JSON frames of
at most 1 MiB, nothing pickled). Every message carries the fence the server checks before it
reads anything else: ``adapterEpoch`` (the channel's current adapter; +1 at every launch),
``profile``, ``sequence`` (strictly increasing per sender), ``expectedRevision`` and a stable
``attemptId``::

    server → child   launch            {..., attemptId: "launch", expectedRevision: channel
                                        revision, profile config, credential, offset}
    child → server   channel.ready     {..., attemptId: "ready"}
    server → child   channel.present   {..., attemptId: "<effectId>#<n>", expectedRevision:
                                        the effect's revision, request: send or edit}
    child → server   channel.settle    {..., attemptId and expectedRevision of the present,
                                        outcome: applied | rejected | indeterminate,
                                        result?: {chatId, messageId}, error?}
    child → server   channel.answer    {..., attemptId: "update-<id>", expectedRevision:
                                        channel revision, update: {updateId, identity?,
                                        data?, callbackId?}}
    server → child   response          {..., the answer's sequence echoed as ``replyTo``,
                                        outcome, revision (the channel's, after it), notice?}
    child → server   channel.health    {..., attemptId: "health", problem?: unreachable |
                                        credentialRefused | apiError | badReply, reason?}
    child → server   channel.exiting   {..., attemptId: "exit"}

``channel.health`` is sent after the adapter's first poll (the server sends nothing through
an adapter before it), then when the API's health changes (it fails, fails differently, or
answers again), never once per poll: without ``problem`` the API answers again; with it, the
kind of failure and a short ``reason`` (the method and the HTTP status or network error; never
the credential, a request URL or a payload).

The credential travels only in ``launch``, over the private pipe (never argv, environment,
database or logs). The child never opens SQLite and never loads workflow code: it sends, edits,
polls and relays. A frame of another epoch, profile or an old sequence is refused before its
payload is used (:func:`fence_refusal`); a settle of a stale attempt is refused by the store.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

from piwf import canonical

SCHEMA: Final = "piwf.channel.v1"
PROTOCOL_VERSION: Final = 1
#: Telegram's bound on a button's callback data, in bytes.
MAX_CALLBACK_DATA_BYTES: Final = 64
#: Telegram's bound on a message text, in characters.
MAX_TEXT_CHARS: Final = 4096

_Schema = Literal["piwf.channel.v1"]


class _Model(BaseModel):
    # Built on first use (``defer_build``): only a server with a channel, and its adapter
    # child, ever validates these; the rest would build them at every start for nothing.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        defer_build=True,
    )

    def encode(self) -> bytes:
        """Canonical JSON bytes of the message."""
        return canonical.encode(self.model_dump(by_alias=True, exclude_none=True))


class _Fenced(_Model):
    """What every message carries, checked before its payload is used."""

    schema_: _Schema = Field(default=SCHEMA, alias="schema")
    adapter_epoch: int = Field(ge=1)
    profile: str = Field(min_length=1, max_length=64)
    sequence: int = Field(ge=0)
    expected_revision: int = Field(ge=0)
    attempt_id: str = Field(min_length=1, max_length=300)


class TelegramProfile(_Model):
    """What a Telegram adapter needs of its profile (no credential: that is ``credential``)."""

    kind: Literal["telegram"] = "telegram"
    api_base_url: str = Field(min_length=1, max_length=2048)
    chat_id: str = Field(min_length=1, max_length=128)
    allowed_identities: list[int] = Field(max_length=256)
    poll_timeout_s: int = Field(default=25, ge=0, le=60)
    request_timeout_s: float = Field(default=30.0, gt=0, le=300)


class LaunchFrame(_Fenced):
    """The adapter's only configuration: the profile, its one credential and the offset."""

    kind: Literal["launch"] = "launch"
    channel: TelegramProfile
    credential: str = Field(min_length=1, max_length=512, repr=False)
    offset: int = Field(ge=0)
    protocol_version: Literal[1] = PROTOCOL_VERSION


class Button(_Model):
    """One inline button: its label and its short callback data (a token, never a payload)."""

    text: str = Field(min_length=1, max_length=128)
    data: str = Field(min_length=1, max_length=MAX_CALLBACK_DATA_BYTES)


class MessageRef(_Model):
    """Where a sent message is (Telegram's chat id and message id)."""

    chat_id: int | str
    message_id: int


class PresentRequest(_Model):
    """The rendered presentation of one external attempt: a send or an edit."""

    method: Literal["sendMessage", "editMessageText"]
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    buttons: list[Button] = Field(default_factory=list, max_length=16)
    message_ref: MessageRef | None = None


class PresentFrame(_Fenced):
    """Perform one attempt (``attemptId`` ``<effectId>#<n>``) and settle it."""

    kind: Literal["channel.present"] = "channel.present"
    request: PresentRequest


class ReadyFrame(_Fenced):
    """The adapter is up and polling."""

    kind: Literal["channel.ready"] = "channel.ready"


class SettleFrame(_Fenced):
    """How one attempt ended; ``indeterminate`` when the request may or may not have landed."""

    kind: Literal["channel.settle"] = "channel.settle"
    outcome: Literal["applied", "rejected", "indeterminate"]
    result: MessageRef | None = None
    error: str | None = Field(default=None, max_length=1000)


class Update(_Model):
    """One external update: a button press has ``identity`` (the sender) and ``data`` (only
    when the adapter found the identity allowed; the server checks again)."""

    update_id: int = Field(ge=0)
    allowed: bool = False
    identity: str | None = Field(default=None, max_length=64)
    data: str | None = Field(default=None, max_length=MAX_CALLBACK_DATA_BYTES)
    callback_id: str | None = Field(default=None, max_length=256)


class AnswerFrame(_Fenced):
    """One update for the server to apply (the cursor moves past it either way)."""

    kind: Literal["channel.answer"] = "channel.answer"
    update: Update


#: Why an adapter cannot use its API: no connection (refused, unresolvable, timed out), the API
#: refused the credential (HTTP 401), another error answer, or a reply of no known shape.
ApiProblem = Literal["unreachable", "credentialRefused", "apiError", "badReply"]


class HealthFrame(_Fenced):
    """The adapter's API changed between usable (no ``problem``) and not."""

    kind: Literal["channel.health"] = "channel.health"
    problem: ApiProblem | None = None
    reason: str | None = Field(default=None, max_length=300)


class ExitingFrame(_Fenced):
    """The adapter ends on its own (it lost its server, or was told to stop)."""

    kind: Literal["channel.exiting"] = "channel.exiting"


class ResponseFrame(_Fenced):
    """The server's answer to one ``channel.answer``: the channel's revision after it and the
    short notice shown to the person who pressed the button."""

    kind: Literal["response"] = "response"
    reply_to: int = Field(ge=0)
    outcome: Literal["accepted", "rejected"]
    revision: int = Field(ge=0)
    notice: str | None = Field(default=None, max_length=200)


ChildFrame = Annotated[
    ReadyFrame | SettleFrame | AnswerFrame | HealthFrame | ExitingFrame,
    Field(discriminator="kind"),
]
ServerFrame = Annotated[LaunchFrame | PresentFrame | ResponseFrame, Field(discriminator="kind")]


@functools.cache
def _adapter(frames: Any) -> TypeAdapter[Any]:
    """The validator of ``frames``, built on first use: every server imports this module,
    most never run a channel, and building both at import cost a fifth of a server's start."""
    return TypeAdapter(frames)


def parse_child_frame(
    raw: bytes,
) -> ReadyFrame | SettleFrame | AnswerFrame | HealthFrame | ExitingFrame:
    """Decode and validate one adapter message (canonical JSON, unknown fields refused).

    Raises :class:`~piwf.errors.PiwfError` for bytes that are not canonical JSON and
    ``pydantic.ValidationError`` for a message of no declared shape.
    """
    frame: ReadyFrame | SettleFrame | AnswerFrame | HealthFrame | ExitingFrame = _adapter(
        ChildFrame
    ).validate_python(canonical.decode(raw))
    return frame


def parse_server_frame(raw: bytes) -> LaunchFrame | PresentFrame | ResponseFrame:
    """Decode and validate one server message (the adapter's side of :func:`parse_child_frame`)."""
    frame: LaunchFrame | PresentFrame | ResponseFrame = _adapter(ServerFrame).validate_python(
        canonical.decode(raw)
    )
    return frame


def fence_refusal(frame: _Fenced, *, epoch: int, profile: str, last_sequence: int) -> str | None:
    """Why the server refuses ``frame`` before reading its payload, or None to go on.

    Another adapter epoch (a stale or foreign adapter), another profile, or a sequence at or
    below the last one accepted from this adapter (a replay) is refused.
    """
    if frame.adapter_epoch != epoch:
        return f"stale adapter epoch {frame.adapter_epoch} (current {epoch})"
    if frame.profile != profile:
        return f"profile {frame.profile!r} is not this adapter's"
    if frame.sequence <= last_sequence:
        return f"sequence {frame.sequence} is not after {last_sequence}"
    return None
