"""Sans-IO wire protocols: framing, message models, fingerprints. No sockets, no threads.

``piwf.client.v1`` is the protocol between clients (CLI, Python ``Client``, viewers) and the
server: newline-delimited canonical JSON frames of at most 1 MiB (:mod:`.framing`), carrying
``hello``/``request``/``response``/``event`` messages (:mod:`.client_v1`) whose operations are
listed in :mod:`.operations`; durable requests are deduplicated by :mod:`.fingerprint`.
docs/PROTOCOL.md describes the wire format in full.
"""

from piwf.protocol.client_v1 import (
    MESSAGE_TYPES,
    OUTCOMES,
    SCHEMA,
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
    Operation,
    is_durable,
    is_operation,
)

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
