"""Canonical JSON: exact bytes, ECMAScript numbers, and every refused input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from piwf import canonical
from piwf.errors import CanonicalJsonError


def encodable_float(value: float) -> bool:
    """Doubles from 2**53 to 1e21 are written in integer form and refused as unsafe integers."""
    return abs(value) <= canonical.MAX_SAFE_INTEGER or abs(value) >= 1e21


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-canonical.MAX_SAFE_INTEGER, max_value=canonical.MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False).filter(encodable_float)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def equal_json(left: Any, right: Any) -> bool:
    """JSON equality where 1 == 1.0 and -0.0 == 0 (one number type, as in ECMAScript)."""
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(equal_json(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(equal_json, left, right))
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right
    return bool(left == right)


@given(json_values)
def test_decode_inverts_encode(value: object) -> None:
    data = canonical.encode(value)
    assert equal_json(canonical.decode(data), value)


@given(json_values)
def test_canonical_bytes_are_a_fixed_point(value: object) -> None:
    data = canonical.encode(value)
    assert canonical.encode(canonical.decode(data)) == data


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1"),
        (-0.0, "0"),
        (0.1, "0.1"),
        (1e21, "1e+21"),
        (9007199254740990.0, "9007199254740990"),
        (123.456, "123.456"),
        (1.5e-7, "1.5e-7"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (-2.5, "-2.5"),
        (2**53 - 1, "9007199254740991"),
    ],
)
def test_numbers_use_ecmascript_formatting(value: float, expected: str) -> None:
    assert canonical.encode(value) == expected.encode()


def test_keys_sort_by_utf16_code_units_not_code_points() -> None:
    # U+1F600 is a surrogate pair (D83D DE00) and sorts before U+FF61 in UTF-16,
    # although its code point is larger.
    value = {"\uff61": 1, "\U0001f600": 2, "b": 3, "a": 4}
    assert canonical.encode_text(value) == '{"a":4,"b":3,"\U0001f600":2,"\uff61":1}'


def test_strings_escape_like_json_stringify() -> None:
    text = canonical.encode_text('q"\\\n\t\x01\x7f\u2028é')
    assert text == '"q\\"\\\\\\n\\t\\u0001\x7f\u2028é"'


def test_no_insignificant_whitespace() -> None:
    assert canonical.encode({"a": [1, {"b": None}]}) == b'{"a":[1,{"b":null}]}'


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"NaN", "nonFinite"),
        (b"Infinity", "nonFinite"),
        (b"-Infinity", "nonFinite"),
        (b"1e400", "nonFinite"),
        (b'{"a":1,"a":2}', "duplicateKey"),
        (b'"\\ud800"', "loneSurrogate"),
        (b'{"\\udc00":1}', "loneSurrogate"),
        (b"[" * 10_000 + b"]" * 10_000, "tooDeep"),
        (b"[" * 200 + b"]" * 200, "tooDeep"),
        (b"1" * 5000, "unsafeInteger"),
        (b"9007199254740993", "unsafeInteger"),
        (b'{ "a":1}', "nonCanonical"),
        (b'{"b":1,"a":2}', "nonCanonical"),
        (b"1.0", "nonCanonical"),
        (b'"\\u00e9"', "nonCanonical"),
        (b"1E5", "nonCanonical"),
        (b"\xef\xbb\xbf{}", "badEncoding"),
        (b"\xff\xfe", "badEncoding"),
        (b'{"a":1} x', "notJson"),
        (b"", "notJson"),
        (b"{'a':1}", "notJson"),
    ],
)
def test_decode_refuses_bad_input(data: bytes, reason: str) -> None:
    with pytest.raises(CanonicalJsonError) as raised:
        canonical.decode(data)
    assert raised.value.reason == reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "nonFinite"),
        (float("inf"), "nonFinite"),
        (2**53, "unsafeInteger"),
        (b"bytes", "unsupportedType"),
        ({1, 2}, "unsupportedType"),
        ({1: "a"}, "unsupportedType"),
        (object(), "unsupportedType"),
        ("\ud800", "loneSurrogate"),
        ({"\udfff": 1}, "loneSurrogate"),
    ],
)
def test_encode_refuses_values_that_are_not_json(value: object, reason: str) -> None:
    with pytest.raises(CanonicalJsonError) as raised:
        canonical.encode(value)
    assert raised.value.reason == reason


def test_encode_refuses_deep_nesting() -> None:
    value: list[object] = []
    for _ in range(canonical.MAX_DEPTH + 2):
        value = [value]
    with pytest.raises(CanonicalJsonError) as raised:
        canonical.encode(value)
    assert raised.value.reason == "tooDeep"


def test_parse_accepts_whitespace_and_any_key_order_but_keeps_value_rules() -> None:
    assert canonical.parse(b'{ "b" : 1.0, "a" : [ ] }') == {"b": 1.0, "a": []}
    with pytest.raises(CanonicalJsonError):
        canonical.parse(b'{"a": NaN}')


def test_booleans_stay_booleans() -> None:
    assert canonical.decode(b"[true,false,1]") == [True, False, 1]
    assert canonical.decode(b"true") is True


@pytest.mark.parametrize(
    "text",
    [
        b"9007199254740992",
        b"-9007199254740992",
        b"9007199254740993",
        b"100000000000000000000",
        b"999999999999999999999",
    ],
)
def test_integer_literals_beyond_the_safe_range_are_refused(text: bytes) -> None:
    # 2**53 is an exact double, but an integer literal is an integer to every peer, and
    # 2**53 + 1 would read as the same number: refused however it is spelled in integer form.
    for parse in (canonical.decode, canonical.parse):
        with pytest.raises(CanonicalJsonError) as raised:
            parse(text)
        assert raised.value.reason == "unsafeInteger"
        assert "9007199254740991" in str(raised.value)


@pytest.mark.parametrize("value", [2.0**53, -(2.0**53), 1e20, 9.99999999999999e20])
def test_doubles_that_ecmascript_writes_as_unsafe_integers_are_refused(value: float) -> None:
    with pytest.raises(CanonicalJsonError) as raised:
        canonical.encode(value)
    assert raised.value.reason == "unsafeInteger"


def test_safe_edges_and_exponent_form_doubles_round_trip() -> None:
    for value, text in [
        (2**53 - 1, b"9007199254740991"),
        (-(2**53 - 1), b"-9007199254740991"),
        (9007199254740990.0, b"9007199254740990"),
        (1e21, b"1e+21"),
        (-1e21, b"-1e+21"),
        (2.0**70, b"1.1805916207174113e+21"),
    ]:
        assert canonical.encode(value) == text
        assert canonical.decode(text) == value
    assert canonical.parse(b"2e53") == 2e53  # a float literal, not integer form


def test_digest_is_sha256_of_canonical_bytes() -> None:
    import hashlib

    value = {"b": [1, 2], "a": "x"}
    assert canonical.digest(value) == hashlib.sha256(b'{"a":"x","b":[1,2]}').digest()
    assert canonical.digest_hex(value) == canonical.digest(value).hex()


def test_python_json_agrees_on_ascii_values() -> None:
    value = {"z": [1, 2.5, "x"], "a": {"n": None, "t": True}}
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert canonical.encode_text(value) == expected


def rule_by_rule(value: object) -> bytes:
    """The reference encoder alone (what encode did before its C fast path)."""
    parts: list[str] = []
    canonical._encode_into(value, parts, 0)
    return "".join(parts).encode("utf-8")


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-canonical.MAX_SAFE_INTEGER, max_value=canonical.MAX_SAFE_INTEGER)
    | st.text().filter(lambda text: not any("\ud800" <= c <= "\udfff" for c in text)),
    lambda children: (
        st.lists(children, max_size=5)
        | st.tuples(children, children)
        # Keys of every plane: those with a character at or above U+D800 (where UTF-16 order
        # and code point order part) must take the reference encoder.
        | st.dictionaries(
            st.text(alphabet=st.characters(codec="utf-8"), max_size=6), children, max_size=5
        )
    ),
    max_leaves=30,
)


@given(plain_values)
def test_the_fast_encoder_writes_exactly_what_the_rules_write(value: Any) -> None:
    assert canonical.encode(value) == rule_by_rule(value)


@given(json_values)
def test_decode_gives_back_every_encoded_value_by_either_path(value: Any) -> None:
    data = canonical.encode(value)
    assert data == rule_by_rule(value)
    assert canonical.encode(canonical.decode(data)) == data


def test_keys_beyond_the_basic_plane_sort_by_utf16_units_on_the_fast_path_too() -> None:
    # U+FF61 sorts after U+1F600 by UTF-16 code units (0xD83D < 0xFF61), before it by code point.
    value = {"\uff61": 1, "\U0001f600": 2}
    assert canonical.encode(value) == '{"\U0001f600":2,"\uff61":1}'.encode()
    assert canonical.encode({"a": [value]}) == rule_by_rule({"a": [value]})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b'{"a":1,"a":1}', "duplicateKey"),
        (b'{"a":1,"a":2}', "duplicateKey"),
        (b"1e400", "nonFinite"),
        (b"9007199254740992", "unsafeInteger"),
        (b'"\\ud800"', "loneSurrogate"),
        (b"\xef\xbb\xbf1", "badEncoding"),
        (b'{"b":1,"a":2}', "nonCanonical"),
        (b"[" * 200 + b"]" * 200, "tooDeep"),
    ],
)
def test_refusals_name_their_rule_whatever_the_fast_parse_saw(text: bytes, reason: str) -> None:
    with pytest.raises(CanonicalJsonError) as refused:
        canonical.decode(text)
    assert refused.value.reason == reason
