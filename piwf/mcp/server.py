"""The stdio MCP server of ``piwf mcp``, on the official ``mcp`` SDK's high-level server.

Importing this module needs the optional extra (``pip install 'piwf[mcp]'``); the CLI checks
for it first. Each tool is a thin function with typed, described arguments (the SDK derives the
input schema from them) that calls :class:`~piwf.mcp.tools.WorkflowTools`. A
:class:`~piwf.mcp.tools.ToolCallError` becomes the SDK's :class:`ToolError`, so the model reads
its text as the tool's error; anything unexpected becomes a generic tool error naming only the
exception class, so no traceback or payload reaches the model or the log. Each tool's arguments
are checked by :class:`_ExactArguments`: strictly, and a text argument stays the text sent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError

from piwf._version import __version__
from piwf.client.arguments import invalid_argument_error
from piwf.mcp.tools import (
    DEFAULT_LIST_LIMIT,
    INVALID_ARGUMENT,
    MAX_LIST_LIMIT,
    ToolCallError,
    WorkflowTools,
)

_F = TypeVar("_F", bound=Callable[..., dict[str, Any]])

RunId = Annotated[str, Field(description="The exact run id, such as run-0b9c...")]
RequestId = Annotated[str, Field(description="The exact request id, from the step contract")]
OptionalRequestId = Annotated[
    str | None, Field(description="The exact request id; leave it out to use the bound one")
]
Key = Annotated[
    str | None,
    Field(description="Optional idempotency key: a repeat with the same key adopts the first"),
]
Output = Annotated[Any, Field(description="The step's result: the JSON its contract expects")]
Data = Annotated[Any, Field(description="The progress update, any JSON value")]

_READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
_CHANGE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
_DESTROY = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
ANNOTATIONS = {
    "list": _READ,
    "status": _READ,
    "start": _CHANGE,
    "pause": _CHANGE,
    "resume": _CHANGE,
    "cancel": _DESTROY,
    "answer": _CHANGE,
    "update": _CHANGE,
    "submit": _CHANGE,
}


class _WorkflowToolServer(MCPServer[Any]):
    """The SDK's server, with the short argument errors of the Python client.

    The SDK checks a call's arguments against the tool's input schema before the tool runs
    and reports a refusal with pydantic's whole dump (values and documentation links). The
    model reads here what a client call reads: each argument and what it allows.

    An argument the tool does not take is refused before the tool runs, where the SDK would
    drop it silently: a misspelt ``idempotencyKey`` would otherwise start a second run. A tool
    this process does not offer is refused naming the tools it does, where the SDK would echo
    the name as sent (control characters, any length).
    """

    def __init__(self, workflow_tools: WorkflowTools, **settings: Any) -> None:
        super().__init__("piwf", **settings)
        self._workflow_tools = workflow_tools

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        schema = self._tool_input_schema(name)
        if schema is None:
            raise ToolError(_unknown_tool(name, self._workflow_tools))
        known = list(schema.get("properties", {}))
        unknown = sorted(set(arguments) - set(known))
        if unknown:
            raise ToolError(
                f"Error executing tool {name}: invalid argument: "
                f"{', '.join(_safe_name(argument) for argument in unknown)}: not an argument"
                f" of {name}; it takes {', '.join(known)}; nothing was done"
                f" (error code: {INVALID_ARGUMENT})"
            )
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as error:
            refusal = error.__cause__
            if isinstance(error, UnexpectedToolError) or not isinstance(refusal, ValidationError):
                raise
            short = invalid_argument_error(refusal)
            raise ToolError(
                f"Error executing tool {name}: {short} (error code: {INVALID_ARGUMENT})"
            ) from refusal


class _ExactArguments(FuncMetadata):
    """The SDK's argument check, without two liberties it takes with what the model sent.

    - A text argument (``str`` or ``str | None``: ``title``, ``project``, ``idempotency_key``,
      a bound ``request_id``) stays the text sent. The SDK reads a string as JSON for every
      argument not annotated plain ``str``, so a title ``"null"`` would vanish and a key
      ``"[1]"`` be refused as not a string.
    - Validation is strict: ``limit: true``, ``"5"`` or ``2.0`` is refused, not read as 1, 5
      or 2.

    A JSON-valued argument (``input``, ``output``, ``response``, ``data``) keeps the SDK's
    reading, which docs/MCP.md states: a string holding a JSON object or array is that object
    or array, since some clients send every object as a string.
    """

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        parsed = super().pre_parse_json(data)
        text = {
            name
            for name, field in self.arg_model.model_fields.items()
            if field.annotation is str or str in get_args(field.annotation)
        }
        return {key: data[key] if key in text else value for key, value in parsed.items()}

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        arguments = self.pre_parse_json(arguments_to_validate)
        return self.arg_model.model_validate(arguments, strict=True).model_dump_one_level()

    async def call_fn(
        self,
        fn: Callable[..., Any],
        fn_is_async: bool,
        arguments: dict[str, Any],
        arguments_to_pass_directly: dict[str, Any] | None = None,
    ) -> Any:
        """Run a tool on a worker thread that a cancelled call leaves behind.

        The SDK cancels the calls in flight when the MCP client closes stdin; a tool waiting
        on the piwf server (a ``submit`` waits for its validation) would otherwise hold the
        process until the server answers. What the call sent is durable on the server either
        way, and :func:`serve` closes the client, which ends the abandoned wait.
        """
        if fn_is_async:
            return await super().call_fn(fn, fn_is_async, arguments, arguments_to_pass_directly)
        call = functools.partial(fn, **arguments, **(arguments_to_pass_directly or {}))
        return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)

    @classmethod
    def of(cls, tool: Tool) -> Tool:
        """Return ``tool`` with its arguments checked by this class."""
        metadata = tool.fn_metadata
        exact = cls(
            arg_model=metadata.arg_model,
            output_schema=metadata.output_schema,
            output_model=metadata.output_model,
            wrap_output=metadata.wrap_output,
        )
        return tool.model_copy(update={"fn_metadata": exact})


def _safe_name(argument: str, what: str = "an argument name") -> str:
    """An unknown name as the error may show it: printable ASCII, at most 64, else ``what``."""
    if len(argument) <= 64 and argument.isascii() and argument.isprintable():
        return repr(argument)
    return what


def _unknown_tool(name: str, tools: WorkflowTools) -> str:
    """The refusal of a tool ``name`` this process does not offer: the tools it does."""
    text = (
        f"unknown tool {_safe_name(name, '(a tool name)')}; this piwf mcp offers "
        f"{', '.join(tools.names())}"
    )
    if tools.bound_request is not None:
        text += (
            f" (it is bound to request {tools.bound_request}: submit its output, or record"
            " progress with update)"
        )
    return text + "; nothing was done (error code: unknownTool)"


def build_server(tools: WorkflowTools) -> MCPServer[Any]:
    """Return the MCP server offering ``tools.names()`` with their model-facing descriptions."""
    functions = _functions(tools)
    return _WorkflowToolServer(
        tools,
        instructions=tools.instructions(),
        version=__version__,
        # Tool failures are the model's to read, not the log's: keep stderr to warnings.
        log_level="WARNING",
        tools=[
            _ExactArguments.of(
                Tool.from_function(
                    functions[name],
                    name=name,
                    description=tools.description(name),
                    annotations=ANNOTATIONS[name],
                )
            )
            for name in tools.names()
        ],
    )


def serve(*, request_id: str | None = None, home: Path | None = None) -> None:
    """Serve the workflow tool on stdin/stdout until the MCP client closes the stream."""
    tools = WorkflowTools.connect(home, bound_request=request_id)
    try:
        build_server(tools).run("stdio")
    finally:
        tools.client.close()


def _tool(function: _F) -> _F:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return function(*args, **kwargs)
        except ToolCallError as error:
            raise ToolError(str(error)) from None
        except Exception as error:
            # The text of an unexpected error may hold a payload; only its class goes out.
            raise ToolError(
                f"piwf mcp failed unexpectedly ({type(error).__name__}); nothing more is shown"
            ) from None

    return call  # type: ignore[return-value]


def _functions(tools: WorkflowTools) -> dict[str, Callable[..., dict[str, Any]]]:
    """One described function per tool; the SDK builds each input schema from its signature."""

    @_tool
    def list_tool(
        limit: Annotated[
            int, Field(ge=1, le=MAX_LIST_LIMIT, description="How many recent runs to list")
        ] = DEFAULT_LIST_LIMIT,
    ) -> dict[str, Any]:
        return tools.list_all(limit)

    @_tool
    def status(run_id: RunId) -> dict[str, Any]:
        return tools.status(run_id)

    @_tool
    def start(
        workflow: Annotated[str, Field(description="A workflow name or a workflow file path")],
        input: Annotated[Any, Field(description="The run's JSON input")] = None,
        project: Annotated[str | None, Field(description="The project directory")] = None,
        title: Annotated[str | None, Field(description="A label for the run")] = None,
        idempotency_key: Key = None,
    ) -> dict[str, Any]:
        return tools.start(workflow, input, project, title, idempotency_key)

    @_tool
    def pause(run_id: RunId, idempotency_key: Key = None) -> dict[str, Any]:
        return tools.pause(run_id, idempotency_key)

    @_tool
    def resume(run_id: RunId, idempotency_key: Key = None) -> dict[str, Any]:
        return tools.resume(run_id, idempotency_key)

    @_tool
    def cancel(run_id: RunId, idempotency_key: Key = None) -> dict[str, Any]:
        return tools.cancel(run_id, idempotency_key)

    @_tool
    def answer(
        request_id: RequestId,
        response: Annotated[Any, Field(description="The answer, any JSON value")],
        idempotency_key: Key = None,
    ) -> dict[str, Any]:
        return tools.answer(request_id, response, idempotency_key)

    update, submit = (_bound_agent_functions if tools.bound_request else _agent_functions)(tools)
    return {
        "list": list_tool,
        "status": status,
        "start": start,
        "pause": pause,
        "resume": resume,
        "cancel": cancel,
        "answer": answer,
        "update": update,
        "submit": submit,
    }


_AgentFunctions = tuple[Callable[..., dict[str, Any]], Callable[..., dict[str, Any]]]


def _agent_functions(tools: WorkflowTools) -> _AgentFunctions:
    """``update`` and ``submit`` of the full tool: the request id is required."""

    @_tool
    def update(request_id: RequestId, data: Data, idempotency_key: Key = None) -> dict[str, Any]:
        return tools.update(data, request_id, idempotency_key)

    @_tool
    def submit(
        request_id: RequestId, output: Output, idempotency_key: Key = None
    ) -> dict[str, Any]:
        return tools.submit(output, request_id, idempotency_key)

    return update, submit


def _bound_agent_functions(tools: WorkflowTools) -> _AgentFunctions:
    """``update`` and ``submit`` bound to one request: its id may be left out."""

    @_tool
    def update(
        data: Data, request_id: OptionalRequestId = None, idempotency_key: Key = None
    ) -> dict[str, Any]:
        return tools.update(data, request_id, idempotency_key)

    @_tool
    def submit(
        output: Output, request_id: OptionalRequestId = None, idempotency_key: Key = None
    ) -> dict[str, Any]:
        return tools.submit(output, request_id, idempotency_key)

    return update, submit
