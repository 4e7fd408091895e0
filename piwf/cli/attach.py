"""``piwf session attach``: a terminal host where a person acts as the origin session.

It attaches as the session's coordinator (fencing any other), says what it lost track of (a
terminal keeps no conversation, so every sent step still open is presented again), then shows
each workflow message in session order and reports it shown. On a step it runs one turn: the
person types the output (an agent step) or the answer (a checkpoint) as one line of JSON, which
it submits as the session; a rejection is shown and the person types again. A protected
decision is answered as a person. Ctrl-C during a turn aborts it (the run pauses; `piwf run
resume` presents the step again); Ctrl-C while it waits detaches. The end of input (Ctrl-D, or
a file or pipe read to its end) aborts the turn the same way and detaches: no line can come
any more. Closing the terminal (a hang-up, SIGHUP) is the end of input too: the person is gone,
so the turn is aborted, not left open to end ``lost`` (which counts toward the reminder rule and,
the third time, fails the step). Each turn's capture keeps the step as shown and every line
typed (``piwf session capture RUN``).

After a reconnect (a server restart) the host attaches again and reports what it shows: the
step of an open turn is on the screen and input waits for it, so the turn goes on.

A detached host exits 0 (1 with ``--exit-when-done``: the run did not end under it). A host
that learns another coordinator took the session over (its epoch was fenced) says so and
exits 1: the session is the other's now, and ``piwf session attach`` takes it back.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any

import click

from piwf import canonical
from piwf.cli import render
from piwf.cli.common import check_session_id, command, json_option, open_client
from piwf.cli.safe_text import printable
from piwf.cli.sessions import session_group
from piwf.client.sessions import SessionCoordinator
from piwf.errors import (
    CanonicalJsonError,
    ConflictError,
    InvalidArgumentError,
    RejectedError,
    SessionAuthorityCommandError,
    SubmissionRejectedCommandError,
)
from piwf.protocol.session_capture_payloads import CapturedEntry, CapturedEvent
from piwf.protocol.session_payloads import TurnInfo, WorkflowMessageInfo


@session_group.command("attach")
@click.argument("session_id", callback=check_session_id)
@click.option(
    "--exit-when-done",
    is_flag=True,
    help="Exit after a run's terminal message once no run holds the session "
    "(exit 0 if that run completed, else 1; 1 too if the host detaches first).",
)
@json_option
@command
def session_attach(session_id: str, exit_when_done: bool, as_json: bool) -> None:
    """Act as SESSION_ID in this terminal: show its workflow messages in order and answer its
    steps (one line of JSON each).

    Start runs for it with `piwf run start WORKFLOW --session SESSION_ID`. With --json every
    message is printed as one JSON document per line. Ctrl-C during a step aborts the turn
    (the run pauses); Ctrl-C while waiting detaches. The end of input (Ctrl-D, or a file
    read to its end) aborts the turn and detaches. If another coordinator takes the session
    over, the host says so and exits 1.

    \b
    Example:
      piwf session attach chat-1
    """
    screen = _Screen()
    with open_client() as client, _hang_up_ends_input():
        try:
            host = client.session(session_id, inspect_branch=screen.inspect_branch)
            host.attach()
            _say(f"attached to session {session_id} as its coordinator; waiting for messages")
            if host.view().runs == 0:  # most often a mistyped id: say so, and keep waiting
                _say(
                    f"no run has used session {session_id} yet (piwf session list shows the"
                    " sessions runs were bound to); waiting for a run started with --session"
                    f" {session_id}"
                )
            _host(host, screen, exit_when_done, as_json)
        except _TerminalClosedError:
            _write_nowhere()  # the terminal is gone: nobody to tell
        except EOFError:
            _say("end of input: detached")
        except SessionAuthorityCommandError:
            raise SessionAuthorityCommandError(
                f"another coordinator took over session {session_id}; run"
                f" `piwf session attach {session_id}` to take it back",
                error_code=SessionAuthorityCommandError.code,
            ) from None
        if exit_when_done:
            raise SystemExit(1)


def _host(host: SessionCoordinator, screen: _Screen, exit_when_done: bool, as_json: bool) -> None:
    """Show messages and take turns until Ctrl-C while waiting (a return) or, with
    ``exit_when_done``, the end of the session's last run (SystemExit). Raises EOFError
    when input ends at a prompt (:class:`_TerminalClosedError`, at any moment, when the
    terminal closes) and SessionAuthorityCommandError once another coordinator took the
    session over."""
    shown = 0
    while True:
        try:
            message = host.next_message()
        except KeyboardInterrupt:
            _say("detached")
            return
        assert message is not None  # no timeout: it waits for one
        shown += 1
        try:
            _show(message, as_json)
        except OSError:  # EIO or EPIPE: nobody reads what the host shows any more
            _ignore_hang_ups()
            raise _TerminalClosedError from None
        entry_id = f"terminal-{host.epoch}-{shown}"
        host.delivered(message.message_id, entry_id)
        if message.kind == "step":
            screen.open_step = (message.message_id, entry_id)
            try:
                _take_turn(host, message, entry_id, as_json)
            finally:
                screen.open_step = None
        elif message.kind == "decision":
            _answer_decision(host, message, as_json)
        elif message.kind == "terminal" and exit_when_done and _session_free(host):
            raise SystemExit(0 if message.content.get("status") == "completed" else 1)


def _session_free(host: SessionCoordinator) -> bool:
    return host.view().active_run_id is None


class _Screen:
    """What the terminal shows, as the branch report after every (re)attach tells it."""

    def __init__(self) -> None:
        #: The step of the turn the person is typing for (message id, entry id), if any.
        self.open_step: tuple[str, str] | None = None

    def inspect_branch(
        self, messages: list[WorkflowMessageInfo]
    ) -> tuple[dict[str, str], list[str], bool]:
        """A terminal keeps no conversation: every sent message is missing from it, except
        the step of an open turn, which is on the screen with input waiting for it (so the
        session is not idle, and the reattach after a server restart keeps the turn open)."""
        if self.open_step is None:
            missing = [message.message_id for message in messages if message.state == "sent"]
            return {}, missing, True
        open_message, entry_id = self.open_step
        missing = [
            message.message_id
            for message in messages
            if message.state == "sent" and message.message_id != open_message
        ]
        return {open_message: entry_id}, missing, False


class _TerminalClosedError(EOFError):
    """The terminal closed (SIGHUP): no line can come any more, and nobody reads the screen."""


def _raise_hung_up(signum: int, frame: FrameType | None) -> None:
    _ignore_hang_ups()
    raise _TerminalClosedError


def _ignore_hang_ups() -> None:
    """Once input has ended, a hang-up has nothing left to stop: ignoring it (a pending one
    too) lets the abort of the open turn finish instead of breaking off mid-request."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _write_nowhere() -> None:
    """Point stdout and stderr at /dev/null once the terminal is gone: what is still buffered
    for it (a line whose write failed) must not fail the exit, which it would as exit status
    120 when the interpreter's last flush fails."""
    nowhere = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in (sys.stdout, sys.stderr):
            with suppress(AttributeError, OSError, ValueError):
                os.dup2(nowhere, stream.fileno())
    finally:
        os.close(nowhere)


@contextmanager
def _hang_up_ends_input() -> Iterator[None]:
    """Treat a hang-up as the end of input while the host runs (the previous handler back
    afterwards): an open turn is aborted, and the host detaches."""
    previous = signal.signal(signal.SIGHUP, _raise_hung_up)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _take_turn(
    host: SessionCoordinator, message: WorkflowMessageInfo, entry_id: str, as_json: bool
) -> None:
    """One turn on a step: the person types until a value is accepted. The turn's capture
    keeps the step as shown and every line typed (rejections as events). With ``as_json``
    each line's fate is a document on stdout too (:func:`_result`)."""
    request = message.content
    agent = request.get("requestKind") == "agent"
    started = host.start_turn(message)
    if started.ownership != "active" or started.turn is None:
        _say("(this step is closed now; waiting for the next message)")
        _result(as_json, message, "closed")
        return
    turn = started.turn
    _capture(host, turn, CapturedEntry(entry_id=entry_id, kind="workflowMessage", content=request))
    prompt = "output JSON> " if agent else "answer JSON> "
    typed = 0
    while True:
        try:
            line = _read_line(prompt)
        except KeyboardInterrupt:
            _abort_turn(host, turn)
            _result(as_json, message, "aborted")
            return
        except EOFError:
            _abort_turn(host, turn)
            _result(as_json, message, "aborted")
            raise
        typed += 1
        line_entry = CapturedEntry(
            entry_id=f"{entry_id}-typed-{typed}", kind="user", content=_as_text(line)
        )
        _capture(host, turn, line_entry)
        value = _parse(line)
        if value is _NOT_JSON:
            _result(as_json, message, "notJson")
            continue
        try:
            if agent:
                host.submit(request["requestId"], value)
            else:
                host.answer(request["requestId"], value)
        except SubmissionRejectedCommandError as rejected:
            _say(f"rejected: {rejected}")
            _result(as_json, message, "rejected", str(rejected))
            _capture(host, turn, CapturedEvent(event_type="rejection", payload=str(rejected)))
            continue
        except SessionAuthorityCommandError:
            raise  # fenced: no line of this host counts any more
        except (RejectedError, InvalidArgumentError) as refused:
            # InvalidArgumentError: the client would not send it (too large); nothing was sent.
            _say(f"refused: {refused}")
            _result(as_json, message, "refused", str(refused))
            continue
        host.end_turn(turn, "completed", response_entry_id=line_entry.entry_id)
        _say("accepted")
        _result(as_json, message, "accepted")
        return


def _abort_turn(host: SessionCoordinator, turn: TurnInfo) -> None:
    """End the turn ``aborted``: the run pauses, and a resume presents the step again."""
    host.end_turn(turn, "aborted")
    _say(f"turn aborted: run {turn.run_id} is paused (piwf run resume {turn.run_id})")


def _capture(host: SessionCoordinator, turn: TurnInfo, item: CapturedEntry | CapturedEvent) -> None:
    """Record one entry or event of the turn; a capture the server refuses (a line longer
    than a captured value may be) or the client will not send (a line larger than a request
    carries) is said, and the turn goes on. A fenced host's capture raises
    SessionAuthorityCommandError."""
    try:
        if isinstance(item, CapturedEntry):
            host.record(turn, entries=[item])
        else:
            host.record(turn, events=[item])
    except SessionAuthorityCommandError:
        raise
    except (RejectedError, ConflictError, InvalidArgumentError) as refused:
        _say(f"(not captured: {refused})")


def _answer_decision(host: SessionCoordinator, message: WorkflowMessageInfo, as_json: bool) -> None:
    while True:
        try:
            line = _read_line("decision JSON> ")
        except KeyboardInterrupt:
            _say("not answered: answer it later with piwf answer")
            _result(as_json, message, "notAnswered")
            return
        except EOFError:
            _say("not answered: answer it later with piwf answer")
            _result(as_json, message, "notAnswered")
            raise
        value = _parse(line)
        if value is _NOT_JSON:
            _result(as_json, message, "notJson")
            continue
        try:
            host.client.answer(message.content["requestId"], value)
        except (RejectedError, InvalidArgumentError) as refused:
            _say(f"refused: {refused}")
            _result(as_json, message, "refused", str(refused))
            continue
        _say("answered")
        _result(as_json, message, "answered")
        return


def _result(
    as_json: bool, message: WorkflowMessageInfo, result: str, reason: str | None = None
) -> None:
    """With ``as_json``, what became of a line typed for ``message`` (a step or a decision) as
    one JSON document on stdout, beside the messages: ``{"result": ..., "messageId": ...,
    "runId": ..., "requestId": ...}`` and the ``reason`` of a refusal. ``result`` is
    ``accepted`` or ``answered`` (the turn or the decision is done), ``rejected`` (the
    value did not fit; type another), ``refused`` (not sent or not taken; type another),
    ``notJson``, ``aborted`` (the turn ended unanswered: the run pauses), ``notAnswered``
    (a decision left open) or ``closed`` (the step was closed before its turn began)."""
    if not as_json:
        return
    document: dict[str, object] = {
        "result": result,
        "messageId": message.message_id,
        "runId": message.run_id,
        "requestId": message.content.get("requestId"),
    }
    if reason is not None:
        document["reason"] = reason
    try:
        render.emit_json(document)
    except OSError:  # the reader is gone; the host goes on ending
        _write_nowhere()


def _read_line(prompt: str) -> str:
    """The next non-empty line typed after ``prompt`` (shown on stderr), bytes that are not
    UTF-8 kept as lone surrogates (``surrogateescape``, on every Python: a text stdin would
    raise on them where its encoding is strict). Raises KeyboardInterrupt on Ctrl-C, and
    EOFError once input has ended (Ctrl-D in a terminal, the end of a file or pipe): no line
    will come any more, so the host detaches."""
    while True:
        try:
            click.echo(prompt, nl=False, err=True)
            data = b"" if sys.stdin is None else sys.stdin.buffer.readline()
        except OSError:  # EIO: the terminal closed under the read
            _ignore_hang_ups()
            raise _TerminalClosedError from None
        if not data:
            _ignore_hang_ups()
            _say("")  # end the prompt's line
            raise EOFError
        line = data.removesuffix(b"\n").decode("utf-8", "surrogateescape")
        if line:
            return line


_NOT_JSON: Any = object()


def _line_bytes(line: str) -> bytes:
    """The bytes of a line as read: ``input()`` keeps bytes that are not UTF-8 as lone
    surrogates (Python's ``surrogateescape``), which this turns back into those bytes."""
    return line.encode("utf-8", "surrogateescape")


def _as_text(line: str) -> str:
    """A typed line as text to capture: bytes that are not UTF-8 become U+FFFD."""
    return _line_bytes(line).decode("utf-8", "replace")


def _parse(line: str) -> Any:
    """The JSON value of a typed line under the rules ``piwf submit`` and ``piwf answer``
    apply to their argument (no duplicate key, no NaN, a safe integer, valid UTF-8), or
    :data:`_NOT_JSON` after saying why."""
    try:
        return canonical.parse(_line_bytes(line))
    except CanonicalJsonError as error:
        _say(f"not JSON for piwf ({error.reason}: {error}); type one line of JSON")
        return _NOT_JSON


def _show(message: WorkflowMessageInfo, as_json: bool) -> None:
    if as_json:
        render.emit_json(message.to_wire())
        return
    content = message.content if isinstance(message.content, dict) else {}
    header = f"── {message.kind}" + (f" ({message.reason})" if message.reason else "")
    _echo(f"{header} · run {message.run_id}")
    if message.kind in ("step", "decision"):
        request = content.get("request")
        text = request.get("prompt") if isinstance(request, dict) else None
        if text is None and isinstance(request, dict):
            text = request.get("summary")
        _echo(str(text) if text is not None else canonical.encode_text(request))
        if isinstance(request, dict) and text == request.get("summary"):
            _echo(canonical.encode_text(request))
    elif message.kind == "notification":
        _echo(str(content.get("message", "")))
    elif message.kind == "terminal":
        outcome = content.get("output") if content.get("status") == "completed" else None
        kept_with_the_run = content.get("outputBytes")
        if outcome is not None:
            _echo(f"run {content.get('status')}: {canonical.encode_text(outcome)}")
        elif isinstance(kept_with_the_run, int):  # too large for a message (over 16 KiB)
            _echo(
                f"run {content.get('status')}: its output ({kept_with_the_run} bytes) is kept "
                f"with the run; piwf run show {message.run_id} --json prints it"
            )
        else:
            _echo(f"run {content.get('status')}")
        if content.get("error"):
            _echo(f"error: {content['error']}")
    else:
        _echo(str(content.get("prompt", "")))


def _echo(text: str) -> None:
    """Print a message's text on stdout. A workflow or an agent wrote it, so its control
    characters show as escapes (line breaks kept): a prompt cannot drive the terminal."""
    click.echo(printable(text))


def _say(text: str) -> None:
    """Tell the person (stderr); a quoted error's control characters show as escapes. A
    terminal that has closed hears nothing (its writes fail): the host goes on ending, with
    its output pointed at /dev/null from then on."""
    try:
        click.echo(printable(text), err=True)
    except OSError:
        _write_nowhere()
