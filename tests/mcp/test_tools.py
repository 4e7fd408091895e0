"""The workflow tool's actions without the MCP SDK: binding to one request, safe error texts.

``WorkflowTools`` holds a real :class:`piwf.client.Client` of a home where no server runs (and
autostart is off), so a call that reaches the client fails the way a user would see it, and a
refusal that must happen before any client call is told apart by its text.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.mcp.tools import DESCRIPTIONS, ToolCallError, WorkflowTools
from piwf.workflow.contract import step_contract

FULL = ("list", "status", "start", "pause", "resume", "cancel", "answer", "update", "submit")


def tools(tmp_path: Path, bound: str | None = None) -> WorkflowTools:
    client = Client(tmp_path / "home", client_id="mcp-test", autostart=False)
    return WorkflowTools(client, bound_request=bound)


def test_the_full_tool_offers_every_action_and_the_bound_one_only_update_and_submit(
    tmp_path: Path,
) -> None:
    assert tools(tmp_path).names() == FULL
    assert set(DESCRIPTIONS) == set(FULL)
    bound = tools(tmp_path, "request-7")
    assert bound.names() == ("submit", "update")
    assert "bound to request request-7" in bound.description("submit")
    assert "request-7" in bound.instructions()
    assert "request-7" not in tools(tmp_path).description("submit")


def test_a_bound_tool_refuses_another_request_before_reaching_the_server(tmp_path: Path) -> None:
    bound = tools(tmp_path, "request-7")
    for call in (
        lambda: bound.submit({"ok": True}, "request-8"),
        lambda: bound.update({"ok": True}, "request-8"),
    ):
        with pytest.raises(ToolCallError) as info:
            call()
        assert "bound to request request-7; it cannot act on another request" in str(info.value)
        assert str(info.value).endswith("(error code: invalidArgument)")


def test_the_full_tool_needs_the_exact_request_id(tmp_path: Path) -> None:
    with pytest.raises(
        ToolCallError, match=r"request_id is required.*\(error code: invalidArgument\)$"
    ):
        tools(tmp_path).submit({"ok": True})


def test_client_failures_come_back_as_their_message_and_code(tmp_path: Path) -> None:
    with pytest.raises(ToolCallError) as info:
        tools(tmp_path).status("run-1")
    text = str(info.value)
    assert "no piwf server is running" in text and "(error code: serverUnavailable)" in text
    assert "Traceback" not in text


def test_an_argument_the_payload_model_refuses_is_named_without_its_value(tmp_path: Path) -> None:
    title = "secret-title-" + "x" * 600
    with pytest.raises(ToolCallError) as info:
        tools(tmp_path).start("flow.py", title=title)
    assert "invalid argument: title" in str(info.value)
    assert "secret-title" not in str(info.value)


def test_a_project_that_is_no_directory_is_refused_before_reaching_the_server(
    tmp_path: Path,
) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text("")
    for project in (tmp_path / "missing", flow):
        with pytest.raises(ToolCallError, match="project must be an existing directory"):
            tools(tmp_path).start(str(flow), project=str(project))
    # An existing directory goes on to the client (here: no server runs).
    with pytest.raises(ToolCallError, match="serverUnavailable"):
        tools(tmp_path).start(str(flow), project=str(tmp_path))


def test_list_checks_its_limit(tmp_path: Path) -> None:
    for limit in (0, 201, True):
        with pytest.raises(ToolCallError, match="limit must be an integer in 1..200"):
            tools(tmp_path).list_all(limit)


def test_the_step_contract_names_the_submit_tools_own_arguments() -> None:
    """An agent that calls the tool exactly as its prompt's contract says is not refused."""
    contract = step_contract(
        workflow="w",
        path="ask",
        attempt_id="attempt-1",
        request_id="request-9",
        expected_output="x",
    )
    shown = re.search(r"`submit` tool of `piwf mcp` with (\{.*\})", contract)
    assert shown is not None
    arguments = json.loads(shown.group(1).replace("<your output>", "null"))
    assert arguments["request_id"] == "request-9"
    assert set(arguments) <= set(inspect.signature(WorkflowTools.submit).parameters)
