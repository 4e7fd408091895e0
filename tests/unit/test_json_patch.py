"""RFC 6902 JSON Patch and RFC 6901 pointers (:mod:`piwf.json_patch`), with the RFC's own
examples: every operation, every refusal, and a refused patch leaves the document as it was."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from piwf.json_patch import JsonPatchError, apply_patch, parse_patch, parse_pointer


def patched(document: object, patch: object) -> object:
    return apply_patch(document, parse_patch(patch))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("document", "patch", "expected"),
    [
        (
            {"foo": "bar"},
            [{"op": "add", "path": "/baz", "value": "qux"}],
            {"baz": "qux", "foo": "bar"},
        ),
        (
            {"foo": ["bar", "baz"]},
            [{"op": "add", "path": "/foo/1", "value": "qux"}],
            {"foo": ["bar", "qux", "baz"]},
        ),
        ({"foo": ["bar"]}, [{"op": "add", "path": "/foo/-", "value": "x"}], {"foo": ["bar", "x"]}),
        ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
        (
            {"foo": ["bar", "qux", "baz"]},
            [{"op": "remove", "path": "/foo/1"}],
            {"foo": ["bar", "baz"]},
        ),
        ({"baz": "qux"}, [{"op": "replace", "path": "/baz", "value": "boo"}], {"baz": "boo"}),
        (
            {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
            [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
            {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
        ),
        (
            {"foo": ["all", "grass", "cows", "eat"]},
            [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
            {"foo": ["all", "cows", "eat", "grass"]},
        ),
        (
            {"a": {"b": 1}},
            [{"op": "copy", "from": "/a", "path": "/c"}],
            {"a": {"b": 1}, "c": {"b": 1}},
        ),
        (
            {"baz": "qux", "foo": ["a", 2, "c"]},
            [
                {"op": "test", "path": "/baz", "value": "qux"},
                {"op": "test", "path": "/foo/1", "value": 2},
            ],
            {"baz": "qux", "foo": ["a", 2, "c"]},
        ),
        (
            {"a/b": 1, "m~n": 2},
            [{"op": "replace", "path": "/a~1b", "value": 3}, {"op": "remove", "path": "/m~0n"}],
            {"a/b": 3},
        ),
        ({"foo": 1}, [{"op": "replace", "path": "", "value": [1]}], [1]),
    ],
)
def test_the_rfc_examples_apply(document: object, patch: object, expected: object) -> None:
    before = copy.deepcopy(document)
    assert patched(document, patch) == expected
    assert document == before  # the input document is never changed


@pytest.mark.parametrize(
    ("document", "patch", "says"),
    [
        ({"foo": "bar"}, [{"op": "test", "path": "/foo", "value": "baz"}], "differs"),
        ({"foo": 1}, [{"op": "test", "path": "/foo", "value": True}], "differs"),
        ({"foo": "bar"}, [{"op": "remove", "path": "/nope"}], "does not exist"),
        ({"foo": "bar"}, [{"op": "replace", "path": "/nope", "value": 1}], "does not exist"),
        ({"foo": ["a"]}, [{"op": "add", "path": "/foo/2", "value": 1}], "out of range"),
        ({"foo": ["a"]}, [{"op": "add", "path": "/foo/01", "value": 1}], "not an array index"),
        (
            {"foo": "bar"},
            [{"op": "add", "path": "/foo/x", "value": 1}],
            "not an object or an array",
        ),
        ({"a": {"b": 1}}, [{"op": "move", "from": "/a", "path": "/a/b/c"}], "into itself"),
        (
            {"a": 1},
            [{"op": "add", "path": "/b", "value": 1}, {"op": "remove", "path": "/zz"}],
            "operation 1",
        ),
    ],
)
def test_a_patch_that_does_not_apply_is_refused_whole(
    document: object, patch: object, says: str
) -> None:
    before = copy.deepcopy(document)
    with pytest.raises(JsonPatchError, match=says):
        patched(document, patch)
    assert document == before


@pytest.mark.parametrize(
    ("patch", "says"),
    [
        ({"op": "add"}, "must be a list"),
        ([], "at least one"),
        (["add"], "must be an object"),
        ([{"op": "jump", "path": "/a"}], "op must be one of"),
        ([{"op": "add", "path": "/a"}], "missing value"),
        ([{"op": "remove", "path": "/a", "value": 1}], "unknown member"),
        ([{"op": "move", "path": "/a"}], "missing from"),
        ([{"op": "remove", "path": "a"}], "start with '/'"),
        ([{"op": "remove", "path": "/a~2"}], "'~' must be followed"),
        ([{"op": "remove", "path": 3}], "must be a string"),
        ([{"op": "test", "path": "/a", "value": 1}] * 257, "at most 256"),
    ],
)
def test_a_malformed_patch_is_refused_before_anything_is_applied(patch: object, says: str) -> None:
    with pytest.raises(JsonPatchError, match=says):
        parse_patch(patch)


def test_pointers_unescape_in_the_rfc_order() -> None:
    assert parse_pointer("") == ()
    assert parse_pointer("/~01") == ("~1",)  # ~1 is undone before ~0
    assert parse_pointer("/a~1b/~0") == ("a/b", "~")


keys = st.text(alphabet="abc/~", min_size=1, max_size=4)
documents = st.dictionaries(keys, st.integers(-5, 5), max_size=4)


@given(documents, keys, st.integers(-5, 5))
def test_add_then_remove_restores_a_document_without_that_key(
    document: dict[str, int], key: str, value: int
) -> None:
    document.pop(key, None)
    pointer = "/" + key.replace("~", "~0").replace("/", "~1")
    added = patched(document, [{"op": "add", "path": pointer, "value": value}])
    assert added == {**document, key: value}
    assert patched(added, [{"op": "remove", "path": pointer}]) == document
