"""A client call refuses arguments it cannot take with one typed error, before anything is sent.

No server runs here (``no_server_start``, no socket): every refusal must come before the client
connects, as :class:`~piwf.errors.InvalidArgumentError` (a ``ValueError``) naming the argument
and what it allows, never the value and never pydantic's dump.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from piwf.client import CapturedEvent, Client
from piwf.errors import (
    AgentCommandError,
    CanonicalJsonError,
    InvalidArgumentError,
    RequestTooLargeError,
    SessionError,
)


def test_home_may_be_a_relative_str_or_a_path_like(
    short_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(short_home.parent)
    assert Client(home="relhome").home == short_home.parent / "relhome"
    assert Client(home=short_home).home == short_home
    with pytest.raises(InvalidArgumentError, match="home: a path"):
        Client(home=5)  # type: ignore[arg-type]


CALLS: dict[str, tuple[Callable[[Client], object], str]] = {
    "workflow int": (lambda c: c.start_run(123), "workflow"),  # type: ignore[arg-type]
    "workflow None": (lambda c: c.start_run(None), "workflow"),  # type: ignore[arg-type]
    "workflow empty": (lambda c: c.start_run(""), "workflow"),
    # A name with a NUL character went to the server, which answered "ValueError: embedded
    # null byte": no name or path holds one.
    "workflow name NUL": (lambda c: c.start_run("hello\x00"), "workflow: a workflow name or"),
    "show workflow name NUL": (lambda c: c.show_workflow("a\x00b"), "workflow: a workflow name"),
    # A malformed run id was sent and its "no run" answer echoed the control characters back.
    "requests run id": (
        lambda c: c.list_requests("run-\n\x1b[31m"),
        "run_id: 1 to 256 printable ASCII characters, no spaces",
    ),
    # The cutoff is refused under the argument's own name, not the wire field's (before).
    "prune preview cutoff negative": (
        lambda c: c.prune_preview(-5),
        "before_ms: a time in epoch milliseconds",
    ),
    "prune cutoff str": (
        lambda c: c.prune("0", "/tmp/before-prune.sqlite"),  # type: ignore[arg-type]
        "before_ms: a time in epoch milliseconds",
    ),
    "title": (lambda c: c.start_run("noop", title=5), "title"),  # type: ignore[arg-type]
    "run id int": (lambda c: c.get_run(5), "run_id"),  # type: ignore[arg-type]
    "control action": (
        lambda c: c.run_control_receipt("stop", "run-1"),  # type: ignore[arg-type]
        "action: one of cancel, pause, resume, restart",
    ),
    "control action list": (
        lambda c: c.run_control_receipt(["pause"], "run-1"),  # type: ignore[arg-type]
        "action: one of",
    ),
    "control run id": (lambda c: c.run_control_receipt("pause", 5), "run_id"),  # type: ignore[arg-type]
    "run id empty": (lambda c: c.get_run(""), "run_id: 1 to 256 printable ASCII"),
    "limit": (lambda c: c.list_runs(limit=0), "limit: Input should be greater than or equal"),
    "status": (lambda c: c.list_runs(status="bogus"), "status: Input should be 'queued'"),
    "watch status": (lambda c: next(c.watch_runs(status="bogus")), "status"),
    "watch idle": (lambda c: next(c.watch_runs(idle_timeout_s=-1)), "idle_timeout_s"),
    "answer as_human str": (
        lambda c: c.answer("request-1", True, as_human="no"),  # type: ignore[arg-type]
        "as_human: True or False",
    ),
    "client id": (lambda c: Client(c.home, client_id="bad id").list_runs(), "client_id"),
    "autostart str": (
        lambda c: Client(c.home, autostart="no").list_runs(),  # type: ignore[arg-type]
        "autostart: True or False",
    ),
    "autostart None": (
        lambda c: Client(c.home, autostart=None).list_runs(),  # type: ignore[arg-type]
        "autostart: True or False",
    ),
    "project": (lambda c: c.start_run("noop", project=7), "project"),  # type: ignore[arg-type]
    "project a file": (
        lambda c: c.start_run("noop", project=__file__),
        f"project: {__file__} is not a directory; give the project's directory",
    ),
    "project missing": (
        lambda c: c.start_run("noop", project="/nonexistent-piwf-project"),
        "project: no directory /nonexistent-piwf-project; give the project's directory",
    ),
    "project a device": (
        lambda c: c.list_workflows(project="/dev/null"),
        "project: /dev/null is not a directory",
    ),
    "resource project a file": (
        lambda c: c.apply_resource("m", "k", {}, project=Path(__file__)),
        "project: ",
    ),
    "workflow show project a file": (
        lambda c: c.show_workflow("noop", project=__file__),
        "project",
    ),
    "settings patch None": (
        lambda c: c.change_settings("run-1", None),  # type: ignore[arg-type]
        "patch: Input should be a valid list",
    ),
    "settings patch str": (
        lambda c: c.change_settings("run-1", "[]"),  # type: ignore[arg-type]
        "patch: Input should be a valid list",
    ),
    "settings patch empty": (
        lambda c: c.change_settings("run-1", []),
        "patch: a list of one item or more",
    ),
    "wait timeout str": (
        lambda c: c.wait_run("run-1", timeout_s="5"),  # type: ignore[arg-type]
        "timeout_s: a number of seconds, or None",
    ),
    "wait timeout nan": (
        lambda c: c.wait_run("run-1", timeout_s=math.nan),
        "timeout_s: a number of seconds, or None",
    ),
    "resource manager name": (
        lambda c: c.apply_resource("Greeting", "k", {}),
        "manager: a resource manager's name: a lowercase letter, then lowercase letters",
    ),
    # An id the server made is plain ASCII: a control character (an escape sequence, a line
    # break) is refused here, never echoed back in a "not found".
    "channel send id": (
        lambda c: c.recover_channel_send("effect-\n\x1b[31m", "confirm"),
        "effect_id: 1 to 256 printable ASCII characters, no spaces",
    ),
    "effect id": (
        lambda c: c.resolve_effect("effect 1", "applied"),
        "effect_id: 1 to 256 printable ASCII characters, no spaces",
    ),
    "request id to answer": (
        lambda c: c.answer("request-\t1", {}),
        "request_id: 1 to 256 printable ASCII characters, no spaces",
    ),
    "request id to submit": (
        lambda c: c.submit("request-é", {}),
        "request_id: 1 to 256 printable ASCII characters, no spaces",
    ),
    "resource key": (
        lambda c: c.get_resource("greeting", "a key"),
        "key: 1 to 256 printable ASCII characters, no spaces",
    ),
    "apply expected version": (
        lambda c: c.apply_resource("m", "k", {}, expected_version="1"),  # type: ignore[arg-type]
        "expected_version: a resource version",
    ),
    "delete expected version": (
        lambda c: c.delete_resource("m", "k", expected_version=-1),
        "expected_version: a resource version",
    ),
    "delete expected version beyond 2**53": (
        lambda c: c.delete_resource("m", "k", expected_version=2**53),
        "expected_version: a resource version (a whole number from 0 to 9007199254740991)",
    ),
    "apply expected version beyond 2**53": (
        lambda c: c.apply_resource("m", "k", {}, expected_version=10**30),
        "expected_version: a resource version",
    ),
    "stop wait str": (
        lambda c: c.stop_server(wait_s="5"),  # type: ignore[arg-type]
        "wait_s: a number of seconds at least 0",
    ),
    "stop wait nan": (lambda c: c.stop_server(wait_s=math.nan), "wait_s: a number of seconds"),
    "prune backup None": (
        lambda c: c.prune(0, None),  # type: ignore[arg-type]
        "backup: the absolute path of a new file",
    ),
    "prune backup relative": (
        lambda c: c.prune(0, Path("before-prune.sqlite")),
        "backup: the absolute path of a new file",
    ),
    "steps page limit": (
        lambda c: c.run_steps("run-1", page_limit=0),
        "page_limit: a number of steps from 1 to 200",
    ),
    "steps after": (
        lambda c: c.run_steps("run-1", after="3"),  # type: ignore[arg-type]
        "after: a step index",
    ),
    "steps after beyond any index": (
        lambda c: c.run_steps("run-1", after=10**30),
        "after: a step index (a whole number up to 999999999999), or None",
    ),
    "project name too long": (
        lambda c: c.start_run("noop", project="n" * 300),
        "project: the path cannot be used (File name too long)",
    ),
    "project NUL": (lambda c: c.start_run("noop", project="a\x00b"), "project: a path is"),
    "backup NUL": (lambda c: c.backup("/tmp/a\x00b"), "destination: a path is a non-empty"),
    "backup too long": (lambda c: c.backup("/" + "d/" * 3000), "destination: String should"),
    "read_content not a ref": (
        lambda c: c.read_content({"sha256": "0"}),  # type: ignore[arg-type]
        "ref: a ContentRef",
    ),
    "request operation list": (
        lambda c: c.request([]),  # type: ignore[arg-type]
        "operation: an operation name",
    ),
    "request payload str": (
        lambda c: c.request("server.status", "{}"),  # type: ignore[arg-type]
        "payload: a mapping",
    ),
    "request key on a read": (
        lambda c: c.request("run.get", {}, run_id="run-1", idempotency_key="k"),
        "idempotency_key: run.get is a read and takes none",
    ),
    "session poll": (lambda c: c.session("s1", poll_s=0), "poll_s: a number of seconds above 0"),
    "session inspect_branch": (
        lambda c: c.session("s1", inspect_branch=5),  # type: ignore[arg-type]
        "inspect_branch: a function",
    ),
    "session next_message timeout": (
        lambda c: c.session("s1").next_message(timeout_s="5"),  # type: ignore[arg-type]
        "timeout_s: a number of seconds, or None",
    ),
    **{
        f"session coordinator {name}": (call, expected)
        for name, (call, expected) in {
            "start_turn None": (
                lambda c: c.session("s1").start_turn(None),  # type: ignore[arg-type]
                "message: a WorkflowMessageInfo",
            ),
            "end_turn str": (
                lambda c: c.session("s1").end_turn("turn-1", "completed"),  # type: ignore[arg-type]
                "turn: a TurnInfo",
            ),
            "record None": (
                lambda c: c.session("s1").record(None),  # type: ignore[arg-type]
                "turn: a TurnInfo or its turn id",
            ),
            "record entries None": (
                lambda c: c.session("s1").record("t", entries=None),  # type: ignore[arg-type]
                "entries: a list",
            ),
            "record entries str": (
                lambda c: c.session("s1").record("t", entries="x"),  # type: ignore[arg-type]
                "entries: a list",
            ),
            "record entry int": (
                lambda c: c.session("s1").record("t", entries=[5]),  # type: ignore[list-item]
                "a CapturedEntry or a mapping",
            ),
            "record entry fields": (
                lambda c: c.session("s1").record("t", entries=[{"kind": "user"}]),
                "entry_id",
            ),
            "report_branch found str": (
                lambda c: c.session("s1").report_branch(found="abc"),  # type: ignore[arg-type]
                "found: a mapping of message ids to entry ids",
            ),
            "report_branch found 0": (
                lambda c: c.session("s1").report_branch(found=0),  # type: ignore[arg-type]
                "found: a mapping",
            ),
            "report_branch missing 0": (
                lambda c: c.session("s1").report_branch(missing=0),  # type: ignore[arg-type]
                "missing: a list of message ids",
            ),
            "delivered list": (
                lambda c: c.session("s1").delivered([], "e"),  # type: ignore[arg-type]
                "message_id and entry_id: each a str",
            ),
        }.items()
    },
    "follow interval": (
        lambda c: next(c.follow_run_logs("run-1", interval_s="1")),  # type: ignore[arg-type]
        "interval_s: a number of seconds at least 0",
    ),
    **{
        f"run id None of {name}": (call, "run_id: 1 to 256 printable ASCII")
        for name, call in {
            "get_run": lambda c: c.get_run(None),  # type: ignore[arg-type]
            "run_view": lambda c: c.run_view(None),  # type: ignore[arg-type]
            "run_steps": lambda c: c.run_steps(None),  # type: ignore[arg-type]
            "watch_run": lambda c: next(c.watch_run(None)),  # type: ignore[arg-type]
            "wait_run": lambda c: c.wait_run(None),  # type: ignore[arg-type]
            "cancel_run": lambda c: c.cancel_run(None),  # type: ignore[arg-type]
            "pause_run": lambda c: c.pause_run(None),  # type: ignore[arg-type]
            "resume_run": lambda c: c.resume_run(None),  # type: ignore[arg-type]
            "restart_run": lambda c: c.restart_run(None),  # type: ignore[arg-type]
            "fork_run": lambda c: c.fork_run(None, from_node="b"),  # type: ignore[arg-type]
            "run_settings": lambda c: c.run_settings(None),  # type: ignore[arg-type]
            "change_settings": lambda c: c.change_settings(None, [{"op": "remove", "path": "/x"}]),  # type: ignore[arg-type]
            "read_run_logs": lambda c: c.read_run_logs(None),  # type: ignore[arg-type]
            "run_logs_page": lambda c: c.run_logs_page(None),  # type: ignore[arg-type]
            "follow_run_logs": lambda c: next(c.follow_run_logs(None)),  # type: ignore[arg-type]
        }.items()
    },
    **{
        f"content limit of {name}": (call, "content_limit: a number of bytes, 0 or more")
        for name, call in {
            "get_run": lambda c: c.get_run("run-1", content_limit="x"),
            "run_view": lambda c: c.run_view("run-1", content_limit=-1),
            "run_steps": lambda c: c.run_steps("run-1", content_limit=1.5),
            "watch_run": lambda c: next(c.watch_run("run-1", content_limit="x")),
            "wait_run": lambda c: c.wait_run("run-1", content_limit=True),
            "list_requests": lambda c: c.list_requests(content_limit="x"),
        }.items()
    },
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_refused_argument_is_one_typed_error_naming_it(
    name: str, short_home: Path, no_server_start: None
) -> None:
    call, expected = CALLS[name]
    with pytest.raises(InvalidArgumentError) as info:
        call(Client(short_home))
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert message.startswith("invalid argument: ") and expected in message, message
    assert "pydantic" not in message and "input_value" not in message and "bogus" not in message
    assert "after validation" not in message and "expected_revision" not in message


@pytest.mark.parametrize("command", [5, object(), 1.5])
def test_an_agent_command_that_is_no_list_is_an_agent_command_error(
    command: object, short_home: Path, no_server_start: None
) -> None:
    with pytest.raises(AgentCommandError, match="a list of strings"):
        Client(short_home).start_run("noop", agent_command=command)  # type: ignore[arg-type]


def test_a_workflow_name_longer_than_a_file_name_goes_to_the_server_as_a_name(
    short_home: Path, no_server_start: None
) -> None:
    with pytest.raises(AssertionError, match="must not start a server"):  # so it was sent
        Client(short_home).start_run("n" * 300)


def test_a_settings_patch_may_be_a_tuple_of_operations(
    short_home: Path, no_server_start: None
) -> None:
    operation = {"op": "add", "path": "/x", "value": 1}
    with pytest.raises(AssertionError, match="must not start a server"):  # so it was sent
        Client(short_home).change_settings("run-1", (operation,))


#: Values that are no canonical JSON, given where the client sends JSON as it is. The patch and
#: the capture went through pydantic's JSON conversion instead: a set was sent as a list, a
#: date as its text, and a deep nesting raised pydantic's own ValueError.
NOT_JSON: dict[str, tuple[Callable[[Client], object], str]] = {
    "settings patch set": (
        lambda c: c.change_settings("run-1", [{"op": "add", "path": "/x", "value": {1, 2}}]),
        "patch: set is not a JSON value",
    ),
    "settings patch date": (
        lambda c: c.change_settings("run-1", [{"op": "add", "path": "/x", "value": date.today()}]),
        "patch: date is not a JSON value",
    ),
    "settings patch deep": (
        lambda c: c.change_settings("run-1", [{"op": "add", "path": "/x", "value": _nested(200)}]),
        "patch: value nests deeper than 128 levels",
    ),
    "capture entry bytes": (
        lambda c: c.session("s1").record(
            "t-1", entries=[{"entry_id": "e-1", "kind": "assistant", "content": b"x"}]
        ),
        "entries.content: bytes is not a JSON value",
    ),
    "capture event nan": (
        lambda c: c.session("s1").record(
            "t-1", events=[CapturedEvent(event_type="toolCall", payload=math.nan)]
        ),
        "events.payload: NaN and Infinity are not JSON numbers",
    ),
}


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("name", sorted(NOT_JSON))
def test_a_value_that_is_no_canonical_json_is_refused_before_sending(
    name: str, short_home: Path, no_server_start: None
) -> None:
    call, expected = NOT_JSON[name]
    with pytest.raises(CanonicalJsonError) as info:
        call(Client(short_home))
    assert str(info.value) == expected


def test_a_malformed_session_id_is_a_session_error_as_start_run_says(
    short_home: Path, no_server_start: None
) -> None:
    client = Client(short_home)
    for call in (lambda: client.session("bad id"), lambda: client.start_run("n", session="a b")):
        with pytest.raises(SessionError, match="a session id is 1 to 128 characters"):
            call()


@pytest.mark.parametrize(
    "option", ["connect_timeout_s", "request_timeout_s", "start_timeout_s", "retry_timeout_s"]
)
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True, "5", None])
def test_a_timeout_that_is_no_positive_number_is_refused_at_construction(
    option: str, value: Any, short_home: Path
) -> None:
    if option == "retry_timeout_s" and value == 0:
        assert Client(short_home, retry_timeout_s=0).retry_timeout_s == 0  # no retrying
        return
    with pytest.raises(InvalidArgumentError, match=f"{option}: a number of seconds"):
        Client(short_home, **{option: value})


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        (8765, "a ws://127.0.0.1:PORT URL"),
        ("http://127.0.0.1:8765", "is not a ws:// URL"),
        ("ws://localhost", "is not a ws://HOST:PORT URL"),
        ("ws://10.0.0.1:8765", "is not a loopback address"),
    ],
)
def test_a_remote_that_is_no_loopback_relay_url_is_refused_at_construction(
    remote: Any, expected: str, short_home: Path
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Client(short_home, remote=remote)
    message = str(info.value)
    assert message.startswith("invalid argument: remote: ") and expected in message, message


def test_an_input_too_large_for_one_request_is_refused_before_sending(
    short_home: Path, no_server_start: None
) -> None:
    with pytest.raises(RequestTooLargeError) as info:
        Client(short_home).start_run("noop", input={"x": "a" * 2_000_000})
    message = str(info.value)
    assert "the run's input is 2,000,008 bytes of JSON" in message
    assert "1,048,576 bytes (1 MiB)" in message and "a path to a file" in message
    assert isinstance(info.value, InvalidArgumentError)
    assert not short_home.exists()  # nothing connected, nothing started


def test_offline_verify_and_restore_take_str_paths_and_refuse_anything_else(
    short_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from piwf.client.offline import verify_file
    from piwf.client.restore import restore_backup
    from piwf.state import StateDatabase

    backup = short_home.parent / "backup.sqlite"
    StateDatabase(backup).close()
    monkeypatch.chdir(short_home.parent)
    assert verify_file("backup.sqlite") == []
    refusals = {
        "path: a path": lambda: verify_file(5),  # type: ignore[arg-type]
        "backup: a path": lambda: restore_backup(None, short_home),  # type: ignore[arg-type]
        "home: a path": lambda: restore_backup(backup, 5),  # type: ignore[arg-type]
    }
    for expected, call in refusals.items():
        with pytest.raises(InvalidArgumentError, match=expected):
            call()
    assert not short_home.exists(), "a refused restore touched nothing"
    assert restore_backup(str(backup), str(short_home)).byte_length == backup.stat().st_size


def test_a_revision_for_an_operation_that_compares_none_is_refused_before_sending(
    short_home: Path, no_server_start: None
) -> None:
    """The server would refuse it too; the generic ``request`` says so first, naming the
    operations that take one (``run.restart`` would otherwise seem guarded)."""
    with pytest.raises(InvalidArgumentError) as info:
        Client(short_home).request("run.restart", run_id="run-1", expected_revision=3)
    assert str(info.value) == (
        "invalid argument: expected_revision: run.restart compares none; leave it out (only"
        " resource.apply, resource.delete, run.cancel, run.pause, run.resume take one)"
    )
