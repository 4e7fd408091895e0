"""JSON forms of port messages, results and saved runs, for a port carried over a pipe.

Which message each operation carries is declared once, in
:data:`piwf.protocol.runner_v1.PORT_OPERATIONS`; this module only knows how to write and read
port dataclasses.

:func:`piwf.workflow.port.message_to_json` writes any port dataclass as a JSON object (snake
case, enums by value). :func:`from_json` is its strict inverse: it rebuilds a dataclass of a
known port type, refusing unknown or missing fields and values of the wrong type with
:class:`PortCodecError`, so a garbled message from the other side of a pipe never becomes a
half-valid object.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar, Union

from piwf.canonical import JsonValue
from piwf.errors import PiwfError
from piwf.lifecycle import Adopted, Applied, Conflict, RecoveryRequired
from piwf.workflow import port

T = TypeVar("T")

#: Result kind on the wire → result type; ``applied`` and ``adopted`` carry a ``Committed``.
RESULT_TYPES: Mapping[str, type[Any]] = {
    "applied": Applied,
    "adopted": Adopted,
    "conflict": Conflict,
    "recoveryRequired": RecoveryRequired,
}

_KIND_OF_RESULT: Mapping[type[Any], str] = {cls: kind for kind, cls in RESULT_TYPES.items()}


class PortCodecError(PiwfError):
    """A JSON value does not have the shape of the port type it was read as."""

    code = "protocolRejected"


def to_json(value: object) -> JsonValue:
    """Return the JSON form of a port dataclass."""
    return port.message_to_json(value)


def result_to_json(result: port.PortResult) -> dict[str, JsonValue]:
    """Return ``{"kind": ..., "value": {...}}`` for a port result.

    ``value`` is the :class:`~piwf.workflow.port.Committed` of an ``applied`` or ``adopted``
    result, ``{"evidence"}`` of a conflict and ``{"reason"}`` of a recovery requirement.
    """
    kind = _KIND_OF_RESULT[type(result)]
    if isinstance(result, (Applied, Adopted)):
        return {"kind": kind, "value": port.message_to_json(result.value)}
    return {"kind": kind, "value": port.message_to_json(result)}


def result_from_json(value: JsonValue) -> port.PortResult:
    """Rebuild a port result from :func:`result_to_json` output; refuse any other shape."""
    if not isinstance(value, Mapping) or set(value) != {"kind", "value"}:
        raise PortCodecError("a port result must be {kind, value}")
    kind = value["kind"]
    if not isinstance(kind, str) or kind not in RESULT_TYPES:
        raise PortCodecError(f"unknown port result kind {kind!r}")
    if kind == "applied":
        return Applied(from_json(port.Committed, value["value"]))
    if kind == "adopted":
        return Adopted(from_json(port.Committed, value["value"]))
    result: port.PortResult = from_json(RESULT_TYPES[kind], value["value"])
    return result


def from_json(cls: type[T], value: JsonValue) -> T:
    """Rebuild a port dataclass of type ``cls`` from its JSON form; refuse any other shape."""
    return _decode(cls, value, cls.__name__)  # type: ignore[no-any-return]


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    """Field types of ``cls``; a field declared ``JsonValue`` takes any JSON value as it is.

    Names resolve in ``cls``'s own module first (a record such as
    :class:`~piwf.workflow.failure.NodeFailure` lives beside its helpers), then in the port's.
    """
    if cls not in _HINTS:
        namespace = vars(port) | vars(sys.modules[cls.__module__]) | vars(typing)
        hints = typing.get_type_hints(cls, namespace)
        for name, raw in cls.__annotations__.items():
            if isinstance(raw, str) and raw.strip() == "JsonValue":
                hints[name] = Any
        _HINTS[cls] = hints
    return _HINTS[cls]


#: Reads one JSON value as an annotation's type; ``where`` names it in a refusal.
Decoder = Callable[[JsonValue, str], Any]

#: One decoder per annotation, made on first use (:func:`_decoder`).
_DECODERS: dict[Any, Decoder] = {}


def _decode(annotation: Any, value: JsonValue, where: str) -> Any:
    return _decoder(annotation)(value, where)


def _decoder(annotation: Any) -> Decoder:
    """The decoder of ``annotation``: the type is inspected once, not for every value."""
    found = _DECODERS.get(annotation)
    if found is None:
        found = _DECODERS[annotation] = _make_decoder(annotation)
    return found


def _make_decoder(annotation: Any) -> Decoder:
    if annotation is Any:
        return _as_is
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = typing.get_args(annotation)
        optional = type(None) in options
        choices = [_decoder(option) for option in options if option is not type(None)]

        def union(value: JsonValue, where: str) -> Any:
            if value is None and optional:
                return None
            errors = []
            for choice in choices:
                try:
                    return choice(value, where)
                except PortCodecError as error:
                    errors.append(str(error))
            raise PortCodecError(f"{where}: no type fits ({'; '.join(errors)})")

        return union
    if origin is tuple:
        item = _decoder(typing.get_args(annotation)[0])

        def sequence(value: JsonValue, where: str) -> Any:
            if not isinstance(value, list):
                raise PortCodecError(f"{where}: expected a list")
            return tuple(item(element, f"{where}[]") for element in value)

        return sequence
    if origin in (Mapping, dict) or annotation is Mapping:
        _key_type, item_type = typing.get_args(annotation) or (str, Any)
        entry = _decoder(item_type)

        def mapping(value: JsonValue, where: str) -> Any:
            if not isinstance(value, dict):
                raise PortCodecError(f"{where}: expected an object")
            return {str(key): entry(element, f"{where}.{key}") for key, element in value.items()}

        return mapping
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        enum_type = annotation

        def member(value: JsonValue, where: str) -> Any:
            try:
                return enum_type(value)
            except ValueError:
                raise PortCodecError(f"{where}: {value!r} is not a {enum_type.__name__}") from None

        return member
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _dataclass_decoder(annotation)
    if annotation is bool:
        return _boolean
    if annotation is int:
        return _integer
    if annotation is str:
        return _string

    def unknown(value: JsonValue, where: str) -> Any:
        raise PortCodecError(f"{where}: cannot decode {annotation!r}")

    return unknown


#: (name, required, decoder) of each field of a dataclass, in declaration order.
_Plan = list[tuple[str, bool, Decoder]]
_PLANS: dict[type[Any], _Plan] = {}


def _plan(cls: type[Any]) -> _Plan:
    """How ``cls`` is read, field by field (made once; a field of a dataclass type gets that
    type's decoder, whose own plan is made when first needed, so a type may hold itself)."""
    found = _PLANS.get(cls)
    if found is None:
        hints = _hints(cls)
        found = _PLANS[cls] = [
            (
                item.name,
                item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING,
                _decoder(hints[item.name]),
            )
            for item in dataclasses.fields(cls)
        ]
    return found


def _dataclass_decoder(cls: type[Any]) -> Decoder:
    """Fields in declaration order: an unknown field, then the first missing or mistyped one,
    is refused; a field with a default may be absent."""
    names = frozenset(item.name for item in dataclasses.fields(cls))

    def dataclass_value(value: JsonValue, where: str) -> Any:
        if not isinstance(value, dict):
            raise PortCodecError(f"{where}: expected an object")
        if not names.issuperset(value):
            unknown = sorted(set(value) - names)
            raise PortCodecError(f"{where}: unknown field {unknown[0]!r}")
        arguments: dict[str, Any] = {}
        for name, required, decode in _plan(cls):
            if name in value:
                arguments[name] = decode(value[name], f"{where}.{name}")
            elif required:
                raise PortCodecError(f"{where}: missing field {name!r}")
        return cls(**arguments)

    return dataclass_value


def _as_is(value: JsonValue, where: str) -> Any:
    return value


def _boolean(value: JsonValue, where: str) -> Any:
    if not isinstance(value, bool):
        raise PortCodecError(f"{where}: expected a boolean")
    return value


def _integer(value: JsonValue, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PortCodecError(f"{where}: expected an integer")
    return value


def _string(value: JsonValue, where: str) -> Any:
    if not isinstance(value, str):
        raise PortCodecError(f"{where}: expected a string")
    return value


def prepare_hints() -> None:
    """Resolve now the field types and decoders of every port dataclass and of the dataclasses
    they hold.

    Each process resolves them once, on first use; a process that forks children (the fork
    server) calls this first, so every child it forks inherits them instead of resolving them
    again for its one run. A type that does not resolve here is left for its first use, which
    reports it.
    """
    pending = [
        value
        for value in vars(port).values()
        if isinstance(value, type) and dataclasses.is_dataclass(value)
    ]
    seen: set[type[Any]] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        try:
            hints = _hints(cls)
            _decoder(cls)
            _plan(cls)  # its decoders too, inherited likewise
        except (NameError, TypeError):
            continue
        for hint in hints.values():
            pending.extend(_dataclasses_in(hint))


def _dataclasses_in(annotation: Any) -> list[type[Any]]:
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return [annotation]
    found: list[type[Any]] = []
    for argument in typing.get_args(annotation):
        found.extend(_dataclasses_in(argument))
    return found
