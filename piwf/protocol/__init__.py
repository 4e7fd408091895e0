"""Sans-IO wire protocols: framing, message models, fingerprints. No sockets, no threads.

``piwf.client.v1`` is the protocol between clients (CLI, Python ``Client``, viewers) and the
server: newline-delimited canonical JSON frames of at most 1 MiB (:mod:`.framing`), carrying
``hello``/``request``/``response``/``event`` messages (:mod:`.client_v1`) whose operations are
listed in :mod:`.operations`; durable requests are deduplicated by :mod:`.fingerprint`.
docs/PROTOCOL.md describes the wire format in full.

The package exports its names lazily: ``import piwf.protocol.framing`` (the transport's frame
codec) loads no message model and so no pydantic, and a name below is loaded from its module
on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from piwf.protocol.client_v1 import (
        MESSAGE_TYPES,
        OUTCOMES,
        ErrorInfo,
        Event,
        Hello,
        Message,
        MessageType,
        Outcome,
        Request,
        Response,
        ServerMessage,
        encode_message,
        parse_message,
        parse_request,
        parse_server_message,
        serialize,
    )
    from piwf.protocol.errors import (
        FrameError,
        FrameTooLargeError,
        InvalidMessageError,
        ProtocolError,
    )
    from piwf.protocol.fingerprint import request_fingerprint, retry_outcome
    from piwf.protocol.framing import FrameDecoder, check_frame, encode_frame
    from piwf.protocol.operations import (
        DURABLE_OPERATIONS,
        OPERATIONS,
        READ_OPERATIONS,
        SCHEMA,
        Operation,
        is_durable,
        is_operation,
    )

#: Where each exported name lives, by module of this package.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "client_v1": (
        "MESSAGE_TYPES",
        "OUTCOMES",
        "ErrorInfo",
        "Event",
        "Hello",
        "Message",
        "MessageType",
        "Outcome",
        "Request",
        "Response",
        "ServerMessage",
        "encode_message",
        "parse_message",
        "parse_request",
        "parse_server_message",
        "serialize",
    ),
    "errors": (
        "FrameError",
        "FrameTooLargeError",
        "InvalidMessageError",
        "ProtocolError",
    ),
    "fingerprint": (
        "request_fingerprint",
        "retry_outcome",
    ),
    "framing": (
        "FrameDecoder",
        "check_frame",
        "encode_frame",
    ),
    "operations": (
        "DURABLE_OPERATIONS",
        "OPERATIONS",
        "READ_OPERATIONS",
        "SCHEMA",
        "Operation",
        "is_durable",
        "is_operation",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "DURABLE_OPERATIONS",
    "MESSAGE_TYPES",
    "OPERATIONS",
    "OUTCOMES",
    "READ_OPERATIONS",
    "SCHEMA",
    "ErrorInfo",
    "Event",
    "FrameDecoder",
    "FrameError",
    "FrameTooLargeError",
    "Hello",
    "InvalidMessageError",
    "Message",
    "MessageType",
    "Operation",
    "Outcome",
    "ProtocolError",
    "Request",
    "Response",
    "ServerMessage",
    "check_frame",
    "encode_frame",
    "encode_message",
    "is_durable",
    "is_operation",
    "parse_message",
    "parse_request",
    "parse_server_message",
    "request_fingerprint",
    "retry_outcome",
    "serialize",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'piwf.protocol' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"piwf.protocol.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
