"""The checks a :class:`~piwf.client.Client` call makes of its arguments before anything is sent.

Every refusal is one :class:`~piwf.errors.InvalidArgumentError` (a ``ValueError``) whose message
names the argument and what it allows, never the value given (it may be a payload)::

    client.list_runs(limit=0)
    InvalidArgumentError: invalid argument: limit: Input should be greater than or equal to 1

Request payloads are pydantic models; :func:`build_payload` builds one from a call's arguments
and turns the model's ``ValidationError`` into that error (:func:`invalid_argument_error`), so
no pydantic dump reaches a caller. The CLI (a usage error, exit 2) and ``piwf mcp`` (the tool's
error text) report the same message.
"""

from __future__ import annotations

import math
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from piwf.errors import InvalidArgumentError
from piwf.protocol.client_v1 import MANAGER_NAME_PATTERN, OPAQUE_ID_PATTERN
from piwf.protocol.operations import is_durable

_Model = TypeVar("_Model", bound=BaseModel)

#: What a pattern allows, said in words, for the patterns a caller's argument meets.
_PATTERN_RULES: Final = {
    OPAQUE_ID_PATTERN: "1 to 256 printable ASCII characters, no spaces",
    MANAGER_NAME_PATTERN: (
        "a resource manager's name: a lowercase letter, then lowercase letters, digits and '-'"
    ),
}
_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
#: The longest wait a timeout stands for: a year, as good as no limit. A longer one is waited
#: as this long, since socket and thread waits refuse (OverflowError) beyond about 292 years.
MAX_TIMEOUT_S: Final = 365 * 86_400.0


def request_arguments(operation: object, payload: object) -> None:
    """Check what :meth:`~piwf.client.Client.request` is given beyond what its envelope checks:
    ``operation`` a ``str`` and ``payload`` a mapping or None.

    Raises :class:`~piwf.errors.InvalidArgumentError` naming the argument.
    """
    if not isinstance(operation, str):  # the envelope names the operations a str may be
        raise InvalidArgumentError("invalid argument: operation: an operation name (a str)")
    if payload is not None and not isinstance(payload, Mapping):
        raise InvalidArgumentError(
            "invalid argument: payload: a mapping of the operation's payload fields, or None"
        )


def request_key(operation: str, idempotency_key: str | None) -> str | None:
    """The idempotency key a request of ``operation`` travels with: ``idempotency_key`` (its
    form is checked with the envelope) or, for a durable operation, a fresh one; None for a read.

    Raises :class:`~piwf.errors.InvalidArgumentError` when a read is given a key.
    """
    if not is_durable(operation):
        if idempotency_key is not None:
            raise InvalidArgumentError(
                f"invalid argument: idempotency_key: {operation} is a read and takes none;"
                " leave it out"
            )
        return None
    return f"{operation}-{uuid.uuid4().hex}" if idempotency_key is None else idempotency_key


def build_payload(model: type[_Model], /, **arguments: Any) -> _Model:
    """Return ``model`` built from a call's arguments (given by field name).

    Raises :class:`~piwf.errors.InvalidArgumentError` naming every argument the model refuses.
    """
    try:
        return model(**arguments)
    except ValidationError as error:
        raise invalid_argument_error(error) from None


def invalid_argument_error(error: ValidationError) -> InvalidArgumentError:
    """The typed error for what a payload model refused: per field its name (snake_case, as
    the Python API spells it) and the rule it broke, without the value or pydantic's link."""
    problems = error.errors(include_url=False, include_input=False)
    details = "; ".join(f"{_field_name(problem)}: {_rule(problem)}" for problem in problems)
    return InvalidArgumentError(f"invalid argument: {details}")


def path_argument(name: str, value: object) -> Path:
    """``value`` (a ``str`` or ``os.PathLike``) as an absolute path: ``~`` expanded, a relative
    path resolved against the current directory, ``..`` folded.

    Raises :class:`~piwf.errors.InvalidArgumentError` for anything else (an empty string, or
    one holding a NUL character, which no file name can, too).
    """
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, str) and text and "\x00" not in text:
            return Path(os.path.normpath(Path(text).expanduser().absolute()))
    raise InvalidArgumentError(
        f"invalid argument: {name}: a path is a non-empty str or PathLike without NUL characters"
    )


def project_argument(value: object) -> Path:
    """The project directory ``value`` (default: the current directory) as an absolute path.

    Its ``.piwf/workflows`` and ``.piwf/resources`` are searched for names. A path to nothing
    (a typo) or to something that is not a directory (a workflow file given as the project, say)
    raises :class:`~piwf.errors.InvalidArgumentError` before a request is sent, as the CLI's
    ``--project`` refuses it.
    """
    path = path_argument("project", Path.cwd() if value is None else value)
    try:
        if not path.exists():
            raise InvalidArgumentError(
                f"invalid argument: project: no directory {path}; give the project's directory"
                " (the one holding .piwf/), or leave it out to use the current directory"
            )
        not_a_directory = not path.is_dir()
    except OSError as error:  # a name longer than NAME_MAX, say: the path is never usable
        raise InvalidArgumentError(
            f"invalid argument: project: the path cannot be used ({error.strerror}); give the"
            " project's directory, or leave it out to use the current directory"
        ) from None
    if not_a_directory:
        raise InvalidArgumentError(
            f"invalid argument: project: {path} is not a directory; give the project's"
            " directory (the one holding .piwf/), or leave it out to use the current directory"
        )
    return path


def absolute_path_argument(name: str, value: object, rule: str) -> Path:
    """``value`` (a ``str`` or ``os.PathLike``) when it is an absolute path, ``..`` folded.

    For a path the caller must spell out in full (a relative one is not resolved against the
    current directory; one holding a NUL character is refused too). Raises
    :class:`~piwf.errors.InvalidArgumentError` naming ``name`` and ``rule``, the allowed values
    in words, for anything else.
    """
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, str) and Path(text).is_absolute() and "\x00" not in text:
            return Path(os.path.normpath(text))
    raise InvalidArgumentError(f"invalid argument: {name}: {rule}")


def flag_argument(name: str, value: object) -> bool:
    """``value`` when it is a ``bool``; else :class:`~piwf.errors.InvalidArgumentError` naming
    ``name`` (a truthy ``"no"`` must never switch a flag on)."""
    if isinstance(value, bool):
        return value
    raise InvalidArgumentError(f"invalid argument: {name}: True or False")


def timeout_argument(name: str, value: object, *, zero_allowed: bool = False) -> float:
    """``value`` as a number of seconds: a finite number above 0 (at least 0 with
    ``zero_allowed``), at most :data:`MAX_TIMEOUT_S` (a larger one is taken as that).
    Raises :class:`~piwf.errors.InvalidArgumentError` naming ``name``."""
    least = "at least 0" if zero_allowed else "above 0"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = _seconds(value)
        if math.isfinite(seconds) and (seconds > 0 or (zero_allowed and seconds == 0)):
            return min(seconds, MAX_TIMEOUT_S)
    raise InvalidArgumentError(f"invalid argument: {name}: a number of seconds {least}")


def wait_timeout_argument(name: str, value: object) -> float | None:
    """``value`` as the seconds a wait may take: None (no limit) or a number that is not NaN (0
    or less: ask once without waiting). Raises :class:`~piwf.errors.InvalidArgumentError`
    naming ``name``."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        return _seconds(value)
    raise InvalidArgumentError(f"invalid argument: {name}: a number of seconds, or None")


def _seconds(value: float) -> float:
    """``value`` as a float; an int too large for one (``10**400``) as plus or minus
    :data:`MAX_TIMEOUT_S`."""
    try:
        return float(value)
    except OverflowError:
        return MAX_TIMEOUT_S if value > 0 else -MAX_TIMEOUT_S


def whole_number_argument(
    name: str,
    value: object,
    rule: str,
    *,
    least: int | None = 0,
    most: int | None = None,
    optional: bool = True,
) -> int | None:
    """``value`` when it is an integer (not a bool) from ``least`` to ``most`` (None:
    unbounded), or None when ``optional``; else :class:`~piwf.errors.InvalidArgumentError`
    naming ``name`` and ``rule``, the allowed values in words."""
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"invalid argument: {name}: {rule}")
    if (least is None or value >= least) and (most is None or value <= most):
        return value
    raise InvalidArgumentError(f"invalid argument: {name}: {rule}")


def content_limit_argument(value: object) -> int | None:
    """``value`` as a ``content_limit``: None (read every referenced value) or a number of
    bytes, 0 or more. Raises :class:`~piwf.errors.InvalidArgumentError` otherwise."""
    return whole_number_argument("content_limit", value, "a number of bytes, 0 or more, or None")


def opaque_id_argument(name: str, value: object) -> str:
    """``value`` when it is an id the protocol takes (1 to 256 printable ASCII characters, no
    spaces); else :class:`~piwf.errors.InvalidArgumentError` naming ``name``."""
    if isinstance(value, str) and re.fullmatch(OPAQUE_ID_PATTERN, value):
        return value
    raise InvalidArgumentError(f"invalid argument: {name}: {_PATTERN_RULES[OPAQUE_ID_PATTERN]}")


def _field_name(problem: ErrorDetails) -> str:
    parts = [str(part) for part in problem["loc"]]
    return ".".join(_CAMEL_HUMP.sub("_", part).lower() for part in parts) or "arguments"


def _rule(problem: ErrorDetails) -> str:
    if problem["type"] == "string_pattern_mismatch":
        pattern = (problem.get("ctx") or {}).get("pattern")
        if pattern in _PATTERN_RULES:
            return str(_PATTERN_RULES[pattern])
    context = problem.get("ctx") or {}
    if problem["type"] == "value_error":  # a model's own check: its message, without the prefix
        return str(context.get("error") or problem["msg"])
    if problem["type"] in ("too_short", "too_long") and context.get("field_type") == "List":
        # pydantic's "List should have at least 1 item after validation, not 0", in words
        if problem["type"] == "too_long":
            return f"a list of at most {context.get('max_length')} items"
        least = context.get("min_length")
        return "a list of one item or more" if least == 1 else f"a list of {least} items or more"
    return problem["msg"]
