"""RFC 6902 JSON Patch over canonical JSON values, with RFC 6901 JSON Pointers.

Pure functions with no I/O: :func:`parse_patch` checks a patch's shape (every operation, its
``path`` and ``from`` pointers, no unknown members) and :func:`apply_patch` applies it to a copy
of a document, all operations or none. Both raise :class:`JsonPatchError` naming the operation
(by index) and the rule it broke, so a refused patch changes nothing.

Operations: ``add``, ``remove``, ``replace``, ``move``, ``copy`` and ``test``. ``-`` as the last
token of an ``add`` path appends to an array; array indexes are decimal without leading zeros.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from piwf.canonical import JsonValue

Operation = Literal["add", "remove", "replace", "move", "copy", "test"]
OPERATIONS: frozenset[str] = frozenset({"add", "remove", "replace", "move", "copy", "test"})
#: Operations a patch may hold (a larger patch is refused before anything is applied).
MAX_OPERATIONS = 256
_MEMBERS: dict[str, frozenset[str]] = {
    "add": frozenset({"op", "path", "value"}),
    "remove": frozenset({"op", "path"}),
    "replace": frozenset({"op", "path", "value"}),
    "move": frozenset({"op", "path", "from"}),
    "copy": frozenset({"op", "path", "from"}),
    "test": frozenset({"op", "path", "value"}),
}


#: The last token of an ``add`` path that appends to an array.
_END_OF_ARRAY = "-"


class JsonPatchError(ValueError):
    """A patch that is malformed or does not apply to the document."""


@dataclass(frozen=True)
class PatchOperation:
    """One checked operation; ``from_path`` is set for ``move`` and ``copy`` only."""

    op: Operation
    path: tuple[str, ...]
    pointer: str
    value: JsonValue = None
    from_path: tuple[str, ...] | None = None
    from_pointer: str | None = None

    def pointers(self) -> tuple[str, ...]:
        """Every pointer this operation names (``path``, then ``from`` when set)."""
        return (self.pointer,) if self.from_pointer is None else (self.pointer, self.from_pointer)

    @property
    def writes(self) -> bool:
        """Whether this operation changes the document (every operation but ``test``)."""
        return self.op != "test"


def parse_pointer(pointer: object) -> tuple[str, ...]:
    """Return the reference tokens of an RFC 6901 pointer (``""`` is the whole document)."""
    if not isinstance(pointer, str):
        raise JsonPatchError("a JSON pointer must be a string")
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise JsonPatchError(f"JSON pointer {pointer!r} must be empty or start with '/'")
    tokens = []
    for raw in pointer[1:].split("/"):
        if "~" in raw.replace("~0", "").replace("~1", ""):
            raise JsonPatchError(f"JSON pointer {pointer!r}: '~' must be followed by 0 or 1")
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def pointer_within(pointer: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    """Whether ``pointer`` names ``prefix`` itself or something inside it."""
    return pointer[: len(prefix)] == prefix


def parse_patch(patch: object) -> tuple[PatchOperation, ...]:
    """Check ``patch`` (a list of operation objects) and return its operations."""
    if not isinstance(patch, list):
        raise JsonPatchError("a JSON Patch must be a list of operations")
    if not patch:
        raise JsonPatchError("a JSON Patch needs at least one operation")
    if len(patch) > MAX_OPERATIONS:
        raise JsonPatchError(f"a JSON Patch may hold at most {MAX_OPERATIONS} operations")
    return tuple(_parse_operation(index, raw) for index, raw in enumerate(patch))


def _parse_operation(index: int, raw: object) -> PatchOperation:
    where = f"operation {index}"
    if not isinstance(raw, dict):
        raise JsonPatchError(f"{where} must be an object")
    op = raw.get("op")
    if not isinstance(op, str) or op not in OPERATIONS:
        raise JsonPatchError(f"{where}: op must be one of {', '.join(sorted(OPERATIONS))}")
    allowed = _MEMBERS[op]
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise JsonPatchError(f"{where} ({op}): unknown member(s) {', '.join(unknown)}")
    missing = sorted(allowed - set(raw))
    if missing:
        raise JsonPatchError(f"{where} ({op}): missing {', '.join(missing)}")
    try:
        path = parse_pointer(raw["path"])
        from_path = parse_pointer(raw["from"]) if "from" in raw else None
    except JsonPatchError as error:
        raise JsonPatchError(f"{where} ({op}): {error}") from None
    moved_into_itself = from_path is not None and pointer_within(path, from_path)
    if op == "move" and moved_into_itself and path != from_path:
        raise JsonPatchError(f"{where} (move): cannot move a value into itself")
    return PatchOperation(
        op=op,  # type: ignore[arg-type]
        path=path,
        pointer=raw["path"],
        value=raw.get("value"),
        from_path=from_path,
        from_pointer=raw.get("from"),
    )


def apply_patch(document: JsonValue, operations: Sequence[PatchOperation]) -> JsonValue:
    """Return a new document with every operation applied in order (``document`` is kept)."""
    result = copy.deepcopy(document)
    for index, operation in enumerate(operations):
        try:
            result = _apply(result, operation)
        except JsonPatchError as error:
            raise JsonPatchError(f"operation {index} ({operation.op}): {error}") from None
    return result


def _apply(document: JsonValue, operation: PatchOperation) -> JsonValue:
    match operation.op:
        case "add":
            return _add(document, operation.path, copy.deepcopy(operation.value))
        case "remove":
            return _remove(document, operation.path)[0]
        case "replace":
            _get(document, operation.path)
            document = _remove(document, operation.path)[0]
            return _add(document, operation.path, copy.deepcopy(operation.value))
        case "move":
            assert operation.from_path is not None
            document, value = _remove(document, operation.from_path)
            return _add(document, operation.path, value)
        case "copy":
            assert operation.from_path is not None
            value = copy.deepcopy(_get(document, operation.from_path))
            return _add(document, operation.path, value)
        case "test":
            if not _equal(_get(document, operation.path), operation.value):
                raise JsonPatchError(f"the value at {operation.pointer!r} differs")
            return document


def _get(document: JsonValue, path: tuple[str, ...]) -> JsonValue:
    value = document
    for depth, token in enumerate(path):
        if isinstance(value, dict):
            if token not in value:
                raise JsonPatchError(f"{_show(path[: depth + 1])} does not exist")
            value = value[token]
        elif isinstance(value, list):
            value = value[_index(value, token, path[: depth + 1], appending=False)]
        else:
            raise JsonPatchError(f"{_show(path[:depth])} is not an object or an array")
    return value


def _add(document: JsonValue, path: tuple[str, ...], value: JsonValue) -> JsonValue:
    if not path:
        return value
    parent = _get(document, path[:-1])
    token = path[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, path, appending=True), value)
    else:
        raise JsonPatchError(f"{_show(path[:-1])} is not an object or an array")
    return document


def _remove(document: JsonValue, path: tuple[str, ...]) -> tuple[JsonValue, JsonValue]:
    if not path:
        return None, document
    parent = _get(document, path[:-1])
    token = path[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise JsonPatchError(f"{_show(path)} does not exist")
        return document, parent.pop(token)
    if isinstance(parent, list):
        return document, parent.pop(_index(parent, token, path, appending=False))
    raise JsonPatchError(f"{_show(path[:-1])} is not an object or an array")


def _index(array: list[JsonValue], part: str, path: tuple[str, ...], *, appending: bool) -> int:
    if appending and part == _END_OF_ARRAY:
        return len(array)
    if not part.isdigit() or not part.isascii() or (part != "0" and part.startswith("0")):
        raise JsonPatchError(f"{_show(path)}: {part!r} is not an array index")
    index = int(part)
    if index > len(array) or (index == len(array) and not appending):
        raise JsonPatchError(f"{_show(path)}: index {index} is out of range")
    return index


def _equal(left: JsonValue, right: JsonValue) -> bool:
    """RFC 6902 equality: numbers by value, but never a boolean as a number."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_equal, left, right))
    return type(left) is type(right) and left == right


def _show(path: tuple[str, ...]) -> str:
    text = "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in path)
    return repr(text)
