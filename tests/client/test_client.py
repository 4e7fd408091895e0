"""The Python client against a scripted fake server on a real Unix socket."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from piwf._version import __version__
from piwf.client import OUTCOME_ERRORS, Client, launcher, workflow_reference
from piwf.client import client as client_module
from piwf.errors import (
    BackupFailedError,
    ClaimLostCommandError,
    ClientClosedError,
    CommandError,
    ConflictError,
    IncompatibleServerError,
    InternalServerError,
    NotFoundError,
    RejectedError,
    ServerError,
    ServerNotRunningError,
    ServerUnavailableError,
    StateCorruptCommandError,
    StateFullCommandError,
    StateIoCommandError,
    UnavailableError,
)
from piwf.protocol import InvalidMessageError, Request
from piwf.protocol.payloads import RunInfo, ServerStatus
from tests.client.fake_server import (
    SERVER_STATUS,
    WAIT_S,
    FakeConnection,
    FakeServer,
    run_info,
)

pytestmark = pytest.mark.usefixtures("no_server_start")


def answer_all(conn: FakeConnection, request: Request) -> None:
    """A well-behaved server for the operations the tests use."""
    if request.operation == "server.status":
        conn.reply(request, SERVER_STATUS)
    elif request.operation in ("run.start", "run.cancel"):
        conn.reply(request, {"run": run_info(request.run_id or "run-1")})
    elif request.operation == "run.get":
        conn.reply(request, {"run": run_info(request.run_id or "run-1"), "sources": []})
    elif request.operation == "run.list":
        conn.reply(request, {"runs": [run_info("run-2"), run_info("run-1")]})
    elif request.operation == "state.backup":
        conn.reply(request, {"destination": request.payload["destination"], "bytes": 4096})
    else:
        conn.fail(request, "rejected", "unsupported", f"fake server has no {request.operation}")


def client_for(home: Path, **options: Any) -> Client:
    options.setdefault("autostart", False)
    options.setdefault("client_id", "cli-test")
    return Client(home, **options)


def test_hello_of_another_package_version_is_refused(short_home: Path) -> None:
    with FakeServer(short_home, answer_all, package_version="0.0.0-other") as server:
        client = client_for(short_home)
        with pytest.raises(IncompatibleServerError) as caught:
            client.server_status()
        client.close()
    assert "0.0.0-other" in str(caught.value)
    assert __version__ in str(caught.value)
    assert server.requests == []


def test_hello_is_read_and_exposed(short_home: Path) -> None:
    with FakeServer(short_home, answer_all, epoch=7), client_for(short_home) as client:
        assert client.hello is None
        hello = client.connect()
        assert hello.server_epoch == 7
        assert client.hello == hello


def test_reads_carry_no_key_and_every_request_a_fresh_id(short_home: Path) -> None:
    with FakeServer(short_home, answer_all) as server, client_for(short_home) as client:
        first = client.server_status()
        client.server_status()
    assert isinstance(first, ServerStatus)
    assert first.queued_runs == 2
    requests = [request for _, request in server.requests]
    assert [r.operation for r in requests] == ["server.status", "server.status"]
    assert all(r.idempotency_key is None for r in requests)
    assert all(r.client_id == "cli-test" for r in requests)
    assert requests[0].request_id != requests[1].request_id
    assert len(server.connections) == 1


def test_durable_calls_get_one_new_key_each_unless_given(short_home: Path) -> None:
    with FakeServer(short_home, answer_all) as server, client_for(short_home) as client:
        client.cancel_run("run-a")
        client.cancel_run("run-b")
        client.cancel_run("run-c", idempotency_key="my-key")
    keys = [request.idempotency_key for _, request in server.requests]
    assert keys[0] is not None and keys[1] is not None
    assert keys[0] != keys[1]
    assert keys[2] == "my-key"
    assert [request.run_id for _, request in server.requests] == ["run-a", "run-b", "run-c"]


def test_read_given_an_idempotency_key_is_refused(short_home: Path) -> None:
    with client_for(short_home) as client, pytest.raises(ValueError, match="read"):
        client.request("server.status", idempotency_key="k")


def test_responses_are_matched_to_requests_out_of_order(short_home: Path) -> None:
    """A slow run.get is answered after a later server.status on the same connection."""
    held: list[tuple[FakeConnection, Request]] = []

    def handler(conn: FakeConnection, request: Request) -> None:
        if request.operation == "run.get":
            held.append((conn, request))
            return
        # Answer the later request first, then the held one, in one burst.
        conn.reply(request, SERVER_STATUS)
        slow_conn, slow_request = held.pop()
        slow_conn.reply(slow_request, {"run": run_info("run-slow"), "sources": []})

    results: dict[str, Any] = {}
    client = client_for(short_home, request_timeout_s=5)
    with FakeServer(short_home, handler) as server, client:
        client.connect()
        worker = threading.Thread(
            target=lambda: results.setdefault("detail", client.get_run("run-slow"))
        )
        worker.start()
        server.wait_for_requests(1)
        results["status"] = client.server_status()
        worker.join(5)
        assert not worker.is_alive()
    assert results["detail"].run.run_id == "run-slow"
    assert results["status"].state == "running"
    assert {number for number, _ in server.requests} == {1}


@pytest.mark.parametrize(
    ("outcome", "error_type"),
    [
        ("rejected", RejectedError),
        ("conflict", ConflictError),
        ("notFound", NotFoundError),
        ("unavailable", UnavailableError),
        ("claimLost", ClaimLostCommandError),
    ],
)
def test_non_success_outcomes_raise_typed_errors(
    short_home: Path, outcome: Any, error_type: type[CommandError]
) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        conn.fail(request, outcome, "runCommand", "run run-9 cannot do that")

    with FakeServer(short_home, handler), client_for(short_home) as client:
        with pytest.raises(CommandError) as caught:
            client.cancel_run("run-9")
    assert type(caught.value) is error_type
    assert caught.value.code == outcome
    assert caught.value.error_code == "runCommand"
    assert str(caught.value) == "run run-9 cannot do that"


@pytest.mark.parametrize(
    ("outcome", "code", "error_type"),
    [
        ("unavailable", "stateFull", StateFullCommandError),
        ("unavailable", "stateIo", StateIoCommandError),
        ("unavailable", "stateCorrupt", StateCorruptCommandError),
        ("rejected", "backupFailed", BackupFailedError),
        ("rejected", "internalError", InternalServerError),
        # A code whose class does not fit the outcome keeps the outcome's class.
        ("rejected", "stateFull", RejectedError),
        ("unavailable", "backupFailed", UnavailableError),
    ],
)
def test_error_codes_with_a_class_of_their_own_raise_it(
    short_home: Path, outcome: Any, code: str, error_type: type[CommandError]
) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        conn.fail(request, outcome, code, "the reason")

    with FakeServer(short_home, handler), client_for(short_home) as client:
        with pytest.raises(CommandError) as caught:
            client.cancel_run("run-9")
    assert type(caught.value) is error_type
    assert isinstance(caught.value, OUTCOME_ERRORS[outcome]), "the outcome's class still catches"
    assert (caught.value.error_code, str(caught.value)) == (code, "the reason")


def test_durable_request_is_resent_with_the_same_key_after_a_lost_connection(
    short_home: Path,
) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        if conn.number == 1:
            conn.close()  # read the command, then crash before answering
        else:
            conn.reply(request, {"run": run_info("run-7")}, outcome="adopted")

    with FakeServer(short_home, handler) as server, client_for(short_home) as client:
        run = client.start_run("hello", input={"who": "Ada"})
    assert run.run_id == "run-7"
    (first_conn, first), (second_conn, second) = server.requests
    assert (first_conn, second_conn) == (1, 2)
    assert first.operation == second.operation == "run.start"
    assert first.idempotency_key is not None
    assert second.idempotency_key == first.idempotency_key
    assert second.request_id != first.request_id
    assert second.client_id == first.client_id
    assert second.payload == first.payload


def test_close_fails_a_request_in_flight_on_another_thread_instead_of_resending_it(
    short_home: Path,
) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        if request.operation == "server.status":
            conn.reply(request, SERVER_STATUS)
        # run.cancel: never answered, so the call waits until the client is closed

    outcome: list[BaseException] = []

    def cancel() -> None:
        try:
            client.cancel_run("run-1")
        except BaseException as error:
            outcome.append(error)

    with FakeServer(short_home, handler) as server, client_for(short_home) as client:
        caller = threading.Thread(target=cancel, daemon=True)
        caller.start()
        key = server.wait_for_requests(1)[0].idempotency_key
        client.close()
        caller.join(WAIT_S)
        assert not caller.is_alive(), "close() left the call waiting"
        client.server_status()  # a call made after close() connects again
    [error] = outcome
    assert isinstance(error, ClientClosedError), repr(error)
    assert str(error) == (
        "the client was closed during run.cancel (the command may or may not have been "
        f"applied; a retry with idempotency key {key} from client cli-test adopts its outcome)"
    )
    assert [request.operation for _, request in server.requests] == [
        "run.cancel",
        "server.status",
    ], "the cancel was not sent again"


def test_read_is_resent_without_a_key_after_a_lost_connection(short_home: Path) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        if conn.number == 1:
            conn.close()
        else:
            conn.reply(request, SERVER_STATUS)

    with FakeServer(short_home, handler) as server, client_for(short_home) as client:
        client.server_status()
    (_, first), (_, second) = server.requests
    assert first.idempotency_key is None and second.idempotency_key is None
    assert first.request_id != second.request_id


def test_a_response_that_never_comes_is_retried_on_a_new_connection(short_home: Path) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        if conn.number >= 2:
            conn.reply(request, {"run": run_info("run-3")})

    with FakeServer(short_home, handler) as server:
        with client_for(short_home, request_timeout_s=0.2) as client:
            client.cancel_run("run-3")
    (first_conn, first), (second_conn, second) = server.requests
    assert (first_conn, second_conn) == (1, 2)
    assert second.idempotency_key == first.idempotency_key
    assert second.request_id != first.request_id


def test_retrying_gives_up_with_server_unavailable(short_home: Path) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        conn.close()

    with FakeServer(short_home, handler) as server:
        with client_for(short_home, retry_timeout_s=0.3) as client:
            with pytest.raises(ServerUnavailableError, match="may or may not have been applied"):
                client.cancel_run("run-1")
    assert len(server.requests) >= 2
    assert len({request.idempotency_key for _, request in server.requests}) == 1


def test_the_first_attempt_counts_toward_the_attempt_limit(
    short_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first attempt is made before the retry loop exists; the loop counts it all the same.
    monkeypatch.setattr(client_module, "RETRY_MAX_ATTEMPTS", 3)
    monkeypatch.setattr(client_module, "RETRY_BASE_S", 0.001)

    def handler(conn: FakeConnection, request: Request) -> None:
        conn.close()

    with FakeServer(short_home, handler) as server:
        with client_for(short_home, retry_timeout_s=60) as client:
            with pytest.raises(ServerUnavailableError, match="during server.status: "):
                client.server_status()
    assert [number for number, _ in server.requests] == [1, 2, 3]


def test_the_first_attempt_counts_toward_the_retry_timeout(short_home: Path) -> None:
    # A first attempt that outlasts retry_timeout_s on its own is not retried.
    def handler(conn: FakeConnection, request: Request) -> None:
        pass  # never answers

    with FakeServer(short_home, handler) as server:
        with client_for(short_home, request_timeout_s=0.3, retry_timeout_s=0.2) as client:
            with pytest.raises(ServerUnavailableError, match="may or may not have been applied"):
                client.cancel_run("run-1")
    assert len(server.requests) == 1


def test_no_server_and_no_autostart_raises_at_once_saying_how_to_start_one(
    short_home: Path,
) -> None:
    with client_for(short_home) as client, pytest.raises(ServerNotRunningError) as error:
        client.server_status()
    assert not short_home.exists()
    assert str(error.value) == (
        f"no piwf server is running for {short_home}; start one with "
        f"`PIWF_HOME={short_home} piwf server start`, or construct the Client with "
        "autostart=True to start it on first use"
    )


def test_autostart_starts_a_server_once_and_connects(
    short_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    servers: list[FakeServer] = []

    def fake_ensure(home: Path, **options: object) -> launcher.ServerStarted:
        assert home == short_home
        servers.append(FakeServer(home, answer_all, epoch=3))
        return launcher.ServerStarted(pid=1, epoch=3)

    monkeypatch.setattr(launcher, "ensure_server", fake_ensure)
    try:
        with Client(short_home) as client:
            client.server_status()
            client.server_status()
    finally:
        for server in servers:
            server.stop()
    assert len(servers) == 1
    assert len(servers[0].requests) == 2


def test_socket_path_too_long_is_a_clear_error(tmp_path: Path) -> None:
    home = tmp_path / ("x" * 120)
    with (
        Client(home) as client,
        pytest.raises(ServerUnavailableError, match="shorter directory"),
    ):
        client.server_status()


def test_invalid_receipt_is_a_protocol_error(short_home: Path) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        conn.reply(request, {"state": "running"})

    with FakeServer(short_home, handler), client_for(short_home) as client:
        with pytest.raises(InvalidMessageError, match="ServerStatus"):
            client.server_status()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("flows/hello.py", "{cwd}/flows/hello.py"),
        ("hello.py", "{cwd}/hello.py"),
        ("./flows/../hello.py", "{cwd}/hello.py"),
        ("existing", "{cwd}/existing"),
        ("/abs/flow.py", "/abs/flow.py"),
        ("hello", "hello"),
        ("release-v2", "release-v2"),
    ],
)
def test_workflow_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").write_text("workflow = None\n")
    assert workflow_reference(given) == expected.format(cwd=tmp_path)
    assert workflow_reference(Path("plain")) == str(tmp_path / "plain")


def test_start_run_sends_absolute_workflow_and_project_paths(
    short_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "proj").mkdir()
    with FakeServer(short_home, answer_all) as server, client_for(short_home) as client:
        client.start_run("flows/hello.py", input={"who": ["Ada", 1]}, title="t")
        client.start_run("hello", project=Path("proj"))
    payloads = [request.payload for _, request in server.requests]
    assert payloads[0] == {
        "workflow": str(tmp_path / "flows" / "hello.py"),
        "projectPath": str(tmp_path),
        "input": {"who": ["Ada", 1]},
        "title": "t",
    }
    assert payloads[1] == {"workflow": "hello", "projectPath": str(tmp_path / "proj")}


def test_backup_destination_is_sent_absolute(
    short_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with FakeServer(short_home, answer_all) as server, client_for(short_home) as client:
        receipt = client.backup(Path("b.sqlite"))
    assert receipt.destination == str(tmp_path / "b.sqlite")
    (_, request), *_ = server.requests
    assert request.idempotency_key is not None


def test_list_runs_and_get_run_return_typed_receipts(short_home: Path) -> None:
    with FakeServer(short_home, answer_all) as server, client_for(short_home) as client:
        page = client.list_runs(limit=5)
        detail = client.get_run("run-1")
    assert [run.run_id for run in page.runs] == ["run-2", "run-1"]
    assert isinstance(detail.run, RunInfo)
    assert server.requests[0][1].payload == {"limit": 5}
    assert server.requests[1][1].run_id == "run-1"


def test_wait_run_repeats_run_wait_until_terminal(short_home: Path) -> None:
    answers = iter([True, False])

    def handler(conn: FakeConnection, request: Request) -> None:
        timed_out = next(answers)
        status = "queued" if timed_out else "completed"
        run = run_info("run-1", status=status, display_status=status)
        conn.reply(request, {"run": run, "timedOut": timed_out})

    with FakeServer(short_home, handler) as server, client_for(short_home) as client:
        receipt = client.wait_run("run-1")
    assert receipt.timed_out is False
    assert receipt.run.status == "completed"
    assert [request.payload for _, request in server.requests] == [{"timeoutMs": 30000}] * 2


def test_wait_run_with_zero_timeout_asks_once(short_home: Path) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        conn.reply(request, {"run": run_info("run-1"), "timedOut": True})

    with FakeServer(short_home, handler) as server, client_for(short_home) as client:
        receipt = client.wait_run("run-1", timeout_s=0)
    assert receipt.timed_out is True
    assert [request.payload for _, request in server.requests] == [{"timeoutMs": 0}]


def test_wait_run_without_retrying_is_not_sent_again_after_a_lost_connection(
    short_home: Path,
) -> None:
    # The held wait does not count toward retry_timeout_s, but 0 still means no retry.
    def handler(conn: FakeConnection, request: Request) -> None:
        conn.close()

    with FakeServer(short_home, handler) as server:
        with client_for(short_home, retry_timeout_s=0) as client:
            with pytest.raises(ServerUnavailableError, match="during run.wait"):
                client.wait_run("run-1", timeout_s=5)
    assert len(server.requests) == 1


def test_stop_server_returns_once_the_server_closes(short_home: Path) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        assert request.operation == "server.stop"
        conn.reply(request, {"stopping": True})
        conn.close()

    with FakeServer(short_home, handler) as server:
        client = Client(short_home)  # autostart on: stop must still never start a server
        assert client.stop_server().stopping is True
        assert client.hello is None
    (_, request), *_ = server.requests
    assert request.idempotency_key is not None


def test_stop_server_that_keeps_the_connection_is_an_error(short_home: Path) -> None:
    def handler(conn: FakeConnection, request: Request) -> None:
        conn.reply(request, {"stopping": True})

    with FakeServer(short_home, handler), client_for(short_home) as client:
        with pytest.raises(ServerError, match="did not close"):
            client.stop_server(wait_s=0.1)


def test_stop_server_without_a_server_raises_not_running(short_home: Path) -> None:
    with pytest.raises(ServerNotRunningError):
        Client(short_home).stop_server()
