"""The workflow tool's actions over :class:`piwf.client.Client`, and what a model reads of them.

=========  =========================================  ======================================
tool       arguments                                  returns
=========  =========================================  ======================================
list       limit?                                     recent runs and every pending request
status     run_id                                     the run, what it waits on, its result
start      workflow, input?, project?, title?, key?   the new run
pause      run_id, key?                               the run
resume     run_id, key?                               the run
cancel     run_id, key?                               the run
answer     request_id, response, key?                 the answer's receipt (checkpoints only)
update     data, request_id?, key?                    the update's receipt (agent requests)
submit     output, request_id?, key?                  the submission's outcome (agent requests)
=========  =========================================  ======================================

``key`` is an optional idempotency key: the same call repeated with the same key adopts the
first outcome instead of acting twice. Every failure is a :class:`ToolCallError` whose text is
the server's own message and error code, or a message naming the argument and rule; it never
carries payload values, tokens or a traceback. ``answer`` goes through ``checkpoint.answer``,
which a protected human decision refuses: only a person answers one (``piwf answer``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from piwf.canonical import JsonValue
from piwf.client import Client
from piwf.client.arguments import invalid_argument_error
from piwf.errors import CommandError, NotAgentRequestError, PiwfError

#: Values larger than this (encoded) stay out of ``status`` and ``list`` results.
STATUS_CONTENT_LIMIT: Final = 64 * 1024
DEFAULT_LIST_LIMIT: Final = 20
MAX_LIST_LIMIT: Final = 200
#: The client id of every ``piwf mcp`` of a state home. The server keeps receipts by client id
#: and idempotency key, so one id for all of them is what lets a model's retry with its key
#: adopt the first outcome after the MCP client restarted ``piwf mcp`` (a fresh id per process
#: would act twice); a key reused for another command is refused (``idempotencyConflict``).
CLIENT_ID: Final = "mcp"

_T = TypeVar("_T")

SERVER_INSTRUCTIONS = (
    "piwf runs durable Python workflows. Use `list` to see runs and pending requests, `status` "
    "for one run, `start`/`pause`/`resume`/`cancel` to control runs, `answer` to answer a "
    "checkpoint, and `update`/`submit` for an agent step you were asked to complete (the step "
    "contract in your prompt names the exact request id). Protected human decisions cannot be "
    "answered here; a person answers them with `piwf answer`."
)
BOUND_INSTRUCTIONS = (
    "You are completing one piwf workflow step. Call `submit` exactly once with your result "
    "(the output the step contract describes); `update` records progress without completing the "
    "step. A rejected submission tells you what to fix: correct it and submit again."
)

DESCRIPTIONS: Final[dict[str, str]] = {
    "list": (
        "List recent workflow runs (newest first) and every request that waits for an answer. "
        "Pass `limit` (1-200, default 20) for more runs. Returns {runs: [{runId, workflowName, "
        "status, displayStatus, paused, needsAction, ...}], requests: [{requestId, runId, kind, "
        "path, choices, inputs, ...}]}; a 'checkpoint' is answered with `answer`, an 'agent' "
        "request with `submit`, and a 'human_decision' only by a person."
    ),
    "status": (
        "Show one run by its `run_id`: its status, the request it waits on (`waitingOn`, with "
        "the request id, kind and content), its effects and decisions, and its output or error "
        "once it has finished. Large values are left out as `...Ref` entries."
    ),
    "start": (
        "Start a workflow run. `workflow` is a discovered workflow name or a path to a workflow "
        "file (relative paths resolve against the directory piwf mcp runs in); `input` is the "
        "run's JSON input; `project` the project directory, which must exist (default: that same "
        "directory); "
        "`title` an optional label; `idempotency_key` makes a repeated call return the first "
        "run instead of starting another. Returns {run: {runId, status, ...}}."
    ),
    "pause": (
        "Pause the run `run_id`: it stops at its last durable step and waits until resumed. "
        "Returns {run, outcome: changed | unchanged} (`unchanged`: it was paused already)."
    ),
    "resume": (
        "Resume the paused or parked run `run_id` from its last durable step. Returns {run, "
        "outcome: changed | unchanged} (`unchanged`: it was neither paused nor parked)."
    ),
    "cancel": (
        "Cancel the run `run_id` for good (it ends 'cancelled'; a finished run cannot be "
        "cancelled). Returns {run, outcome: changed | unchanged} (`unchanged`: it was "
        "cancelled already)."
    ),
    "answer": (
        "Answer the checkpoint request `request_id` with `response` (any JSON value the "
        "checkpoint asks for). Only checkpoints: a protected human decision is refused, since "
        "only a person may answer it (`piwf answer`), and an agent step takes `submit`. The "
        "first valid answer wins; returns {requestId, runId, outcome: won | adopted | "
        "already_resolved, resolution}."
    ),
    "update": (
        "Record a progress update for the agent request `request_id` without completing it; "
        "`data` is any JSON value (for example {status, completed, total}). Returns the update's "
        "receipt."
    ),
    "submit": (
        "Complete the agent request `request_id` with `output`, the JSON value the step's "
        "expected output describes. The call waits until the output has been validated: an "
        "accepted submission completes the step; a rejected one comes back as an error whose "
        "text says what to fix (the request stays open, so submit a corrected output). Returns "
        "the submission's receipt."
    ),
}
BOUND_NOTE = " `request_id` may be left out: this tool is bound to request {request_id}."


#: The code of a refusal of a tool's arguments, as the client's own (``invalidArgument``).
INVALID_ARGUMENT = "invalidArgument"


class ToolCallError(Exception):
    """A tool call failed; ``str()`` is the text the model reads."""


def refused_argument(text: str) -> ToolCallError:
    """A refusal of an argument: ``text`` (the argument and its rule, never its value) with
    the error code every refusal ends with."""
    return ToolCallError(f"{text} (error code: {INVALID_ARGUMENT})")


class WorkflowTools:
    """The tool actions of one ``piwf mcp`` process, over one client.

    With ``bound_request`` only :meth:`update` and :meth:`submit` are offered (see
    :meth:`names`), each for that request only.
    """

    def __init__(self, client: Client, *, bound_request: str | None = None) -> None:
        self.client = client
        self.bound_request = bound_request

    @classmethod
    def connect(
        cls, home: Path | None = None, *, bound_request: str | None = None
    ) -> WorkflowTools:
        """Return the tools over a fresh client of ``home`` (default ``$PIWF_HOME``), under
        :data:`CLIENT_ID`."""
        client = Client(home, client_id=CLIENT_ID)
        return cls(client, bound_request=bound_request)

    def names(self) -> tuple[str, ...]:
        """Return the names of the tools this process offers, in the order they are listed."""
        if self.bound_request is not None:
            return ("submit", "update")
        return (
            "list",
            "status",
            "start",
            "pause",
            "resume",
            "cancel",
            "answer",
            "update",
            "submit",
        )

    def description(self, name: str) -> str:
        """Return what the model reads about tool ``name``."""
        text = DESCRIPTIONS[name]
        if self.bound_request is not None and name in ("submit", "update"):
            text += BOUND_NOTE.format(request_id=self.bound_request)
        return text

    def instructions(self) -> str:
        """Return the server instructions for this mode."""
        if self.bound_request is not None:
            return f"{BOUND_INSTRUCTIONS} Your request id is {self.bound_request}."
        return SERVER_INSTRUCTIONS

    # -- the tools -------------------------------------------------------------------------

    def list_all(self, limit: int = DEFAULT_LIST_LIMIT) -> dict[str, Any]:
        """Recent runs and every pending request (content left out)."""
        if isinstance(limit, bool) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise refused_argument(f"limit must be an integer in 1..{MAX_LIST_LIMIT}")
        page = _call(lambda: self.client.list_runs(limit=limit))
        requests = _call(lambda: self.client.list_requests(content_limit=0))
        return {
            "runs": [run.to_wire() for run in page.runs],
            "requests": [
                {k: v for k, v in item.to_wire().items() if k not in ("content", "contentRef")}
                for item in requests
            ],
        }

    def status(self, run_id: str) -> dict[str, Any]:
        """One run's view; values beyond :data:`STATUS_CONTENT_LIMIT` stay references."""
        detail = _call(lambda: self.client.get_run(run_id, content_limit=STATUS_CONTENT_LIMIT))
        return detail.to_wire()

    def start(
        self,
        workflow: str,
        input: JsonValue = None,
        project: str | None = None,
        title: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Start a run; relative paths resolve against this process's working directory. A
        ``project`` that is not an existing directory is refused, as ``piwf run start
        --project`` refuses it (a run there would find no workflows and run its nodes
        elsewhere)."""
        if project and not Path(project).is_dir():
            raise refused_argument(
                "project must be an existing directory (the one holding .piwf/), or left out"
                " to use the directory piwf mcp runs in"
            )
        run = _call(
            lambda: self.client.start_run(
                workflow,
                input=input,
                project=Path(project) if project else None,
                title=title,
                idempotency_key=idempotency_key,
            )
        )
        return {"run": run.to_wire()}

    def pause(self, run_id: str, idempotency_key: str | None = None) -> dict[str, Any]:
        """Pause a run."""
        receipt = _call(
            lambda: self.client.run_control_receipt(
                "pause", run_id, idempotency_key=idempotency_key
            )
        )
        return {"run": receipt.run.to_wire(), "outcome": receipt.outcome}

    def resume(self, run_id: str, idempotency_key: str | None = None) -> dict[str, Any]:
        """Resume a run."""
        receipt = _call(
            lambda: self.client.run_control_receipt(
                "resume", run_id, idempotency_key=idempotency_key
            )
        )
        return {"run": receipt.run.to_wire(), "outcome": receipt.outcome}

    def cancel(self, run_id: str, idempotency_key: str | None = None) -> dict[str, Any]:
        """Cancel a run."""
        receipt = _call(
            lambda: self.client.run_control_receipt(
                "cancel", run_id, idempotency_key=idempotency_key
            )
        )
        return {"run": receipt.run.to_wire(), "outcome": receipt.outcome}

    def answer(
        self, request_id: str, response: JsonValue, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Answer a checkpoint as a client (``checkpoint.answer``), never as a person."""
        receipt = _call(
            lambda: self.client.answer(
                request_id, response, idempotency_key=idempotency_key, as_human=False
            )
        )
        return receipt.to_wire()

    def update(
        self,
        data: JsonValue,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Record a progress update of an agent request."""
        target = self._request(request_id)
        client = self.client
        return _wire(
            self._agent_call(
                target, lambda: client.update(target, data, idempotency_key=idempotency_key)
            )
        )

    def submit(
        self,
        output: JsonValue,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Submit an agent request's output; a rejection is a :class:`ToolCallError`."""
        target = self._request(request_id)
        client = self.client
        return _wire(
            self._agent_call(
                target, lambda: client.submit(target, output, idempotency_key=idempotency_key)
            )
        )

    # -- internals -------------------------------------------------------------------------

    def _agent_call(self, request_id: str, action: Callable[[], _T]) -> _T:
        """Run an ``update`` or ``submit`` of ``request_id``; a request of another kind is
        refused in this tool's terms. The server's refusal names ``piwf answer``, a person's
        command: a model must answer a checkpoint with the ``answer`` tool, and never a
        protected human decision, which only a person settles."""
        try:
            return _call(action, passing=NotAgentRequestError.code)
        except CommandError:  # only the passing code comes out as such
            pass
        kinds = {
            item.request_id: item.kind
            for item in _call(lambda: self.client.list_requests(content_limit=0))
        }
        kind = kinds.get(request_id)
        if kind == "checkpoint":
            what = f"a checkpoint: answer it with the `answer` tool (request_id {request_id})"
        elif kind == "human_decision":
            what = (
                "a protected human decision: only a person answers it (`piwf answer`); tell"
                " the user it waits for them"
            )
        else:
            what = (
                "a checkpoint or decision: a checkpoint is answered with the `answer` tool, a"
                " protected human decision only by a person"
            )
        raise ToolCallError(
            f"request {request_id} is {what}; update and submit take agent requests only;"
            f" nothing was done (error code: {NotAgentRequestError.code})"
        )

    def _request(self, request_id: str | None) -> str:
        """The request a submit or update targets: the bound one, or the one named."""
        bound = self.bound_request
        if bound is None:
            if not request_id:
                raise refused_argument(
                    "request_id is required: pass the exact request id of the agent step "
                    "(its step contract names it)"
                )
            return request_id
        if request_id is not None and request_id != bound:
            raise refused_argument(
                f"this workflow tool is bound to request {bound}; it cannot act on another "
                "request (leave request_id out)"
            )
        return bound


def _call(action: Callable[[], _T], passing: str | None = None) -> _T:
    """Run one client call; turn every failure into a :class:`ToolCallError` with a safe text,
    except a :class:`CommandError` of error code ``passing``, which the caller words itself."""
    try:
        return action()
    except CommandError as error:
        if passing is not None and error.error_code == passing:
            raise
        raise ToolCallError(f"{error} (error code: {error.error_code or error.code})") from None
    except PiwfError as error:
        raise ToolCallError(f"{error} (error code: {error.code})") from None
    except ValidationError as error:
        # An argument a payload model refused: the field and rule, never the value.
        raise refused_argument(str(invalid_argument_error(error))) from None


def _wire(value: object) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        dumped = value.model_dump(by_alias=True, exclude_none=True, mode="json")
        return dumped if isinstance(dumped, dict) else {"result": dumped}
    return value if isinstance(value, dict) else {"result": value}
