"""``piwf mcp`` through the MCP SDK's own client, against a real server and runner children.

Each test starts a real server (``fast_server``), then a real ``python -m piwf mcp`` subprocess
through ``mcp.client.stdio`` and speaks MCP to it with ``ClientSession``. What a call did is
checked on the server (raw protocol client, read-only database queries), not only in the
tool's answer. Every ``piwf mcp`` subprocess is ended by the SDK client when its context
closes; the harness reaps the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

from piwf.mcp.config import request_config
from tests.mcp.conftest import fast_server, require_sdk  # noqa: F401 - a fixture used by name
from tests.server.harness import ServerProcess, raw_client, wait_for
from tests.server.test_decisions import waiting_request, winners
from tests.server.test_execution import query, run_view, start, wait_run, write_workflow

require_sdk()

from mcp import ClientSession, StdioServerParameters  # noqa: E402 - after the SDK check
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.types import CallToolResult  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "workflows"
CHECKPOINT = str(FIXTURES / "checkpoint_review.py")
AGENT = str(FIXTURES / "agent_validate.py")
FULL_TOOLS = ["list", "status", "start", "pause", "resume", "cancel", "answer", "update", "submit"]


@asynccontextmanager
async def mcp_session(
    server: ServerProcess, errlog: TextIO, request_id: str | None = None
) -> AsyncIterator[ClientSession]:
    """A ``piwf mcp`` subprocess for ``server``'s home, initialised, as the SDK starts one.

    With ``request_id`` it is started from the configuration a headless agent command gets
    (:func:`piwf.mcp.config.request_config`), exactly as an MCP client reads it.
    """
    if request_id is None:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "piwf", "mcp"],
            env={"PIWF_HOME": str(server.home)},
            cwd=str(REPO),
        )
    else:
        config = request_config(request_id, home=server.home)["mcpServers"]["piwf"]
        params = StdioServerParameters(**config, cwd=str(REPO))
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def speak(tmp_path: Path, body: Callable[[TextIO], Awaitable[None]]) -> str:
    """Run one async test body; return what the ``piwf mcp`` processes wrote to stderr."""
    errors = tmp_path / "mcp.stderr"
    with errors.open("w") as errlog:
        asyncio.run(body(errlog))
    text = errors.read_text()
    assert "Traceback" not in text, text
    return text


def text_of(result: CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def data_of(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text_of(result)
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


def pending_agent_request(server: ServerProcess, run_id: str) -> str:
    def found() -> str | None:
        rows = query(
            server,
            "SELECT request_id FROM interactive_requests"
            " WHERE run_id = ? AND kind = 'agent' AND status = 'pending'",
            (run_id,),
        )
        return str(rows[0][0]) if rows else None

    request_id: str = wait_for(found, timeout_s=30, what="the agent request")
    return request_id


def test_the_full_tool_lists_every_action_with_a_model_facing_description(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        async with mcp_session(fast_server, errlog) as session:
            listed = await session.list_tools()
        assert [tool.name for tool in listed.tools] == FULL_TOOLS
        by_name = {tool.name: tool for tool in listed.tools}
        for tool in listed.tools:
            assert tool.description and len(tool.description) > 40, tool.name
        assert by_name["submit"].input_schema["required"] == ["request_id", "output"]
        assert "protected human decision" in (by_name["answer"].description or "")
        assert by_name["status"].annotations is not None
        assert by_name["status"].annotations.read_only_hint is True

    speak(tmp_path, body)


def test_arguments_outside_the_input_schema_get_the_short_argument_error(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        async with mcp_session(fast_server, errlog) as session:
            too_few = await session.call_tool("list", {"limit": 0})
            not_a_name = await session.call_tool("start", {"workflow": 123})
        for result, expected in (
            (too_few, "invalid argument: limit: Input should be greater than or equal to 1"),
            (not_a_name, "invalid argument: workflow: Input should be a valid string"),
        ):
            text = text_of(result)
            assert result.is_error and expected in text, text
            assert "pydantic" not in text and "input_value" not in text, text

    speak(tmp_path, body)


def test_a_wrong_type_is_refused_and_a_text_argument_stays_the_text_sent(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        async with mcp_session(fast_server, errlog) as session:
            coerced = [
                await session.call_tool("list", {"limit": limit}) for limit in (True, "5", 2.0)
            ]
            for result in coerced:
                text = text_of(result)
                assert result.is_error, text
                assert "invalid argument: limit: Input should be a valid integer" in text, text
                assert text.endswith("(error code: invalidArgument)"), text
            titles = ["null", '{"a": 1}', "[1]"]
            for title in titles:
                started = await session.call_tool(
                    "start",
                    {
                        "workflow": CHECKPOINT,
                        "input": {"steps": []},
                        "title": title,
                        "idempotency_key": title.replace(" ", ""),
                    },
                )
                assert data_of(started)["run"]["title"] == title

    speak(tmp_path, body)
    stored = query(fast_server, "SELECT title FROM runs", ())
    assert sorted(title for (title,) in stored) == sorted(["null", '{"a": 1}', "[1]"])


def test_an_argument_the_tool_does_not_take_is_refused_and_nothing_is_done(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        async with mcp_session(fast_server, errlog) as session:
            misspelt = {"workflow": CHECKPOINT, "input": {"steps": [1]}, "idempotencyKey": "k"}
            misspelt_key = [await session.call_tool("start", misspelt) for _ in range(2)]
            control_name = await session.call_tool("list", {"\x1b[2J": 1})
        for result in misspelt_key:
            text = text_of(result)
            assert result.is_error, text
            assert "invalid argument: 'idempotencyKey': not an argument of start" in text, text
            assert "idempotency_key" in text, text
            assert text.endswith("(error code: invalidArgument)"), text
        text = text_of(control_name)
        assert control_name.is_error and "\x1b" not in text, text
        assert "an argument name: not an argument of list; it takes limit" in text, text

    speak(tmp_path, body)
    assert query(fast_server, "SELECT COUNT(*) FROM runs", ()) == [(0,)]


def test_start_and_status_of_a_run_then_answer_its_checkpoint(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        async with mcp_session(fast_server, errlog) as session:
            started = data_of(
                await session.call_tool(
                    "start",
                    {"workflow": CHECKPOINT, "input": {"steps": ["a", "b"]}, "title": "via mcp"},
                )
            )
            run_id = started["run"]["runId"]
            with raw_client(fast_server) as client:
                request = waiting_request(client, run_id)
            status = data_of(await session.call_tool("status", {"run_id": run_id}))
            assert status["run"]["status"] == "waiting"
            assert status["run"]["title"] == "via mcp"
            assert status["waitingOn"]["requestId"] == request["requestId"]
            listing = data_of(await session.call_tool("list", {}))
            assert [run["runId"] for run in listing["runs"]] == [run_id]
            assert [item["requestId"] for item in listing["requests"]] == [request["requestId"]]
            answered = data_of(
                await session.call_tool(
                    "answer", {"request_id": request["requestId"], "response": {"ok": True}}
                )
            )
            assert answered["outcome"] == "won"
            assert answered["resolution"]["provenance"] == "client"
            with raw_client(fast_server) as client:
                run = wait_run(client, run_id)
                view = run_view(client, run_id)
            assert run["status"] == "completed"
            assert view["output"] == {"applied": ["a", "b"], "note": {"ok": True}}
            missing = await session.call_tool("status", {"run_id": "run-nope"})
            assert missing.is_error and "runNotFound" in text_of(missing)

    speak(tmp_path, body)


def test_pause_resume_and_cancel_change_the_run_on_the_server(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        async with mcp_session(fast_server, errlog) as session:
            started = data_of(
                await session.call_tool("start", {"workflow": CHECKPOINT, "input": {"steps": []}})
            )
            run_id = started["run"]["runId"]
            with raw_client(fast_server) as client:
                waiting_request(client, run_id)
            idle = data_of(await session.call_tool("resume", {"run_id": run_id}))
            assert idle["outcome"] == "unchanged", "nothing to resume: it is not paused"
            paused = data_of(await session.call_tool("pause", {"run_id": run_id}))
            assert (paused["run"]["paused"], paused["outcome"]) == (True, "changed")
            resumed = data_of(await session.call_tool("resume", {"run_id": run_id}))
            assert (resumed["run"]["paused"], resumed["outcome"]) == (False, "changed")
            cancelled = data_of(await session.call_tool("cancel", {"run_id": run_id}))
            assert (cancelled["run"]["status"], cancelled["outcome"]) == ("cancelled", "changed")
            again = data_of(await session.call_tool("cancel", {"run_id": run_id}))
            assert again["outcome"] == "unchanged"
            unknown = await session.call_tool("pause", {"run_id": "run-nope"})
            assert unknown.is_error and "runNotFound" in text_of(unknown)
        assert query(fast_server, "SELECT status FROM runs WHERE run_id = ?", (run_id,)) == [
            ("cancelled",)
        ]

    speak(tmp_path, body)


def test_a_protected_decision_is_refused_and_stays_pending(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    from tests.server.test_decisions import decision_workflow

    workflow = decision_workflow(tmp_path, "guarded", 600_000)

    async def body(errlog: TextIO) -> None:
        with raw_client(fast_server) as client:
            run_id = start(client, workflow, {}, "guarded")
            request = waiting_request(client, run_id)
        async with mcp_session(fast_server, errlog) as session:
            refused = await session.call_tool(
                "answer", {"request_id": request["requestId"], "response": {"choice": "ship"}}
            )
        assert refused.is_error
        text = text_of(refused)
        assert "a protected decision accepts only a human answer" in text
        assert f"piwf answer {request['requestId']} VALUE" in text, "it says what to do"
        assert "answerRejected" in text
        with raw_client(fast_server) as client:
            view = run_view(client, run_id)
            listed = client.request("requests.list", {"runId": run_id}).receipt
        assert view["run"]["status"] == "waiting"
        assert listed is not None
        assert [item["requestId"] for item in listed["requests"]] == [request["requestId"]]
        assert winners(fast_server, request["requestId"]) == []

    speak(tmp_path, body)


def test_submit_and_update_of_a_checkpoint_or_decision_point_to_the_answer_tool_or_a_person(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The server's refusal names `piwf answer`, a person's command: a model is pointed at the
    `answer` tool for a checkpoint, and told a protected decision is a person's to answer."""
    from tests.server.test_decisions import decision_workflow

    workflow = decision_workflow(tmp_path, "guarded", 600_000)

    async def body(errlog: TextIO) -> None:
        with raw_client(fast_server) as client:
            checkpoint = waiting_request(client, start(client, CHECKPOINT, {"steps": [1]}, "cp"))
            decision = waiting_request(client, start(client, workflow, {}, "guarded"))
        async with mcp_session(fast_server, errlog) as session:
            texts = {}
            for name, request in (("checkpoint", checkpoint), ("decision", decision)):
                for tool, value in (("submit", "output"), ("update", "data")):
                    arguments = {"request_id": request["requestId"], value: {"choice": "ship"}}
                    result = await session.call_tool(tool, arguments)
                    assert result.is_error, text_of(result)
                    texts[name, tool] = text_of(result)
        for (name, _tool), text in texts.items():
            assert "piwf answer request-" not in text, text
            assert text.endswith("nothing was done (error code: notAgentRequest)"), text
            if name == "checkpoint":
                assert "answer it with the `answer` tool" in text, text
            else:
                assert "only a person answers it" in text, text
        assert winners(fast_server, decision["requestId"]) == []
        assert winners(fast_server, checkpoint["requestId"]) == []

    speak(tmp_path, body)


def test_request_mode_offers_only_update_and_submit_and_refuses_another_request(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        with raw_client(fast_server) as client:
            run_id = start(client, CHECKPOINT, {"steps": []}, "cp")
            checkpoint = waiting_request(client, run_id)
        async with mcp_session(fast_server, errlog, "request-bound") as session:
            listed = await session.list_tools()
            assert sorted(tool.name for tool in listed.tools) == ["submit", "update"]
            submit = next(tool for tool in listed.tools if tool.name == "submit")
            assert submit.input_schema["required"] == ["output"]
            assert "request-bound" in (submit.description or "")
            other = await session.call_tool(
                "submit", {"output": {"ok": True}, "request_id": checkpoint["requestId"]}
            )
            assert other.is_error and "bound to request request-bound" in text_of(other)
            unknown = await session.call_tool("answer", {"request_id": "x", "response": 1})
            assert unknown.is_error
            cancel = await session.call_tool("cancel", {"run_id": run_id})
            assert cancel.is_error
        with raw_client(fast_server) as client:
            view = run_view(client, run_id)
        assert view["run"]["status"] == "waiting", "nothing was answered or cancelled"
        assert winners(fast_server, checkpoint["requestId"]) == []

    speak(tmp_path, body)


# The two tests below need Client.submit / Client.update (the submissions part of issue 15).
def test_submit_through_the_bound_tool_rejects_then_completes_the_agent_step(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        with raw_client(fast_server) as client:
            run_id = start(client, AGENT, {"topic": "tides"}, "agent")
        request_id = pending_agent_request(fast_server, run_id)
        async with mcp_session(fast_server, errlog, request_id) as session:
            rejected = await session.call_tool("submit", {"output": {"summary": "   "}})
            assert rejected.is_error
            assert "non-empty text" in text_of(rejected), text_of(rejected)
            with raw_client(fast_server) as client:
                assert run_view(client, run_id)["run"]["status"] == "waiting"
            accepted = await session.call_tool(
                "submit", {"output": {"summary": "  The moon pulls the sea.  "}}
            )
            assert not accepted.is_error, text_of(accepted)
        with raw_client(fast_server) as client:
            run = wait_run(client, run_id)
            view = run_view(client, run_id)
        assert run["status"] == "completed"
        assert view["output"] == {"summary": "The moon pulls the sea."}

    speak(tmp_path, body)


def test_update_and_submit_through_the_full_tool_name_the_exact_request(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        with raw_client(fast_server) as client:
            run_id = start(client, AGENT, {"topic": "tides"}, "agent")
        request_id = pending_agent_request(fast_server, run_id)
        async with mcp_session(fast_server, errlog) as session:
            updated = await session.call_tool(
                "update", {"request_id": request_id, "data": {"status": "drafting"}}
            )
            assert not updated.is_error, text_of(updated)
            missing = await session.call_tool("submit", {"output": {"summary": "x"}})
            assert missing.is_error, "the full tool needs the exact request id"
            accepted = await session.call_tool(
                "submit", {"request_id": request_id, "output": {"summary": "Tides rise."}}
            )
            assert not accepted.is_error, text_of(accepted)
            assert json.dumps(data_of(accepted))
        with raw_client(fast_server) as client:
            run = wait_run(client, run_id)
            view = run_view(client, run_id)
        assert (run["status"], view["output"]) == ("completed", {"summary": "Tides rise."})

    speak(tmp_path, body)


def test_started_in_a_terminal_it_says_what_it_is_instead_of_waiting_silently(
    tmp_path: Path,
) -> None:
    from piwf.cli.mcp import TERMINAL_NOTE

    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "piwf", "mcp"],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PIWF_HOME": str(tmp_path / "home")},
        text=True,
    )
    os.close(terminal)
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "terminal", "version": "0"},
        },
    }
    try:
        # Typed at the terminal: the answer on stdout shows the note was written before it.
        os.write(controller, json.dumps(initialize).encode() + b"\n")
        assert process.stdout is not None
        assert json.loads(process.stdout.readline())["id"] == 1
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=30)
        os.close(controller)
    assert errors.startswith(TERMINAL_NOTE + "\n"), errors


def test_an_idempotency_key_holds_across_restarts_of_piwf_mcp(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A model retries with its key after the MCP client restarted ``piwf mcp`` (the case a key
    is for: it cannot tell whether its call got through); the retry adopts the first run."""
    arguments = {"workflow": CHECKPOINT, "input": {"steps": []}, "idempotency_key": "start-1"}

    async def body(errlog: TextIO) -> None:
        started = []
        for _ in range(2):
            async with mcp_session(fast_server, errlog) as session:
                started.append(data_of(await session.call_tool("start", arguments)))
        assert started[0]["run"]["runId"] == started[1]["run"]["runId"]
        async with mcp_session(fast_server, errlog) as session:
            reused = await session.call_tool("start", {**arguments, "title": "another"})
        text = text_of(reused)
        assert reused.is_error and "a new command needs a new key" in text, text
        assert "idempotencyConflict" in text, text

    speak(tmp_path, body)
    assert query(fast_server, "SELECT COUNT(*) FROM runs", ()) == [(1,)]


def test_an_unknown_tool_is_named_safely_with_the_tools_offered(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def body(errlog: TextIO) -> None:
        async with mcp_session(fast_server, errlog) as session:
            misspelt = await session.call_tool("answr", {})
            hostile = [await session.call_tool(name, {}) for name in ("\x1b[2Jlist", "y" * 100_000)]
        async with mcp_session(fast_server, errlog, "request-bound") as session:
            bound = await session.call_tool("answer", {"request_id": "x", "response": 1})
        text = text_of(misspelt)
        assert misspelt.is_error, text
        assert "unknown tool 'answr'; this piwf mcp offers list, status, start" in text, text
        assert "nothing was done" in text, text
        assert text.endswith("(error code: unknownTool)"), text
        for result in hostile:
            text = text_of(result)
            assert result.is_error and "unknown tool (a tool name); this piwf mcp" in text, text
            assert "\x1b" not in text and len(text) < 400, text[:400]
        text = text_of(bound)
        assert bound.is_error, text
        assert "unknown tool 'answer'; this piwf mcp offers submit, update" in text, text
        assert "bound to request request-bound" in text, text

    speak(tmp_path, body)


def gated_agent_workflow(directory: Path) -> str:
    """An agent step whose validation says it started (``validating``), then holds until
    ``gate`` exists (at most 60 s), so a test can act while a ``submit`` is in flight."""
    return write_workflow(
        directory,
        "gated_agent",
        f"""
        import select
        import time
        from pathlib import Path

        from piwf.workflow import agent, compute, define_workflow

        def held(output, ctx):
            Path({str(directory / "validating")!r}).touch()
            deadline = time.monotonic() + 60
            while not Path({str(directory / "gate")!r}).exists() and time.monotonic() < deadline:
                select.select([], [], [], 0.02)
            return output

        workflow = define_workflow(
            name="gated_agent",
            start_at="ask",
            nodes={{
                "ask": agent(prompt="say ok", expected_output='{{"ok": true}}', validate=held),
                "finish": compute(lambda ctx: ctx.outputs["ask"]),
            }},
            edges=[{{"from": "ask", "to": "finish"}}],
        )
        """,
    )


def test_closing_stdin_while_a_submit_waits_ends_piwf_mcp_at_once(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The MCP client is gone: piwf mcp exits 0 without waiting for the submission's
    validation, which the server finishes all the same (the submission is durable)."""
    workflow = gated_agent_workflow(tmp_path)
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "gated")
    request_id = pending_agent_request(fast_server, run_id)
    process = subprocess.Popen(
        [sys.executable, "-m", "piwf", "mcp", "--request", request_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PIWF_HOME": str(fast_server.home)},
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        for message in (
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            },
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "submit", "arguments": {"output": {"ok": True}}},
            },
        ):
            process.stdin.write(json.dumps(message).encode() + b"\n")
            process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 1
        wait_for((tmp_path / "validating").exists, timeout_s=30, what="the validation to start")
        process.stdin.close()
        returncode = process.wait(timeout=15)
        assert not (tmp_path / "gate").exists()
    finally:
        (tmp_path / "gate").touch()
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        assert process.stderr is not None
        errors = process.stderr.read()
        process.stdout.close()
        process.stderr.close()
    assert returncode == 0
    assert b"Traceback" not in errors, errors
    with raw_client(fast_server) as client:
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert (run["status"], view["output"]) == ("completed", {"ok": True})
