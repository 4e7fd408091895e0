"""The ``piwf`` command line with click's runner: help, docs, exit codes, JSON output; and, in
a fresh interpreter, what a command that talks to a server imports.

Commands that need a server talk to the scripted fake server of tests/client; none of these
tests starts a real server (the ``no_server_start`` guard fails any attempt).
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from piwf._version import __version__
from piwf.cli import cli, render
from piwf.cli.state import parse_timestamp
from piwf.client import launcher
from piwf.protocol import Request
from piwf.protocol.payloads import RunDetail, RunListPayload, RunPage
from piwf.server.children import start_methods
from tests.client.fake_server import SERVER_STATUS, FakeConnection, FakeServer, run_info
from tests.unit.test_lazy_cli import run_probe

pytestmark = pytest.mark.usefixtures("no_server_start")

DOCS = Path(__file__).resolve().parents[2] / "docs" / "CLI.md"


def walk(command: click.Command, path: str = "piwf") -> Iterator[tuple[str, click.Command]]:
    """Every command and group below ``command``, with its full command path."""
    if isinstance(command, click.Group):
        context = click.Context(command)  # the top-level group loads each command on demand
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None, f"{path} lists {name} but has no such command"
            yield f"{path} {name}", sub
            yield from walk(sub, f"{path} {name}")


COMMANDS = dict(walk(cli))
LEAVES = sorted(path for path, command in COMMANDS.items() if not isinstance(command, click.Group))


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def one_json_document(text: str) -> Any:
    """Parse ``text`` as exactly one JSON document (json.loads refuses trailing data)."""
    assert text.count("\n") == 1 and text.endswith("\n"), repr(text)
    return json.loads(text)


def test_the_surface_of_design_section_11() -> None:
    assert LEAVES == [
        "piwf answer",
        "piwf channel recover",
        "piwf channel reload",
        "piwf channel status",
        "piwf effect resolve",
        "piwf mcp",
        "piwf relay",
        "piwf requests",
        "piwf resource apply",
        "piwf resource delete",
        "piwf resource get",
        "piwf resource list",
        "piwf resource reconcile",
        "piwf run cancel",
        "piwf run explain",
        "piwf run fork",
        "piwf run list",
        "piwf run logs",
        "piwf run pause",
        "piwf run restart",
        "piwf run resume",
        "piwf run settings",
        "piwf run show",
        "piwf run start",
        "piwf run steps",
        "piwf run wait",
        "piwf server run",
        "piwf server start",
        "piwf server status",
        "piwf server stop",
        "piwf session attach",
        "piwf session capture",
        "piwf session list",
        "piwf session show",
        "piwf state backup",
        "piwf state prune",
        "piwf state restore",
        "piwf state status",
        "piwf state verify",
        "piwf submit",
        "piwf update",
        "piwf view",
        "piwf workflows list",
        "piwf workflows show",
    ]


@pytest.mark.parametrize("path", ["piwf", *COMMANDS])
def test_every_command_has_help_with_an_example(path: str) -> None:
    result = invoke(*path.split()[1:], "--help")
    assert result.exit_code == 0, result.output
    assert "Example:" in result.stdout
    example = result.stdout.split("Example:", 1)[1].strip().splitlines()[0]
    assert example.startswith(path), f"the example of {path!r} is {example!r}"


@pytest.mark.parametrize("path", LEAVES)
def test_every_command_accepts_json(path: str) -> None:
    options = {opt for param in COMMANDS[path].params for opt in getattr(param, "opts", [])}
    assert "--json" in options


def test_docs_describe_exactly_the_commands_that_exist() -> None:
    """docs/CLI.md has one heading ``## `piwf group` `` or ``### `piwf group command` `` each."""
    headings = re.findall(r"^#{2,3} `(piwf [^`]*)`$", DOCS.read_text(), flags=re.MULTILINE)
    assert len(headings) == len(set(headings)), "a command is documented twice"
    assert set(COMMANDS) - set(headings) == set(), "commands missing from docs/CLI.md"
    extra = set(headings) - set(COMMANDS) - {"piwf --version"}
    assert extra == set(), "docs/CLI.md documents commands that do not exist"


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout == f"piwf {__version__}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "start", "flow.py", "--input", "{bad"], "not valid JSON"),
        (["run", "start", "flow.py", "--input", "[1, NaN]"], "not valid JSON"),
        (["run", "start"], "Missing argument 'WORKFLOW'"),
        (["run", "show"], "Missing argument 'RUN_ID'"),
        (["run", "show", "has space"], "run id"),
        (["run", "start", "flow.py", "--timeout", "5"], "--timeout only applies with --wait"),
        (["run", "list", "--limit", "0"], "--limit"),
        (["run", "wait", "run-1", "--timeout", "-1"], "--timeout"),
        (["state", "backup"], "Missing argument 'DEST'"),
        # An existing directory: what to give instead, for DEST and for --backup alike.
        (["state", "backup", str(Path(__file__).parent)], "is a directory; give the path of"),
        (
            ["state", "prune", "--before", "1", "--apply", "--backup", str(Path(__file__).parent)],
            "--backup " + str(Path(__file__).parent) + " is a directory; give the path of",
        ),
        (["resource", "apply", "greeting", "ada"], "exactly one of --spec or --spec-file"),
        (["resource", "apply", "greeting", "ada", "--spec", "{bad"], "not valid JSON"),
        (["resource", "apply", "greeting", "ada", "--spec", "[1]"], "must be a JSON object"),
        (["resource", "get", "greeting"], "Missing argument 'KEY'"),
        (["state", "prune", "--dry-run"], "Missing option '--before'"),
        (["state", "prune", "--before", "2024-05-01"], "exactly one of --dry-run and --apply"),
        (["state", "prune", "--before", "1", "--dry-run", "--apply"], "exactly one of"),
        (["state", "prune", "--before", "1", "--apply"], "--apply needs --backup DEST"),
        (["state", "prune", "--before", "1", "--apply", "--backup", "b.sqlite"], "absolute"),
        (["state", "prune", "--before", "1", "--dry-run", "--backup", "/b"], "only applies"),
        (["state", "prune", "--before", "yesterday", "--dry-run"], "neither ISO-8601 nor epoch"),
        # What to type instead: the forms it takes.
        (["state", "prune", "--before", "24/05/01", "--dry-run"], "give a date (2024-05-01)"),
        (["state", "prune", "--before", "1969-12-31", "--dry-run"], "between 1970"),
        # Digits only are epoch milliseconds, however many: too many is out of range.
        (["state", "prune", "--before", "9" * 20, "--dry-run"], "0 to 253402300799999"),
        (["state", "prune", "--before", "2024-13-01", "--dry-run"], "neither ISO-8601"),
        # A cutoff in the future would take every tree that ended: refused, with what to give.
        (["state", "prune", "--before", "2999-01-01", "--dry-run"], "lies in the future"),
        (
            ["state", "prune", "--before", "99999999999999", "--backup", "/b", "--apply"],
            "give the current time",
        ),
        (["server", "start", "--max-workers", "0"], "--max-workers"),
        (["nope"], "No such command"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert result.stdout == ""

    as_json = invoke(*args, "--json")
    assert as_json.exit_code == 2, as_json.output
    document = one_json_document(as_json.stdout)
    assert document["error"]["code"] == "usage"
    assert message in document["error"]["message"]


def test_an_argument_the_payload_model_refuses_is_a_usage_error_that_hides_the_value(
    fake: FakeServer,
) -> None:
    title = "secret-" + "x" * 600
    result = invoke("run", "start", "hello", "--title", title, "--json")
    assert result.exit_code == 2, result.output
    message = one_json_document(result.stdout)["error"]["message"]
    assert "title" in message
    assert "secret" not in message
    assert fake.requests == []


def test_an_empty_title_is_a_usage_error_and_nothing_is_sent(fake: FakeServer) -> None:
    result = invoke("run", "start", "hello", "--title", "", "--json")
    assert result.exit_code == 2, result.output
    message = one_json_document(result.stdout)["error"]["message"]
    assert "'--title': String should have at least 1 character" in message, message
    assert fake.requests == []


def test_an_input_too_large_to_send_is_a_usage_error_naming_its_size_and_what_to_do(
    fake: FakeServer, tmp_path: Path
) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"text": "é" * 900_000}, ensure_ascii=False), encoding="utf-8")
    result = invoke("run", "start", "plain-summary", "--input-file", str(big), "--json")
    assert result.exit_code == 2, result.output
    message = one_json_document(result.stdout)["error"]["message"]
    assert "the run's input is 1,800,011 bytes of JSON" in message, message
    assert message.startswith("invalid value for '--input-file': "), "the option it came from"
    assert "at most 1,048,576 bytes (1 MiB)" in message and "a path to a file" in message
    assert fake.requests == []


def test_input_and_input_file_together_is_a_usage_error(tmp_path: Path) -> None:
    data = tmp_path / "in.json"
    data.write_text("{}")
    result = invoke("run", "start", "flow.py", "--input", "{}", "--input-file", str(data))
    assert result.exit_code == 2
    assert "not both" in result.stderr


@pytest.mark.usefixtures("short_home")
def test_server_status_without_a_server_reports_stopped_and_starts_nothing(
    short_home: Path,
) -> None:
    result = invoke("server", "status", "--json")
    assert result.exit_code == 0, result.output
    assert one_json_document(result.stdout) == {"state": "stopped"}

    human = invoke("server", "status")
    assert human.exit_code == 0
    assert "no piwf server is running" in human.stdout
    assert not short_home.exists()


def test_server_stop_without_a_server_exits_0(short_home: Path) -> None:
    result = invoke("server", "stop")
    assert result.exit_code == 0, result.output
    assert "no piwf server is running" in result.stdout
    as_json = invoke("server", "stop", "--json")
    assert one_json_document(as_json.stdout) == {"state": "stopped", "wasRunning": False}
    assert not short_home.exists()


# -- against the fake server ----------------------------------------------------------------


def answer(conn: FakeConnection, request: Request) -> None:
    operation, payload = request.operation, request.payload
    if operation == "server.status":
        conn.reply(request, SERVER_STATUS)
    elif operation == "server.stop":
        conn.reply(request, {"stopping": True})
        conn.close()
    elif operation == "run.start":
        conn.reply(request, {"run": run_info("run-new", title=payload.get("title"))})
    elif operation == "run.cancel":
        conn.reply(request, {"run": run_info(request.run_id or "", status="cancelled")})
    elif operation == "run.list":
        conn.reply(request, {"runs": [run_info("run-b", title="second"), run_info("run-a")]})
    elif operation in ("run.get", "view.run.get") and request.run_id == "run-a":
        source = {
            "mountPath": "",
            "referenceKind": "path",
            "reference": "/f.py",
            "sourceType": "file",
            "sourceRef": "/f.py",
            "sourceRevision": "x",
        }
        detail = {"run": run_info("run-a"), "sources": [source]}
        if operation == "run.get":
            conn.reply(request, detail)
        else:
            display = {"status": "queued", "activity": "idle", "controls": ["pause", "cancel"]}
            steps = {"steps": [], "total": 0}
            view = {"revision": 1, "detail": detail, "display": display, "steps": steps}
            conn.reply(request, view)
    elif operation in ("run.get", "view.run.get", "run.wait") and request.run_id == "missing":
        conn.fail(request, "notFound", "notFound", "no run missing")
    elif operation == "run.wait":
        status = {"run-done": "completed", "run-bad": "failed"}.get(request.run_id or "", "queued")
        run = run_info(request.run_id or "", status=status, display_status=status)
        conn.reply(request, {"run": run, "timedOut": status == "queued"})
    elif operation == "state.status":
        conn.reply(
            request,
            {
                "runs": {"queued": 2, "failed": 0},
                "queue": {"queued": 2},
                "pausedRuns": 0,
                "activeLeases": 0,
                "expiredLeases": 0,
                "unsettledEffects": 0,
                "ambiguousEffects": 0,
                "events": 4,
                "blobs": 2,
                "databaseBytes": 8192,
            },
        )
    elif operation == "state.verify":
        violations = [{"code": "queueWithoutRun", "detail": "queue row q1 has no run"}]
        conn.reply(request, {"valid": False, "violations": violations})
    elif operation == "state.backup":
        conn.reply(request, {"destination": payload["destination"], "bytes": 8192})
    elif operation in ("state.prunePreview", "state.prune"):
        conn.reply(request, prune_report(payload))
    else:
        conn.fail(request, "rejected", "unsupported", operation)


def prune_report(payload: dict[str, Any]) -> dict[str, Any]:
    applied = "backup" in payload
    report: dict[str, Any] = {
        "before": payload["before"],
        "applied": applied,
        "treeCount": 1,
        "runCount": 2,
        "trees": [{"rootRunId": "run-old", "runs": 2, "runIds": ["run-old", "run-old2"]}],
        "protectedCount": 1,
        "protected": [{"rootRunId": "run-held", "reasons": ["effect"]}],
        "truncated": False,
    }
    if applied:
        report["blobsDeleted"] = 7
        report["backup"] = {"destination": payload["backup"], "bytes": 8192}
    return report


@pytest.fixture
def fake(short_home: Path) -> Iterator[FakeServer]:
    with FakeServer(short_home, answer) as server:
        yield server


def test_run_start_sends_absolute_paths_and_parsed_input(
    fake: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "start", "flows/hello.py", "--input", '{"who": "Ada"}', "--json")
    assert result.exit_code == 0, result.output
    assert one_json_document(result.stdout)["run"]["runId"] == "run-new"
    (_, request), *_ = fake.requests
    assert request.payload == {
        "workflow": str(tmp_path / "flows" / "hello.py"),
        "projectPath": str(tmp_path),
        "input": {"who": "Ada"},
    }
    assert request.client_id.startswith("cli-")


def test_run_start_reads_input_file_or_stdin(fake: FakeServer, tmp_path: Path) -> None:
    data = tmp_path / "in.json"
    data.write_text('{\n  "n": 1.5\n}\n')
    assert invoke("run", "start", "hello", "--input-file", str(data)).exit_code == 0
    assert invoke("run", "start", "hello", "--input-file", "-", input="[true]").exit_code == 0
    inputs = [request.payload["input"] for _, request in fake.requests]
    assert inputs == [{"n": 1.5}, [True]]


def test_run_start_human_output_names_the_run(fake: FakeServer) -> None:
    result = invoke("run", "start", "hello", "--title", "greeting")
    assert result.exit_code == 0, result.output
    assert result.stdout == "started run-new  queued  hello\n"


def test_run_start_wait_that_times_out_exits_1(fake: FakeServer) -> None:
    result = invoke("run", "start", "hello", "--wait", "--timeout", "0")
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: run run-new is still queued after 0 s; it keeps going. Wait again: piwf run wait"
        " run-new (what it waits on: piwf run explain run-new)\n"
    )

    as_json = invoke("run", "start", "hello", "--wait", "--timeout", "0", "--json")
    assert as_json.exit_code == 1
    document = one_json_document(as_json.stdout)
    assert document["timedOut"] is True
    assert document["run"]["runId"] == "run-new"


@pytest.mark.parametrize(("run_id", "exit_code"), [("run-done", 0), ("run-bad", 1)])
def test_run_wait_exits_0_only_for_a_completed_run(
    fake: FakeServer, run_id: str, exit_code: int
) -> None:
    result = invoke("run", "wait", run_id, "--json")
    assert result.exit_code == exit_code, result.output
    document = one_json_document(result.stdout)
    assert document["timedOut"] is False
    assert document["run"]["runId"] == run_id
    if exit_code:
        assert "ended failed" in invoke("run", "wait", run_id).stderr


def test_run_list_prints_a_table(fake: FakeServer) -> None:
    result = invoke("run", "list", "--limit", "2")
    assert result.exit_code == 0, result.output
    header, first, second = result.stdout.splitlines()
    assert header.split() == ["RUN", "ID", "STATUS", "WORKFLOW", "CREATED", "TITLE"]
    assert first.startswith("run-b") and first.endswith("second")
    assert second.startswith("run-a")
    (_, request), *_ = fake.requests
    assert request.payload == {"limit": 2}
    listing = one_json_document(invoke("run", "list", "--json").stdout)
    assert [run["runId"] for run in listing["runs"]] == ["run-b", "run-a"]


def test_run_list_reads_its_page_without_pydantic_and_prints_the_models_table(
    fake: FakeServer, tmp_path: Path
) -> None:
    found, stdout = run_probe(
        ["run", "list"], ["pydantic", "pydantic_core", "tenacity"], tmp_path / "imported.json"
    )
    assert found["status"] == 0, stdout
    assert found["heavy"] == [], "run list's quick path loaded pydantic"
    assert "piwf.client.client" not in found["piwf"]
    # The same table the full client's validated page gives.
    receipt = {"runs": [run_info("run-b", title="second"), run_info("run-a")]}
    assert stdout == render.run_page(RunPage.model_validate(receipt)) + "\n"
    assert [(request.operation, request.payload) for _, request in fake.requests] == [
        ("run.list", {"limit": 50})
    ]


ODD_RECEIPTS = {
    "a shown field of another type": {"runs": [{**run_info("run-a"), "createdAt": "yesterday"}]},
    "a run that is not an object": {"runs": ["run-a"]},
    "no runs array": {"items": []},
}


@pytest.mark.parametrize("receipt", list(ODD_RECEIPTS.values()), ids=list(ODD_RECEIPTS))
def test_run_list_asks_the_full_client_when_the_quick_read_finds_a_receipt_it_does_not_know(
    short_home: Path, receipt: dict[str, Any]
) -> None:
    # The quick path prints nothing of what it cannot check: the full client asks again,
    # validates, and reports the server as breaking the protocol.
    def odd(conn: FakeConnection, request: Request) -> None:
        conn.reply(request, receipt)

    with FakeServer(short_home, odd) as server:
        result = invoke("run", "list")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "invalid RunPage" in result.stderr
    assert [request.operation for _, request in server.requests] == ["run.list", "run.list"]
    assert len({number for number, _ in server.requests}) == 2


def test_run_list_leaves_a_refusal_and_another_version_to_the_full_client(
    short_home: Path,
) -> None:
    def refuse(conn: FakeConnection, request: Request) -> None:
        conn.fail(request, "rejected", "stateBusy", "the state is busy")

    with FakeServer(short_home, refuse) as server:
        refused = invoke("run", "list")
    assert refused.exit_code == 1
    assert "the state is busy" in refused.stderr
    assert [request.operation for _, request in server.requests] == ["run.list", "run.list"]

    with FakeServer(short_home, answer, package_version="0.0.1") as server:
        other = invoke("run", "list")
    assert other.exit_code == 1
    assert "runs version 0.0.1" in other.stderr
    assert server.requests == [], "a request went to a server of another version"


def test_a_title_with_control_characters_stays_on_its_row() -> None:
    # A title is free text (--title, or a workflow's title callable of the input): a line
    # break must not forge a row of the table, nor an escape sequence drive the terminal.
    forged = "ok\nrun-forged  completed  hello\x1b[2J\u2028"
    page = RunPage.model_validate({"runs": [run_info("run-a", title=forged)]})
    table = render.run_page(page).split("\n")
    assert len(table) == 2, table
    assert table[1].endswith("ok\\nrun-forged  completed  hello\\x1b[2J\\u2028")
    detail = render.run_detail(
        RunDetail.model_validate({"run": run_info("run-a", title=forged), "sources": []})
    )
    assert "  title       ok\\nrun-forged  completed  hello\\x1b[2J\\u2028\n" in detail
    assert "Ünïcødé 🚀" in render.run_page(
        RunPage.model_validate({"runs": [run_info("run-a", title="Ünïcødé 🚀")]})
    )


def test_a_run_list_page_with_more_after_it_ends_with_the_next_pages_command() -> None:
    # --limit stops at the protocol's largest run.list limit; the next page is --before the
    # last run shown, with the page's own options.
    assert RunListPayload.model_fields["limit"].metadata[-1].le == render.RUN_LIST_MOST
    cursor = {"createdAt": 1, "runId": "run-9"}

    def hint(count: int, *same: str) -> str:
        runs = [run_info(f"run-{index}") for index in range(count)]
        page = RunPage.model_validate({"runs": runs, "nextCursor": cursor})
        return render.run_page(page, same).splitlines()[-1]

    assert hint(10) == "(more runs exist; the next page: piwf run list --before run-9)"
    assert hint(render.RUN_LIST_MOST, "--limit", "500", "--status", "failed") == (
        "(more runs exist; the next page: piwf run list --limit 500 --status failed"
        " --before run-499)"
    )


MALFORMED_IDS = {
    "answer": (["answer", "a b", "{}"], "'REQUEST_ID'", "a request", "'a b'"),
    "submit": (["submit", "a b", "{}"], "'REQUEST_ID'", "a request", "'a b'"),
    "update": (["update", "a b", "{}"], "'REQUEST_ID'", "a request", "'a b'"),
    "requests --run": (["requests", "--run", "a b"], "'--run'", "a run", "'a b'"),
    "effect resolve": (
        ["effect", "resolve", "a b", "--applied"],
        "'EFFECT_ID'",
        "an effect",
        "'a b'",
    ),
    "channel recover": (
        ["channel", "recover", "a\x1b[2J", "confirm"],
        "'EFFECT_ID'",
        "an effect",
        "'a\\x1b[2J'",
    ),
}
#: Where the ids of each kind are listed, as a refusal of a malformed one says.
LISTINGS = {
    "a request": "piwf requests lists the pending requests",
    "a run": "piwf run list shows the run ids",
    "an effect": "piwf run show RUN_ID lists a run's effects",
}


@pytest.mark.parametrize(
    ("args", "where", "kind", "shown"), list(MALFORMED_IDS.values()), ids=list(MALFORMED_IDS)
)
def test_a_malformed_id_of_any_kind_is_a_usage_error_that_sends_nothing(
    fake: FakeServer, args: list[str], where: str, kind: str, shown: str
) -> None:
    # As for a run id: a space or a control character is no id piwf gave out (exit 2); the
    # refusal names what was given (escaped), the rule and where the ids are listed.
    result = invoke(*args, "--json")
    assert result.exit_code == 2, result.output
    assert one_json_document(result.stdout)["error"] == {
        "code": "usage",
        "message": f"Invalid value for {where}: {shown} is not {kind} id: {kind} id is 1 to 256"
        f" printable ASCII characters, no spaces ({LISTINGS[kind]})",
    }
    assert fake.requests == [], "a malformed id reached the server"


PAUSE_MARKS = {
    "a paused unfinished run": (dict(status="running", display_status="paused"), "paused"),
    "a paused run that ended": (
        dict(status="cancelled", display_status="cancelled"),
        "cancelled (paused)",
    ),
}


@pytest.mark.parametrize(("fields", "shown"), list(PAUSE_MARKS.values()), ids=list(PAUSE_MARKS))
def test_a_paused_run_says_paused_once(fields: dict[str, Any], shown: str) -> None:
    # The display status of a paused unfinished run is already "paused" (docs/CLI.md, run pause).
    run = RunPage.model_validate({"runs": [run_info("run-a", paused=True, **fields)]}).runs[0]
    assert render.run_status(run) == shown
    assert render.run_line(run) == f"run-a  {shown}  hello"


def test_run_show_prints_fields_and_sources(fake: FakeServer) -> None:
    result = invoke("run", "show", "run-a")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "run-a  queued"
    assert "/f.py" in result.stdout
    detail = one_json_document(invoke("run", "show", "run-a", "--json").stdout)
    assert detail["sources"][0]["sourceRef"] == "/f.py"


def test_command_errors_exit_1_with_the_servers_code(fake: FakeServer) -> None:
    result = invoke("run", "show", "missing")
    assert result.exit_code == 1
    assert result.stderr == "Error: no run missing\n"
    as_json = invoke("run", "show", "missing", "--json")
    assert as_json.exit_code == 1
    assert one_json_document(as_json.stdout) == {
        "error": {"code": "notFound", "message": "no run missing"}
    }


def test_run_cancel(fake: FakeServer) -> None:
    result = invoke("run", "cancel", "run-a", "--json")
    assert result.exit_code == 0, result.output
    assert one_json_document(result.stdout)["run"]["status"] == "cancelled"
    (_, request), *_ = fake.requests
    assert request.run_id == "run-a"
    assert request.idempotency_key is not None


def test_server_status_and_stop_with_a_server(fake: FakeServer) -> None:
    status = invoke("server", "status", "--json")
    assert one_json_document(status.stdout) == SERVER_STATUS
    human = invoke("server", "status").stdout
    assert "piwf server running (pid 4242, epoch 1" in human
    assert "2 queued, 0 running, 0 waiting, 1 parked" in human
    assert "1 runnerNoProgress" in human
    stop = invoke("server", "stop", "--json")
    assert stop.exit_code == 0, stop.output
    assert one_json_document(stop.stdout) == {"state": "stopped", "wasRunning": True}


def test_server_start_when_one_already_runs(
    fake: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, object]] = []

    def ensure(home: Path, **options: object) -> None:
        calls.append(options)

    monkeypatch.setattr(launcher, "ensure_server", ensure)
    result = invoke("server", "start", "--max-workers", "2", "--json")
    assert result.exit_code == 0, result.output
    assert one_json_document(result.stdout) == {
        "started": False,
        "epoch": 1,
        "notApplied": ["--max-workers"],
    }
    assert calls == [], "a server that answers is left alone: nothing is launched"
    assert "already running" in invoke("server", "start").stdout


def test_state_commands(fake: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    status = invoke("state", "status")
    assert status.exit_code == 0
    assert "2 queued" in status.stdout and "0 failed" not in status.stdout

    verify = invoke("state", "verify", "--json")
    assert verify.exit_code == 1
    assert one_json_document(verify.stdout)["violations"][0]["code"] == "queueWithoutRun"
    assert "queueWithoutRun" in invoke("state", "verify").stdout

    backup = invoke("state", "backup", "b.sqlite", "--json")
    assert backup.exit_code == 0, backup.output
    assert one_json_document(backup.stdout)["destination"] == str(tmp_path / "b.sqlite")


# -- server run: the entry point into the server package --------------------------------------


def test_server_run_passes_options_to_the_servers_entry_point(
    monkeypatch: pytest.MonkeyPatch, short_home: Path
) -> None:
    calls: list[tuple[Any, int | None, Any]] = []
    early = object()  # what start_helpers_early returned, handed on to the server
    methods: list[Any] = []

    def run_server(settings: Any, ready_fd: int | None, early_helpers: Any) -> int:
        calls.append((settings, ready_fd, early_helpers))
        return 0

    def start_helpers_early(method: Any) -> object:
        methods.append(method)  # no fork server in the test's own process
        return early

    monkeypatch.setattr(start_methods, "start_helpers_early", start_helpers_early)

    lifecycle = types.ModuleType("piwf.server.lifecycle")
    lifecycle.run_server = run_server  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "piwf.server.lifecycle", lifecycle)
    # ``from piwf.server import lifecycle`` reads the package's attribute once the real module
    # was imported (by an earlier test): the real server would then run on descriptor 9.
    server_package = sys.modules.get("piwf.server")
    if server_package is not None:
        monkeypatch.setattr(server_package, "lifecycle", lifecycle, raising=False)
    argv = launcher.server_command(9, max_workers=2, idle_exit_s=1.5)[3:]
    result = invoke(*argv, "--json")
    assert result.exit_code == 0, result.output
    assert one_json_document(result.stdout) == {"exitCode": 0}
    ((settings, ready_fd, early_helpers),) = calls
    assert ready_fd == 9
    assert early_helpers is early
    assert methods == [settings.start_method]
    assert (settings.max_workers, settings.idle_exit_s) == (2, 1.5)
    assert settings.paths.home == short_home


def test_server_run_reports_bad_settings_on_the_ready_fd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIWF_MAX_WORKERS", "many")
    read_fd, write_fd = os.pipe()
    try:
        result = invoke("server", "run", "--ready-fd", str(write_fd))
        report = os.read(read_fd, 4096)
        # The command closed the write end, as the ready protocol requires: end of file now.
        readable, _, _ = select.select([read_fd], [], [], 0)
        at_eof = bool(readable) and os.read(read_fd, 1) == b""
    finally:
        os.close(read_fd)
    assert result.exit_code == 1
    assert "cannot start" in result.stderr
    line = json.loads(report)
    assert line["ok"] is False
    assert line["error"]["code"] == "serverStart"
    assert at_eof


# conformance: S3
def test_offline_verify_reports_planted_violations_with_stable_codes(tmp_path: Path) -> None:
    from piwf.state import StateDatabase

    home = tmp_path / "home"
    path = home / "state.sqlite"
    with StateDatabase(path) as database, database.write() as tx:
        tx.execute("INSERT INTO resources VALUES ('run:x', 'run', 'x', 3, 1, 1)")
    result = invoke("state", "verify", str(path), "--json")
    assert result.exit_code == 1, result.output
    document = one_json_document(result.stdout)
    assert document["valid"] is False
    assert [v["code"] for v in document["violations"]] == ["eventRevisions"]
    assert sorted(p.name for p in home.iterdir()) == ["state.sqlite"]


# -- state prune ----------------------------------------------------------------------------

MAY_1 = 1_714_521_600_000  # 2024-05-01T00:00:00Z


@pytest.mark.parametrize(
    "text",
    [
        "2024-05-01",
        "2024-05-01T00:00:00Z",
        "2024-05-01T02:00:00+02:00",
        "2024-05-01 00:00:00",
        str(MAY_1),
    ],
)
def test_prune_timestamps_are_iso_8601_or_epoch_milliseconds(text: str) -> None:
    assert parse_timestamp(text) == MAY_1


def test_prune_dry_run_sends_the_cutoff_and_prints_one_document(fake: FakeServer) -> None:
    result = invoke("state", "prune", "--before", "2024-05-01T00:00:00Z", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    report = one_json_document(result.stdout)
    assert report["applied"] is False and report["treeCount"] == 1
    ((_, request),) = fake.requests
    assert (request.operation, request.payload) == ("state.prunePreview", {"before": MAY_1})
    assert request.idempotency_key is None, "a preview is a read"
    human = invoke("state", "prune", "--before", str(MAY_1), "--dry-run")
    assert human.exit_code == 0, human.output
    assert "would delete 1 run tree(s), 2 run(s)" in human.stdout
    assert "run-held  effect" in human.stdout
    assert "piwf run explain RUN_ID says what holds a run" in human.stdout


def test_prune_apply_sends_the_backup_path_under_one_key(fake: FakeServer, tmp_path: Path) -> None:
    backup = tmp_path / "before-prune.sqlite"
    result = invoke(
        "state", "prune", "--before", "2024-05-01", "--backup", str(backup), "--apply", "--json"
    )
    assert result.exit_code == 0, result.output
    report = one_json_document(result.stdout)
    assert report["applied"] is True
    assert report["backup"] == {"destination": str(backup), "bytes": 8192}
    ((_, request),) = fake.requests
    assert request.operation == "state.prune"
    assert request.payload == {"before": MAY_1, "backup": str(backup)}
    assert request.idempotency_key
    human = invoke("state", "prune", "--before", "2024-05-01", "--backup", str(backup), "--apply")
    assert human.stdout.splitlines()[:2] == [
        f"backup written to {backup} (8192 bytes, verified)",
        f"deleted 1 run tree(s), 2 run(s), finished before {render.timestamp(MAY_1, offset=True)}",
    ]


def test_prune_refuses_an_existing_backup_file_before_asking_the_server(tmp_path: Path) -> None:
    existing = tmp_path / "taken.sqlite"
    existing.write_bytes(b"")
    result = invoke(
        "state", "prune", "--before", "1", "--backup", str(existing), "--apply", "--json"
    )
    assert result.exit_code == 2
    assert "already exists" in one_json_document(result.stdout)["error"]["message"]


# What a command that talks to a server imports ------------------------------------------------

#: Imported only by the calls that use them: tenacity once an attempt failed, the launcher to
#: start a server, the remote connector for ``remote``, the run view's renderer, and the payload
#: models of each group of client methods.
ON_DEMAND = (
    "tenacity",
    "piwf.client.launcher",
    "piwf.client.websocket",
    "piwf.cli.render_view",
    "piwf.protocol.channel_payloads",
    "piwf.protocol.log_payloads",
    "piwf.protocol.resource_payloads",
    "piwf.protocol.session_capture_payloads",
    "piwf.protocol.session_payloads",
    "piwf.protocol.settings_payloads",
    "piwf.protocol.state_payloads",
    "piwf.protocol.view_payloads",
    "piwf.protocol.workflow_payloads",
)

#: Imports the client, then calls it; prints which of the modules argv[1] (JSON) were imported
#: after each step and what the calls returned. The server drops the first connection, so the
#: first call succeeds only through the retry loop.
CLIENT_PROBE = """
import json, sys
watched = json.loads(sys.argv[1])
def imported():
    return [name for name in watched if name in sys.modules]
from piwf.client import Client
found = {"import": imported()}
with Client(autostart=False) as client:
    found["epoch"] = client.server_status().epoch
    found["retried"] = imported()
    found["events"] = client.state_status().events
    found["state"] = imported()
from piwf.client import CapturedEntry
found["capturedEntry"] = CapturedEntry.__module__
print(json.dumps(found))
"""


@pytest.mark.parametrize(
    ("arguments", "needed"),
    [
        (["run", "list", "--json"], []),
        (["server", "status", "--json"], []),
        (
            ["run", "show", "run-a", "--json"],
            ["piwf.cli.render_view", "piwf.protocol.view_payloads"],
        ),
    ],
    ids=["run-list", "server-status", "run-show"],
)
def test_a_command_imports_only_what_its_own_call_needs(
    fake: FakeServer, tmp_path: Path, arguments: list[str], needed: list[str]
) -> None:
    found, stdout = run_probe(arguments, ["tenacity"], tmp_path / "imported.json")
    assert found["status"] == 0, stdout
    one_json_document(stdout)
    loaded = {*found["piwf"], *found["heavy"]}
    assert [name for name in ON_DEMAND if name in loaded] == needed


def test_client_methods_import_their_models_and_tenacity_when_called(short_home: Path) -> None:
    def drop_the_first_connection(conn: FakeConnection, request: Request) -> None:
        if conn.number == 1:
            conn.close()
        else:
            answer(conn, request)

    with FakeServer(short_home, drop_the_first_connection) as server:
        finished = subprocess.run(
            [sys.executable, "-c", CLIENT_PROBE, json.dumps(ON_DEMAND)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    assert json.loads(finished.stdout) == {
        "import": [],
        "epoch": 1,
        "retried": ["tenacity"],
        "events": 4,
        "state": ["tenacity", "piwf.protocol.state_payloads"],
        "capturedEntry": "piwf.protocol.session_capture_payloads",
    }
    assert [number for number, _ in server.requests] == [1, 2, 2]


def test_view_help_says_a_answers_in_a_form_as_the_viewer_does() -> None:
    """The run screen's ``a`` opens an answer form (docs/CLI.md); the help says the same."""
    text = " ".join(invoke("view", "--help").stdout.split())
    assert "a answers the waiting checkpoint or decision in a form" in text
    assert "a shows the `piwf answer` command" not in text


@pytest.mark.parametrize("args", [("workflows", "--help"), ("workflows", "show", "--help")])
def test_the_workflows_help_examples_name_a_workflow_a_fresh_install_has(
    args: tuple[str, ...],
) -> None:
    from piwf.workflow.sources import BUILTIN_DIR

    result = invoke(*args)
    assert result.exit_code == 0, result.output
    named = re.findall(r"piwf workflows show (\S+)", result.output)
    by_name = [name for name in named if "/" not in name and not name.endswith(".py")]
    assert by_name, result.output
    builtins = {path.stem for path in BUILTIN_DIR.glob("*.py")}
    assert set(by_name) <= builtins, (by_name, builtins)


@pytest.mark.parametrize("typed", ["{choice:ship}", "[a, b]", " {ok: true}"])
def test_json_whose_quotes_a_shell_removed_is_refused_with_how_to_quote_it(typed: str) -> None:
    result = invoke("answer", "req-1", typed)
    assert result.exit_code == 2, result.output
    assert "not valid JSON for piwf (notJson)" in result.output
    assert "write the JSON in single quotes" in result.output


@pytest.mark.parametrize("typed", ['{"choice": ship}', '{"a": 1,}', "[1, 2", "{}}", "12 13"])
def test_other_json_errors_give_no_quoting_hint(typed: str) -> None:
    result = invoke("answer", "req-1", typed)
    assert result.exit_code == 2, result.output
    assert "not valid JSON for piwf" in result.output
    assert "single quotes" not in result.output


@pytest.mark.parametrize(
    "command", [("submit", "request-1"), ("update", "request-1"), ("answer", "req-1")]
)
@pytest.mark.parametrize("typed", ["ship", "looks good"])
def test_a_bare_word_is_refused_with_how_to_write_a_string(
    command: tuple[str, str], typed: str
) -> None:
    result = invoke(*command, typed)
    assert result.exit_code == 2, result.output
    if command[0] == "answer" and typed == "ship":
        # answer names a bare word itself: a decision's choice, or a checkpoint's string
        assert """'{"choice": "ship"}'""" in result.output, result.output
        return
    assert "not valid JSON for piwf (notJson)" in result.output
    assert "a JSON string is written in double quotes, inside single quotes" in result.output
    assert typed not in result.output  # the rule, never the text


@pytest.mark.parametrize("typed", ["[1, 2", '{"choice": "ship"', '{"a": [1, {"b": 2}] '])
def test_json_cut_off_is_said_to_end_early(typed: str) -> None:
    result = invoke("answer", "req-1", typed)
    assert result.exit_code == 2, result.output
    assert "the text ends before its JSON does" in result.output, result.output


@pytest.mark.parametrize("typed", ["{}}", '{"a": 1,}', "[1 2]"])
def test_json_with_an_error_inside_is_not_said_to_end_early(typed: str) -> None:
    result = invoke("answer", "req-1", typed)
    assert result.exit_code == 2, result.output
    assert "ends before" not in result.output, result.output


@pytest.mark.parametrize("typed", ["ship", " hold\n", "NaN"])
def test_a_bare_word_as_an_answer_is_shown_as_json(typed: str) -> None:
    """A choice's name typed as it is (what `piwf answer REQ CHOICE` once suggested)."""
    result = invoke("answer", "req-1", typed)
    assert result.exit_code == 2, result.output
    word = typed.strip()
    assert f"""a decision takes '{{"choice": "{word}"}}'""" in result.output
    assert f"""('"{word}"' for a string)""" in result.output
