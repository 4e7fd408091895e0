"""A workflow file's bytes compiled as Python's import would compile them, or one
:class:`~piwf.errors.WorkflowLoadError` that names the file and the line.

``compile`` alone lets pass what an import refuses: bytes that are not in the file's encoding
(UTF-8, or what a PEP 263 coding line declares) inside a comment. The loader executes the bytes
it hashed, never a second read of the file, so they are checked here first.

A key written twice in one dict display of a ``define_workflow(...)`` call (two nodes named
``"a"``, a switch case twice) is refused too: Python keeps the last value silently, so the
definition would never see the first.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path
from types import CodeType

from piwf.errors import WorkflowLoadError


def compile_workflow_source(path: Path, filename: Path, data: bytes) -> CodeType:
    """Compile ``data`` (the file ``path``, compiled under the name ``filename``) for
    ``exec``; raise :class:`WorkflowLoadError` for bytes Python would not import."""
    _check_encoding(path, data)
    try:
        tree = ast.parse(data, str(filename), "exec")
        _check_duplicate_keys(path, tree)
        return compile(tree, str(filename), "exec", dont_inherit=True)
    except SyntaxError as error:
        where = "" if error.lineno is None else f" at line {error.lineno}"
        raise WorkflowLoadError(f"{path}: syntax error{where}: {error.msg}") from None
    except ValueError as error:  # a NUL byte, before Python 3.12 (a SyntaxError since)
        raise WorkflowLoadError(f"{path}: syntax error: {error}") from None


def _check_encoding(path: Path, data: bytes) -> None:
    """Refuse bytes that are not in the file's encoding, comments included."""
    encoding = "utf-8"
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        data.decode(encoding)
    except SyntaxError as error:
        # A coding line naming no known encoding, or a first or second line that is not
        # UTF-8 ("invalid or missing encoding declaration", which names no line).
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as not_utf8:
            raise _not_in_encoding(path, data, not_utf8, encoding) from None
        raise WorkflowLoadError(f"{path}: syntax error: {error.msg}") from None
    except UnicodeDecodeError as error:
        raise _not_in_encoding(path, data, error, encoding) from None


def _not_in_encoding(
    path: Path, data: bytes, error: UnicodeDecodeError, encoding: str
) -> WorkflowLoadError:
    line = data.count(b"\n", 0, error.start) + 1
    return WorkflowLoadError(
        f"{path}: syntax error at line {line}: the file is not valid {encoding} there;"
        " save it as UTF-8, or declare its encoding in a coding line (# -*- coding: ... -*-)"
    )


def _check_duplicate_keys(path: Path, tree: ast.AST) -> None:
    """Refuse a constant key given twice in one dict display inside a ``define_workflow``
    call (named by its line)."""
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or _called_name(call.func) != "define_workflow":
            continue
        for node in ast.walk(call):
            if not isinstance(node, ast.Dict):
                continue
            seen: set[object] = set()
            for key in node.keys:
                if not isinstance(key, ast.Constant):
                    continue
                if key.value in seen:
                    raise WorkflowLoadError(
                        f"{path}: line {key.lineno}: key {key.value!r} is written twice in one"
                        " dict of define_workflow(...); Python keeps only the last, so the"
                        " first would be dropped without a word: give each node, mount, exit"
                        " and switch case its own name"
                    )
                seen.add(key.value)


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None
