"""What every command shares: the ``--json`` flag, error reporting, argument types, the client.

A command body raises; :func:`command` turns the error into the exit-code protocol::

    InvalidArgumentError (an argument the client   -> exit 2, as a usage error
      refused: out of range, too large to send)
    PiwfError (server unavailable, rejected, ...)  -> exit 1, "Error: ..." on stderr,
                                                      or {"error": {...}} on stdout with --json
    pydantic ValidationError (an argument a        -> exit 2, as a usage error
      payload model refused)
    click.UsageError (bad option, missing arg)     -> exit 2 (see piwf.cli.PiwfGroup for --json)
    KeyboardInterrupt (Ctrl-C)                     -> exit 130, {"error": {"code": "interrupted"}}
                                                      on stdout with --json
    SIGTERM while a command waits on a run         -> exit 143, {"error": {"code": "terminated"}}
      (:func:`sigterm_stops_waiting`)                 on stdout with --json
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TypeGuard, TypeVar

import click

from piwf import canonical
from piwf.cli.safe_text import given, printable
from piwf.config import plain_number
from piwf.errors import CanonicalJsonError, CommandError, InvalidArgumentError, PiwfError

if TYPE_CHECKING:
    from pydantic import ValidationError

    from piwf.client import Client

_F = TypeVar("_F", bound=Callable[..., Any])

_OPAQUE_ID = re.compile(r"[\x21-\x7e]{1,256}")

#: The exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT = 130
#: The exit status of a waiting command stopped by SIGTERM (128 + SIGTERM).
TERMINATED_EXIT = 143
#: What Ctrl-C leaves as it was, said to the person who pressed it.
_GOES_ON = (
    "only this command stopped: a run it started or waited on goes on (piwf run list shows"
    " whether a start got that far)"
)


def json_option(function: _F) -> _F:
    """Add ``--json``: print exactly one JSON document on stdout instead of human text."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print exactly one JSON document on stdout (errors too).",
    )(function)


def emit_json(document: object) -> None:
    """Print ``document`` as one line of canonical JSON on stdout."""
    click.echo(canonical.encode_text(document))


def _is_validation_error(error: Exception) -> TypeGuard[ValidationError]:
    """Whether ``error`` is pydantic's ``ValidationError``. Only a command that loaded pydantic
    can have raised one, and a command that did not (``run list``'s quick path) must not load
    it just to ask."""
    pydantic_core = sys.modules.get("pydantic_core")
    return pydantic_core is not None and isinstance(error, pydantic_core.ValidationError)


def command(function: _F) -> _F:
    """Run a command body under the exit-code protocol; the body takes ``as_json``."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return function(*args, **kwargs)
        except InvalidArgumentError as error:
            # An argument the client refused (a title too long, an input too large to send).
            # The message names the argument and the rule, never the value (it may be a payload).
            raise click.UsageError(as_cli_options(str(error))) from None
        except PiwfError as error:
            fail(error, as_json=as_json)
        except Exception as error:
            if not _is_validation_error(error):
                raise
            from piwf.client.arguments import invalid_argument_error

            raise click.UsageError(as_cli_options(str(invalid_argument_error(error)))) from None
        except KeyboardInterrupt as stop:
            interrupted(as_json=as_json, stop=stop)

    return run  # type: ignore[return-value]


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while the command waited (:func:`sigterm_stops_waiting`). It is a
    ``KeyboardInterrupt`` so that every place that stops waiting on Ctrl-C stops on it too."""


@contextlib.contextmanager
def sigterm_stops_waiting() -> Iterator[None]:
    """While the block waits on a run, SIGTERM (a service manager's stop, ``kill``) ends the
    command as Ctrl-C does, saying so, with status :data:`TERMINATED_EXIT`: without it the
    command died silently, and a script could not tell a stop from a crash. What it waited on
    goes on. Only in the main thread, and only while SIGTERM has its default action (a caller
    that handles it keeps its own handler)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        if _importing(frame):
            # Raised inside an import (a module's pydantic models being built), it would come
            # out as that import's error and a traceback: the stop is asked again once the
            # import is over.
            again = threading.Timer(_STOP_AGAIN_S, os.kill, (os.getpid(), signal.SIGTERM))
            again.daemon = True
            again.start()
            return
        raise Terminated

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


#: How long after a SIGTERM that came during an import it is sent again.
_STOP_AGAIN_S = 0.05


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` (where a signal interrupted the program) is inside an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def interrupt_status(stop: KeyboardInterrupt) -> int:
    """The exit status of a command that ``stop`` ended: 143 for SIGTERM, 130 for Ctrl-C."""
    return TERMINATED_EXIT if isinstance(stop, Terminated) else INTERRUPTED_EXIT


#: Where a client's refusal names an argument: ``invalid argument: NAME: RULE[; NAME: RULE]``.
_REFUSED_ARGUMENT = re.compile(r"(^invalid argument: |; )([a-z][a-z0-9_]*)(?=[.:])")


def as_cli_options(message: str) -> str:
    """``message`` (an :class:`InvalidArgumentError`'s) with each client argument it names
    spelled as the running command's option or argument (``note`` as ``'--note'``), so the
    person told which rule they broke knows what they typed it in; a name the command has no
    parameter for is left as the client spells it."""
    context = click.get_current_context(silent=True)
    if context is None:
        return message
    params = context.command.params

    def spelled(match: re.Match[str]) -> str:
        name = match[2]
        flag = "--" + name.replace("_", "-")
        # ``input`` is typed as --input or --input-file: name the one this command was given.
        candidates = [
            param
            for param in params
            if flag in param.opts
            or param.name == name
            or any(opt.startswith(flag + "-") for opt in param.opts)
        ]
        given = [param for param in candidates if _given(context, param)]
        for param in given or candidates[:1]:
            hint = param.get_error_hint(context)
            lead = "invalid value for " if match[1] != "; " else match[1] + "for "
            return f"{lead}{hint}"
        return match[0]

    return _REFUSED_ARGUMENT.sub(spelled, message)


def _given(context: click.Context, param: click.Parameter) -> bool:
    """Whether ``param`` was typed on the command line (or read from its variable)."""
    source = None if param.name is None else context.get_parameter_source(param.name)
    return source in (
        click.core.ParameterSource.COMMANDLINE,
        click.core.ParameterSource.ENVIRONMENT,
    )


def interrupted(
    *, as_json: bool, stop: KeyboardInterrupt | None = None, goes_on: str = _GOES_ON
) -> NoReturn:
    """End a command that Ctrl-C (or, while it waited, SIGTERM: ``stop`` is
    :class:`Terminated`) stopped: exit 130 (143), and with ``--json`` still one document (the
    error ``interrupted``, or ``terminated``). What the command asked of the server stays
    asked: a wait only stops waiting, the run goes on; ``goes_on`` says so for a command that
    asked something else."""
    if isinstance(stop, Terminated):
        code, by, said = "terminated", "SIGTERM", "terminated"
    else:
        code, by, said = "interrupted", "Ctrl-C", "interrupted"
    if as_json:
        emit_json({"error": {"code": code, "message": f"stopped by {by}; {goes_on}"}})
    else:
        click.echo(f"{said}; {goes_on}", err=True)
    raise click.exceptions.Exit(interrupt_status(stop or KeyboardInterrupt()))


def fail(error: PiwfError, *, as_json: bool) -> NoReturn:
    """Report ``error`` (to stdout as JSON, or to stderr) and exit with status 1. The human
    form escapes the message's control characters (a validator's or a workflow's text may carry
    a terminal escape), keeping its line breaks; ``--json`` has it as sent."""
    code = error.error_code if isinstance(error, CommandError) else error.code
    if as_json:
        emit_json({"error": {"code": code, "message": str(error)}})
    else:
        click.echo(f"Error: {printable(str(error))}", err=True)
    raise click.exceptions.Exit(1)


@contextlib.contextmanager
def naming_given(lead: str, refusal: type[PiwfError], *codes: str) -> Iterator[None]:
    """Name what the user gave in a refusal raised in the block: a ``refusal`` (of one of the
    wire codes ``codes``, when any are given) is raised again, of the same type and code, its
    message led by ``lead`` (which names the value as :func:`~piwf.cli.safe_text.given` shows
    it). The server's refusal never repeats the text it was sent (a stored receipt keeps no
    request text); the CLI has it from its user."""
    try:
        yield
    except refusal as refused:
        code = refused.error_code if isinstance(refused, CommandError) else refused.code
        if codes and code not in codes:
            raise
        named = copy.copy(refused)
        named.args = (f"{lead}: {refused}",)
        raise named from None


class Integer(click.IntRange):
    """An integer from ``minimum`` to ``maximum`` (inclusive; None: unbounded), written as the
    ``PIWF_*`` variables take one (:func:`piwf.config.plain_number`): ``1_0`` and non-ASCII
    digits such as ``\u0661\u0660``, which Python's ``int`` takes, are usage errors that name the
    option and the range."""

    name = "integer"

    def __init__(self, minimum: int, maximum: int | None = None) -> None:
        super().__init__(min=minimum, max=maximum)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number: int | None = None
        if not isinstance(value, str) or plain_number(value):
            try:
                number = int(value)
            except (TypeError, ValueError):
                number = None
        low, high = self.min, self.max
        if (
            number is None
            or (low is not None and number < low)
            or (high is not None and number > high)
        ):
            self.fail(f"{value!r} is not {self.described()}.", param, ctx)
        return number

    def described(self) -> str:
        """What the option takes, as its error says it."""
        bounds = f"of at least {self.min}" if self.max is None else f"from {self.min} to {self.max}"
        return f"an integer {bounds} written in ASCII digits without separators"


class Seconds(click.FloatRange):
    """A finite, non-negative number of seconds, at most ``maximum`` when given, written in
    plain ASCII (:func:`piwf.config.plain_number`): ``nan``, ``inf``, ``1_0`` and non-ASCII
    digits are usage errors (a wait or an idle exit that never ends is no number of seconds)."""

    name = "seconds"

    def __init__(self, maximum: float | None = None) -> None:
        super().__init__(min=0, max=maximum)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not plain_number(value):
            self.fail(
                f"{value!r} is not a number of seconds in plain ASCII digits (such as 2.5).",
                param,
                ctx,
            )
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):  # said before the range, which inf would miss too
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return super().convert(number, param, ctx)


def run_id_argument(function: _F) -> _F:
    """Add the ``RUN_ID`` argument, checked against the protocol's id rule."""
    return click.argument("run_id", metavar="RUN_ID", callback=id_check("run"))(function)


def request_id_argument(function: _F) -> _F:
    """Add the ``REQUEST_ID`` argument, checked against the id rule piwf's ids follow."""
    return click.argument("request_id", metavar="REQUEST_ID", callback=id_check("request"))(
        function
    )


def effect_id_argument(function: _F) -> _F:
    """Add the ``EFFECT_ID`` argument, checked against the id rule piwf's ids follow."""
    return click.argument("effect_id", metavar="EFFECT_ID", callback=id_check("effect"))(function)


#: Where a person finds the ids of each kind, said when one given is malformed or unknown.
ID_LISTINGS: dict[str, str] = {
    "run": "piwf run list shows the run ids",
    "request": "piwf requests lists the pending requests",
    "effect": "piwf run show RUN_ID lists a run's effects",
    "session": "piwf session list shows the sessions",
}


def id_check(kind: str) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    """A click callback that takes a ``kind`` id (or no value: an option left out) only when
    it keeps the protocol's id rule, so a malformed one is a usage error (exit 2) that reaches
    no server, whatever kind of id it is. The error names the value given
    (:func:`~piwf.cli.safe_text.given`), the rule and where the ids are listed."""

    def check(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        if value is not None and not _OPAQUE_ID.fullmatch(value):
            raise click.BadParameter(
                malformed_id(
                    kind,
                    value,
                    f"{_article(kind)} {kind} id is 1 to 256 printable ASCII characters, no spaces",
                )
            )
        return value

    return check


def malformed_id(kind: str, value: str, rule: str) -> str:
    """The refusal of ``value`` as a ``kind`` id that breaks ``rule``: what was given, the rule
    and where the ids of that kind are listed."""
    return f"{given(value)} is not {_article(kind)} {kind} id: {rule} ({ID_LISTINGS[kind]})"


def _article(noun: str) -> str:
    """``an`` before a noun that starts with a vowel (``an effect``), else ``a``."""
    return "an" if noun[:1] in "aeiou" else "a"


def check_session_id(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A click callback: a session id of the protocol's shape, or a usage error (exit 2)."""
    from piwf.protocol.session_payloads import session_id_problem

    if value is not None and (problem := session_id_problem(value)) is not None:
        raise click.BadParameter(malformed_id("session", value, problem))
    return value


def parse_json(data: str | bytes, param_hint: str) -> canonical.JsonValue:
    """Parse user JSON text under the canonical value rules, or raise a usage error (exit 2).

    Any whitespace and key order are fine; what the protocol refuses is refused here, before
    anything is sent: integers beyond ±(2**53 - 1) (``9007199254740992`` included), ``NaN``,
    ``Infinity``, overflowing numbers, duplicate keys, lone surrogates, invalid UTF-8. The
    message names the rule, never the value. Text from the command line holds the bytes that
    were not UTF-8 as escaped surrogates (Python's ``surrogateescape``): parsed as those bytes,
    invalid UTF-8 typed into an argument is ``badEncoding``, as it is in a file.
    """
    try:
        return canonical.parse(_argument_bytes(data))
    except CanonicalJsonError as error:
        raise click.BadParameter(
            f"not valid JSON for piwf ({error.reason}): {error}{_shell_quoting_hint(data, error)}",
            param_hint=param_hint,
        ) from None


def _argument_bytes(data: str | bytes) -> str | bytes:
    """``data`` as the bytes it was typed as when it is command-line text, else unchanged (a
    surrogate that no command line gives is left for the JSON rules to name)."""
    if isinstance(data, bytes):
        return data
    try:
        return os.fsencode(data)
    except UnicodeEncodeError:
        return data


def _shell_quoting_hint(data: str | bytes, error: CanonicalJsonError) -> str:
    """A hint for an object or array without a double quote (``{ok:true}``): what a shell
    leaves of ``{"ok":true}`` typed without single quotes around it; for a bare word (a string
    without its quotes); or for empty text. It names the rule, never the text."""
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    if error.reason == "notJson" and not text.strip():
        # An empty --input-file (or stdin that ended at once) says so, not "line 1 column 1".
        return "; the text is empty: give a JSON value, e.g. '{}'"
    if error.reason != "notJson":
        return ""
    bare_words = '"' not in text and any(character.isalpha() for character in text)
    if bare_words and text.lstrip().startswith(("{", "[")):
        return (
            "; a shell removes double quotes that are not inside single quotes: write the JSON"
            """ in single quotes, e.g. '{"choice": "ship"}'"""
        )
    if bare_words:  # a bare word or phrase: meant as a string
        return (
            "; a JSON string is written in double quotes, inside single quotes for the shell,"
            """ e.g. '"hello"'"""
        )
    if _ends_early(text):
        return "; the text ends before its JSON does: close every string, array and object"
    return ""


def _ends_early(text: str) -> bool:
    """Whether ``text`` is JSON cut off: its first error is at its (trimmed) end."""
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        return bool(text.strip()) and error.pos >= len(text.rstrip())
    except ValueError:
        return False
    return False


def open_client(*, autostart: bool = True, remote: str | None = None) -> Client:
    """Return a client for ``$PIWF_HOME`` (or, with ``remote``, for the server behind that
    piwf relay) under a fresh CLI client id.

    One invocation is one client: its durable commands get one idempotency key each, kept
    across the client's automatic retries (docs/PROTOCOL.md §6).
    """
    # Imported here: `piwf server run`, the server's own process, needs no client.
    from piwf.client import Client

    return Client(client_id=f"cli-{uuid.uuid4().hex}", autostart=autostart, remote=remote)
