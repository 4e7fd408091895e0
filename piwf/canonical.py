"""Canonical JSON: one byte sequence for one value, shared with every peer of the protocol.

The rules are those of the original implementation (and of RFC 8785 where they overlap):

- object keys sorted by UTF-16 code units, no insignificant whitespace;
- strings escaped as ``JSON.stringify`` escapes them (``"``, ``\\``, control characters only),
  everything else written as UTF-8;
- numbers formatted as ECMAScript ``Number.prototype.toString`` formats them: ``1.0`` is ``1``,
  ``-0.0`` is ``0``, ``1e21`` is ``1e+21``;
- integers must be exactly representable (``|n| <= 2**53 - 1``), floats finite;
- a number written in integer form (no fraction, no exponent) is an integer, so it must lie
  within ``±(2**53 - 1)`` whatever its Python type: ``9007199254740992`` (2**53) is refused as
  text, and so is the float ``2.0**53`` (or ``1e20``) on encoding, because ECMAScript would
  write it in integer form; from ``1e21`` on ECMAScript writes an exponent, which is a float;
- ``bool`` is never a number, and no other Python type is accepted.

:func:`decode` is strict: it refuses invalid UTF-8, a byte-order mark, duplicate keys,
``NaN``/``Infinity``, overflowing numbers, lone surrogates, nesting deeper than
:data:`MAX_DEPTH`, and, because receipts and digests are computed over bytes, any text that is
not already canonical. :func:`parse` applies the same rules but accepts any whitespace and key
order (for files and command-line input that users type).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias

from piwf.errors import CanonicalJsonError

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"

MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 128
# A 2**53 literal has 16 digits; anything much longer can only be an unsafe integer, and
# rejecting by length first keeps int() away from pathological inputs.
_MAX_INTEGER_LITERAL = 24
_UNSAFE_INTEGER = "unsafeInteger"
_UNSAFE_INTEGER_MESSAGE = (
    "integers must lie within ±(2**53 - 1) = ±9007199254740991 to stay exact; "
    "send a larger number as a string"
)


def encode(value: object) -> bytes:
    """Return the canonical UTF-8 bytes of ``value``.

    Raises :class:`CanonicalJsonError` for unsupported types, non-finite floats, unsafe
    integers, lone surrogates, non-string keys and nesting deeper than :data:`MAX_DEPTH`.

    A value made only of ``None``, booleans, safe integers, strings, lists, tuples and dicts
    whose keys sort the same by code point as by UTF-16 code unit (no key character at or
    above U+D800) is written by the standard library's C encoder, whose output for exactly
    those types is the canonical form; anything else (a float, another mapping or sequence
    type, an unsafe integer, such a key) takes the rule-by-rule encoder below.
    """
    if _plain(value, 0):
        text = _PLAIN_ENCODER(value)
    else:
        parts: list[str] = []
        _encode_into(value, parts, 0)
        text = "".join(parts)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalJsonError(
            "loneSurrogate", "text contains a lone surrogate and is not valid Unicode"
        ) from None


def check_value(value: object, name: str) -> None:
    """Raise :class:`CanonicalJsonError` unless :func:`encode` accepts ``value``.

    The message starts with ``name`` (the argument or field the value was given as) and says
    which rule was broken; it never quotes the value. Entry points that take user JSON call it
    before anything is sent, so a value the protocol refuses fails where it was given.
    """
    try:
        encode(value)
    except CanonicalJsonError as error:
        raise CanonicalJsonError(error.reason, f"{name}: {error}") from None


def encode_text(value: object) -> str:
    """Return the canonical JSON text of ``value`` (the decoded form of :func:`encode`)."""
    return encode(value).decode("utf-8")


def decode(data: bytes | str) -> JsonValue:
    """Parse canonical JSON, refusing anything that :func:`encode` would not have produced.

    Canonical text is first read by the standard library's parser alone: when encoding what it
    read gives back exactly the same bytes, the text was canonical (sorted unique keys, safe
    integers, finite numbers, no lone surrogate: :func:`encode` refuses or rewrites anything
    else), and the value is returned. Any other text is parsed again rule by rule, so a refusal
    names the rule it broke.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        quick = json.loads(raw, parse_constant=_refuse_constant)
        if encode(quick) == raw:
            return quick  # type: ignore[no-any-return]
    except (ValueError, RecursionError):  # CanonicalJsonError is a ValueError too
        pass
    value = parse(raw)
    if encode(value) != raw:
        raise CanonicalJsonError(
            "nonCanonical",
            "JSON is not canonical (sorted keys, no whitespace, ECMAScript numbers)",
        )
    return value


def parse(data: bytes | str) -> JsonValue:
    """Parse JSON with every canonical value rule, but any whitespace and key order."""
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            raise CanonicalJsonError("loneSurrogate", "text contains a lone surrogate") from None
    if data.startswith(b"\xef\xbb\xbf"):
        raise CanonicalJsonError("badEncoding", "JSON must not start with a byte-order mark")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CanonicalJsonError("badEncoding", "JSON is not valid UTF-8") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_parse_float,
            parse_int=_parse_int,
        )
    except CanonicalJsonError:
        raise
    except RecursionError:
        raise CanonicalJsonError("tooDeep", f"JSON nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:
        raise CanonicalJsonError("notJson", f"not JSON: {_short(str(error))}") from None
    _check_parsed(value, 0)
    return value  # type: ignore[no-any-return]


def sha256(data: bytes) -> bytes:
    """Return the 32-byte SHA-256 digest of ``data``."""
    return hashlib.sha256(data).digest()


def digest(value: object) -> bytes:
    """Return the 32-byte SHA-256 digest of the canonical bytes of ``value``."""
    return sha256(encode(value))


def digest_hex(value: object) -> str:
    """Return the hex SHA-256 digest of the canonical bytes of ``value``."""
    return digest(value).hex()


def format_number(value: float) -> str:
    """Format a finite float as ECMAScript ``Number.prototype.toString`` does."""
    if not math.isfinite(value):
        raise CanonicalJsonError("nonFinite", "NaN and Infinity are not JSON numbers")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    digits, point = _shortest_digits(abs(value))
    count = len(digits)
    if count <= point <= 21:
        return sign + digits + "0" * (point - count)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * (-point) + digits
    exponent = point - 1
    exponent_text = f"e+{exponent}" if exponent >= 0 else f"e-{-exponent}"
    if count == 1:
        return sign + digits + exponent_text
    return sign + digits[0] + "." + digits[1:] + exponent_text


def _shortest_digits(value: float) -> tuple[str, int]:
    """Return (digits, point) with value == 0.digits * 10**point, digits shortest round-trip."""
    text = repr(value)
    mantissa, _, exponent_text = text.partition("e")
    exponent = int(exponent_text) if exponent_text else 0
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    leading_zeros = len(whole + fraction) - len((whole + fraction).lstrip("0"))
    point = len(whole) + exponent - leading_zeros
    return digits.rstrip("0") or "0", point


#: The C encoder with canonical settings, for values :func:`_plain` accepts.
_PLAIN_ENCODER = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode

_PLAIN_SCALARS = (str, bool, type(None))


def _plain(value: object, depth: int) -> bool:
    """Whether ``value`` holds only types the C encoder writes canonically (see encode)."""
    if depth > MAX_DEPTH:
        return False
    kind = type(value)
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str or not _plain_key(key):
                return False
            if not _plain_item(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        return all(_plain_item(item, depth + 1) for item in value)  # type: ignore[attr-defined]
    return _plain_item(value, depth)


def _plain_item(value: object, depth: int) -> bool:
    """:func:`_plain`, with the scalars (most items) decided without a further call."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER  # type: ignore[operator]
    if kind is dict or kind is list or kind is tuple:
        return _plain(value, depth)
    return isinstance(value, str)  # a str subclass (a StrEnum member) is written as its text


def _plain_key(key: str) -> bool:
    """Whether ``key`` sorts the same by code point as by UTF-16 code unit."""
    return key.isascii() or not key or max(key) < "\ud800"


def _encode_into(value: object, parts: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise CanonicalJsonError("tooDeep", f"value nests deeper than {MAX_DEPTH} levels")
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise CanonicalJsonError(_UNSAFE_INTEGER, _UNSAFE_INTEGER_MESSAGE)
        parts.append(str(int(value)))
    elif isinstance(value, float):
        text = format_number(value)
        # Every double beyond 2**53 - 1 is integral; below 1e21 ECMAScript writes it in
        # integer form, which a reader takes for an (unsafe) integer.
        if abs(value) > MAX_SAFE_INTEGER and "e" not in text:
            raise CanonicalJsonError(_UNSAFE_INTEGER, _UNSAFE_INTEGER_MESSAGE)
        parts.append(text)
    elif isinstance(value, str):
        parts.append(_encode_string(value))
    elif isinstance(value, Mapping):
        _encode_object(value, parts, depth)
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray, memoryview)):
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            try:
                _encode_into(item, parts, depth + 1)
            except CanonicalJsonError as error:
                error.path.append(f"[{index}]")
                raise
        parts.append("]")
    else:
        raise CanonicalJsonError("unsupportedType", f"{type(value).__name__} is not a JSON value")


def _encode_object(value: Mapping[Any, Any], parts: list[str], depth: int) -> None:
    for key in value:
        if not isinstance(key, str):
            error = CanonicalJsonError("unsupportedType", "object keys must be strings")
            error.path.append(f", key {_subscript(key)}")
            raise error
    keys = sorted(value, key=_utf16_order)
    parts.append("{")
    for index, key in enumerate(keys):
        if index:
            parts.append(",")
        parts.append(_encode_string(key))
        parts.append(":")
        try:
            _encode_into(value[key], parts, depth + 1)
        except CanonicalJsonError as error:
            error.path.append(f"[{_subscript(key)}]")
            raise
    parts.append("}")


def where(error: CanonicalJsonError) -> str:
    """Where inside the value :func:`encode` was given the part it refused sits, as subscripts
    (``['items'][1]['when']``, ``['a'], key tuple (1, 2)``); ``""`` for the value itself, or
    when no single part is to blame (a lone surrogate found only in the finished text). A path
    of over 12 steps keeps its first 8 and last 4."""
    steps = error.path[::-1]
    if len(steps) > 12:
        steps = [*steps[:8], f"...{len(steps) - 12} more...", *steps[-4:]]
    return "".join(steps).removeprefix(", ")


def _subscript(key: object) -> str:
    """``repr(key)`` cut to 60 characters (a key may be a long text or any object)."""
    text = repr(key) if isinstance(key, str) else f"{type(key).__name__} {key!r}"
    return text if len(text) <= 60 else text[:57] + "..."


def _utf16_order(key: str) -> bytes:
    try:
        return key.encode("utf-16-be")
    except UnicodeEncodeError:
        raise CanonicalJsonError("loneSurrogate", "object key contains a lone surrogate") from None


def _encode_string(value: str) -> str:
    # ensure_ascii=False escapes exactly what JSON.stringify escapes: '"', '\\' and C0 controls
    # (\b \f \n \r \t by name, the rest as lowercase \u00xx).
    return json.dumps(value, ensure_ascii=False)


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, item in pairs:
        if key in result:
            raise CanonicalJsonError("duplicateKey", f"duplicate object key {safe_name(key)!r}")
        result[key] = item
    return result


def _refuse_constant(name: str) -> Any:
    raise CanonicalJsonError("nonFinite", f"{name} is not a JSON number")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise CanonicalJsonError("nonFinite", "number overflows a double")
    return value


def _parse_int(text: str) -> int:
    # An integer literal is an integer to every peer (Rust and Python parse it as one), so it
    # must be safe; a large double travels as ``1e+21`` and up, or is refused on encoding.
    if len(text.lstrip("-")) > _MAX_INTEGER_LITERAL:
        raise CanonicalJsonError(_UNSAFE_INTEGER, _UNSAFE_INTEGER_MESSAGE)
    value = int(text)
    if abs(value) > MAX_SAFE_INTEGER:
        raise CanonicalJsonError(_UNSAFE_INTEGER, _UNSAFE_INTEGER_MESSAGE)
    return value


def _check_parsed(value: object, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise CanonicalJsonError("tooDeep", f"JSON nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        _check_string(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_string(key)
            _check_parsed(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_parsed(item, depth + 1)


def _check_string(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalJsonError("loneSurrogate", "string contains a lone surrogate") from None


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


_SAFE_NAME_CHARACTERS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"
)
_MAX_SAFE_NAME: Final = 64


def safe_name(name: str) -> str:
    """Return a key or field name fit for an error message and a log line: at most 64
    characters of ``[A-Za-z0-9_.-]``, any other replaced by ``?``, then ``…`` when cut (a key
    may be user data, so it is never shown as sent)."""
    shown = "".join(c if c in _SAFE_NAME_CHARACTERS else "?" for c in name[:_MAX_SAFE_NAME])
    return shown + "…" if len(name) > _MAX_SAFE_NAME else shown
