"""What every ``Client`` mixin calls: :meth:`Client.request` and :meth:`Client._call`, declared
once here for type checking (:class:`~piwf.client.Client` defines them; at run time this
class adds nothing), and :func:`parse_receipt`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from piwf.protocol.errors import InvalidMessageError

if TYPE_CHECKING:
    from piwf.canonical import JsonValue
    from piwf.client.connection import ServerConnection
    from piwf.protocol import Operation
    from piwf.protocol.payloads import ContentRef, WireModel

from piwf.protocol.client_v1 import Response

_Receipt = TypeVar("_Receipt", bound=BaseModel)


def outcome_unknown(idempotency_key: str | None, client_id: str) -> str:
    """What a durable command cut short (its key given) says about its outcome; nothing for a
    read (no key)."""
    if idempotency_key is None:
        return ""
    return (
        " (the command may or may not have been applied; a retry with idempotency "
        f"key {idempotency_key} from client {client_id} adopts its outcome)"
    )


def parse_receipt(receipt_type: type[_Receipt], response: Response) -> _Receipt:
    """The response's receipt as ``receipt_type``; a receipt that does not fit is the server
    breaking the protocol (:class:`~piwf.protocol.errors.InvalidMessageError`)."""
    try:
        return receipt_type.model_validate(response.receipt or {})
    except ValidationError:
        raise InvalidMessageError(
            "receipt", "invalidValue", f"the server sent an invalid {receipt_type.__name__}"
        ) from None


class ClientCalls:
    """The base of the client's method groups (runs, logs, interactions, resources, sessions,
    workflows, settings, channels)."""

    if TYPE_CHECKING:  # provided by :class:`piwf.client.Client`, which mixes the groups in
        request_timeout_s: float
        _connection: ServerConnection | None
        _closes: int

        def _current_connection(self, autostart: bool) -> ServerConnection:
            """The open connection (opened when there is none)."""
            ...

        def _connected(self) -> ServerConnection:
            """The open connection, opened as every call opens it (autostart, retries)."""
            ...

        def read_content(self, ref: ContentRef) -> JsonValue:
            """Read one referenced value in full."""
            ...

        def request(
            self,
            operation: Operation,
            payload: Mapping[str, Any] | None = None,
            *,
            run_id: str | None = None,
            expected_revision: int | None = None,
            idempotency_key: str | None = None,
            timeout_s: float | None = None,
        ) -> Response:
            """Send one operation and return its successful response."""
            ...

        def _call(
            self,
            operation: Operation,
            payload: WireModel | Callable[[], WireModel],
            receipt_type: type[_Receipt],
            *,
            run_id: str | None = None,
            idempotency_key: str | None = None,
            timeout_s: float | None = None,
            held_s: float = 0.0,
        ) -> _Receipt:
            """Send one operation and validate its receipt."""
            ...
