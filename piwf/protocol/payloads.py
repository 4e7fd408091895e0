"""Payloads and receipts of each ``piwf.client.v1`` operation, shared by server and client.

Wire names are camelCase; every model refuses unknown fields. The server validates each
request payload with the model of its operation before doing anything, and builds each receipt
with the receipt model, so both sides agree on one shape::

    operation        payload                                   receipt
    server.status    {}                                        ServerStatus
    server.stop      {}                                        {"stopping": true}
    run.start        {workflow, projectPath?, input?, title?}  {"run": RunInfo}
    run.list         {limit?, before?: {createdAt, runId}}     {"runs": [RunInfo], "nextCursor"?}
    run.get          {}  (runId in the envelope)               RunDetail: {"run", "sources", ...}
    run.cancel       {}  (runId in the envelope)               {"run": RunInfo}
    run.wait         {timeoutMs?}  (runId in the envelope)     {"run": RunInfo, "timedOut": bool,
                                                               "output"?, "error"?, "failure"?}
    state.status     {}                                        StateStatus
    state.verify     {}                                        {"valid": bool, "violations": [...]}
    state.backup     {destination}                             {"destination", "bytes"}
    state.prunePreview {before}                                PruneReport (applied: false)
    state.prune      {before, backup}                          PruneReport (applied: true)
    run.pause        {}  (runId in the envelope)               {"run": RunInfo}
    run.resume       {}  (runId in the envelope)               {"run": RunInfo}
    run.restart      {}  (runId in the envelope)               {"run": RunInfo}  (the new run)
    run.fork         {fromNode}  (runId in the envelope)       {"run": RunInfo}  (the new run)
    effect.resolve   {effectId, resolution, note?}             {"effect": EffectInfo, "outcome"}
    checkpoint.answer {requestId, response}                    AnswerReceipt
    decision.answer  {requestId, response}                     AnswerReceipt
    requests.list    {runId?}                                  {"requests": [OpenRequestInfo]}
    interaction.submit {requestId, output}                     SubmissionReceipt (agent_payloads)
    interaction.update {requestId, data}                       UpdateReceipt (agent_payloads)
    view.content     {ref: ContentRef, offset, length}         ContentPart

Stored values (outputs, error texts, request content, answers, resource spec and status) travel
inline while their encoded form is at most :data:`INLINE_CONTENT_BYTES` and the response's
inline budget lasts. Beyond that, the value field is absent and its ``<field>Ref`` sibling
carries a :class:`ContentRef`; the client reads the bytes with ``view.content`` in parts of at
most :data:`~piwf.config.CONTENT_PART_BYTES`, checks length and SHA-256 against the reference,
and decodes the value itself (docs/PROTOCOL.md, "Content references").
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from piwf.config import CONTENT_PART_BYTES, agent_command_problem
from piwf.protocol.client_v1 import OpaqueId
from piwf.protocol.content import MAX_CONTENT_BYTES
from piwf.protocol.display_status import RunDisplayStatus as RunDisplayStatus

MAX_WAIT_MS = 3_600_000

#: A stored value whose encoded form is at most this many bytes travels inline.
INLINE_CONTENT_BYTES = 16 * 1024
#: Encoded bytes of inline values one response may carry; later values go by reference, so
#: many medium values (a long decision audit) cannot push a response past the frame limit.
RESPONSE_INLINE_BUDGET = 384 * 1024
#: The suffix of a field that carries the reference of its sibling value (``output_ref``).
REF_SUFFIX = "_ref"

ContentScope = Literal["run", "resource"]
ContentMediaType = Literal["application/json", "text/plain"]


class WireModel(BaseModel):
    """A strict, closed model with camelCase wire names.

    Its validator is built on first use (``defer_build``), not at import: a process builds
    only the models it uses (``piwf run list`` a handful of the ~80 here and in the modules
    that extend this one), and every model still validates exactly as its fields say.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        strict=True,
        defer_build=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """Return the wire dict (aliases, unset optional fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class EmptyPayload(WireModel):
    """A payload with no fields."""


class StrictWireModel(WireModel):
    """A wire model that takes no conversions: ``"3"``, ``true`` or ``3.0`` is not an int."""

    model_config = ConfigDict(**{**WireModel.model_config, "strict": True})


class ContentRef(StrictWireModel):
    """A stored value sent by reference: the exact bytes (``sha256``, ``length``), how to
    decode them (``media_type``: canonical JSON or UTF-8 text) and whose value it is (a run id
    or a resource uid). The server serves a ``view.content`` read only while that owner still
    holds a value with these four facts."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    media_type: ContentMediaType
    length: int = Field(ge=1, le=MAX_CONTENT_BYTES)
    scope: ContentScope
    owner: str = Field(pattern=r"^[\x21-\x7e]{1,256}$")


class ContentReadPayload(StrictWireModel):
    """Read ``length`` bytes (at most one part) of a referenced value from ``offset``."""

    ref: ContentRef
    offset: int = Field(ge=0, le=MAX_CONTENT_BYTES)
    length: int = Field(ge=1, le=CONTENT_PART_BYTES)


class ContentPart(StrictWireModel):
    """Receipt of ``view.content``: the bytes at ``offset`` (base64 ``data``, at most the
    length asked for, empty only at the end), with the digest and length of the whole value."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    total: int = Field(ge=0, le=MAX_CONTENT_BYTES)
    offset: int = Field(ge=0, le=MAX_CONTENT_BYTES)
    data: str = Field(max_length=(CONTENT_PART_BYTES + 2) // 3 * 4)


def without_nul(value: str) -> str:
    """A file name cannot hold NUL: refuse it by name, before the OS refuses it obscurely."""
    if "\x00" in value:
        raise ValueError("a workflow name or a path holds no NUL character")
    return value


#: A workflow name, or the path of a file or directory, as a client sends it.
PathText = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(without_nul)]


class RunStartPayload(WireModel):
    """Start a run of a workflow named by path (absolute) or by discovered name."""

    workflow: PathText
    project_path: PathText | None = None
    input: Any = Field(default_factory=dict)
    title: str | None = Field(default=None, min_length=1, max_length=512)
    #: The run's own headless agent command (argv); wins over the node's and the server's.
    agent_command: list[str] | None = None
    #: Bind the run ``interactive`` to this origin session (docs/SESSIONS.md); None: headless.
    session: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$"
    )

    @field_validator("agent_command")
    @classmethod
    def _an_agent_command(cls, value: list[str] | None) -> list[str] | None:
        problem = None if value is None else agent_command_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class RunCursor(WireModel):
    """Position in the newest-first run list."""

    created_at: int = Field(ge=0)
    run_id: OpaqueId


class RunListPayload(WireModel):
    """One page of runs, newest first; ``status``: only runs with that display status."""

    limit: int = Field(default=50, ge=1, le=500)
    before: RunCursor | None = None
    status: RunDisplayStatus | None = None


class RunWaitPayload(WireModel):
    """Wait until the run is terminal or ``timeoutMs`` passes."""

    timeout_ms: int = Field(default=30_000, ge=0, le=MAX_WAIT_MS)


class RunForkPayload(WireModel):
    """Fork the run in the envelope from node ``fromNode`` (its full path, as steps show it)."""

    from_node: str = Field(min_length=1, max_length=1024)


class RunInfo(WireModel):
    """A run as clients see it: no input, output, actor ids or tokens."""

    run_id: str
    workflow_ref: str
    workflow_name: str
    title: str | None = None
    status: str
    display_status: str
    paused: bool
    status_detail: str | None = None
    queue_status: str | None = None
    error_code: str | None = None
    #: True while the run will not go on until someone acts (resume, resolve an effect).
    needs_action: bool = False
    #: True while a checkpoint or protected decision of the run waits for a person's answer
    #: (the run view's activity ``waitingForPerson``; never while paused).
    waiting_for_person: bool = False
    #: How the run came to exist: ``root``, ``restart`` or ``fork`` (of ``parentRunId``).
    lineage: str = "root"
    parent_run_id: str | None = None
    root_run_id: str
    restart_number: int
    definition_digest: str
    revision: int
    created_at: int
    updated_at: int
    finished_at: int | None = None


class RunSource(WireModel):
    """The root (``mountPath`` ``""``) or a mount of a run: how it named its workflow and the
    file that resolved to (``referenceKind``: path, name, builtin or definition)."""

    mount_path: str
    reference_kind: str
    reference: str
    source_type: str
    source_ref: str
    source_revision: str
    piwf_version: str | None = None


class RunReceipt(WireModel):
    """Receipt of run.start, run.cancel, run.pause, run.resume, run.restart and run.fork: the
    run as it is now (for a restart or a fork, the new run), and ``outcome``: ``changed`` when
    this request changed it, ``unchanged`` when there was nothing to do (a cancel of a run
    already cancelled, a pause of a run already paused, a resume of a run neither paused nor
    parked by an error, a restart of a run already restarted: ``run`` is then that restart).
    A receipt without ``outcome`` (from a server before it) reads as ``changed``."""

    run: RunInfo
    outcome: Literal["changed", "unchanged"] = "changed"


class EffectInfo(WireModel):
    """One managed effect of a run (no request or result payloads)."""

    effect_id: str
    effect_type: str
    recovery: str
    status: str
    attempt_count: int


class ChoiceInputInfo(WireModel):
    """The text input a decision's choice carries: the answer holds it under ``name``."""

    kind: Literal["text"]
    name: str
    prompt: str
    max_chars: int


class ActiveTimeInfo(WireModel):
    """Where an agent request's active-time deadline stands (docs/AGENTS.md "Deadlines").

    ``timeout_ms`` is the budget, ``active_ms`` the active time used so far and
    ``remaining_ms`` what is left; ``counting`` is true while its agent works (the remainder
    shrinks with the clock) and ``due_at`` then says when it runs out if the agent keeps
    working. While nothing works, nothing is charged and ``due_at`` is absent.
    """

    timeout_ms: int
    active_ms: int
    remaining_ms: int
    counting: bool
    due_at: int | None = None


class OpenRequestInfo(WireModel):
    """A pending request (checkpoint, decision or agent step): what a waiting run waits on.

    An agent request's ``content`` holds its ``prompt`` (ending with the step contract) and
    ``expectedOutput``; ``timeout_ms`` is its active-time budget, ``latest_rejection`` the error
    of its last rejected submission and ``submissions`` how many were made.
    ``active_time`` is set for an agent request that has a deadline; ``session`` for a request of
    an interactive run; ``run_paused`` while its run is paused (nothing settles it until then).
    """

    request_id: str
    run_id: str
    kind: str
    path: str
    visit: int
    content: Any = None
    content_ref: ContentRef | None = None
    choices: dict[str, str] | None = None
    #: The choices that carry a text input, each with it; None when none does.
    inputs: dict[str, ChoiceInputInfo] | None = None
    deadline_at: int | None = None
    has_default: bool = False
    created_at: int
    timeout_ms: int | None = None
    latest_rejection: str | None = None
    latest_rejection_ref: ContentRef | None = None
    submissions: int = 0
    active_time: ActiveTimeInfo | None = None
    #: The origin session of an interactive run: its agent requests are answered through that
    #: session's host (``piwf session attach``), not by ``piwf submit``. None for a headless run.
    session: str | None = None
    #: The request's run is paused: answers, submissions and updates are refused until
    #: ``piwf run resume RUN_ID``.
    run_paused: bool = False


class ResolutionInfo(WireModel):
    """The one winner of a decision: provenance, response (accepted) or reason (cancelled)."""

    decision_id: str
    outcome: Literal["accepted", "cancelled"]
    provenance: str
    response: Any = None
    response_ref: ContentRef | None = None
    reason: str | None = None
    actor_type: str
    resolved_at: int


class SubmissionInfo(WireModel):
    """One candidate answer of a decision and what became of it."""

    source: str
    outcome: str
    response: Any = None
    response_ref: ContentRef | None = None
    reason: str | None = None
    submitted_at: int


class DecisionInfo(WireModel):
    """The audit of one checkpoint or decision of a run: its newest ``submissions``, oldest
    first, of ``submission_count``."""

    decision_id: str
    kind: str
    choices: dict[str, str] | None = None
    inputs: dict[str, ChoiceInputInfo] | None = None
    deadline_at: int | None = None
    has_default: bool = False
    resolution: ResolutionInfo | None = None
    submissions: list[SubmissionInfo] = Field(default_factory=list)
    submission_count: int = 0


class AgentSubmissionInfo(WireModel):
    """One output submitted for an agent request: as sent (``output``), as accepted
    (``value``, normalised by ``validate``) or why it was refused (``error``)."""

    submission_id: str
    outcome: Literal["validating", "accepted", "rejected"]
    output: Any = None
    output_ref: ContentRef | None = None
    value: Any = None
    value_ref: ContentRef | None = None
    error: str | None = None
    error_ref: ContentRef | None = None
    submitted_at: int
    settled_at: int | None = None


class AgentRequestInfo(WireModel):
    """One agent request of a run (``status``: pending, answered, settled, cancelled, or
    expired when its active-time deadline closed it) and the newest ``submissions`` made for
    it, oldest first, of ``submission_count``."""

    request_id: str
    path: str
    visit: int
    status: str
    submissions: list[AgentSubmissionInfo] = Field(default_factory=list)
    submission_count: int = 0


class AgentProcessInfo(WireModel):
    """The live headless agent command of a run's agent step (docs/AGENTS.md): its pid, which
    turn of its request it is, and when it was registered."""

    pid: int
    request_id: str
    turn: int
    registered_at: int


#: How a failed node visit ended (``piwf.workflow.failure.FailureKind``; a test compares them).
FailureKindName = Literal["exception", "exit", "timedOut", "cancelled", "reported"]
#: How a failed visit ended (the failure values of ``piwf.workflow.context.Outcome``).
FailedOutcome = Literal["failed", "timed_out", "cancelled"]


class NodeFailureInfo(WireModel):
    """Why the node that ended a run failed: its attempt's failure record (docs/PROTOCOL.md,
    "Failure records").

    ``kind`` ``exception`` has ``error_type``, ``message`` and ``traceback`` (frames newest
    last, as Python prints them, without the final ``Type: message`` line); ``exit`` a shell
    command's ``exit_code`` or ``signal`` and the end of its stderr (``stderr_tail``);
    ``timedOut``, ``cancelled`` and ``reported`` a ``message`` only. The engine bounds every
    text (message 4 KiB, traceback 32 frames and 16 KiB, stderr 20 lines and 2 KiB); a
    ``*_cut`` flag says that text was cut.
    """

    path: str
    visit: int
    attempt: int
    outcome: FailedOutcome
    kind: FailureKindName
    message: str
    error_type: str | None = None
    message_cut: bool = False
    traceback: str | None = None
    traceback_cut: bool = False
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: str | None = None
    stderr_cut: bool = False


class SettingsSummary(WireModel):
    """A live-settings scope of a run: the workflow at ``mountPath`` (``""``: the run's own) on
    its ``invocation``-th entry, at change ``changeNumber`` (``run.settings`` has the value)."""

    mount_path: str
    invocation: int
    change_number: int


class RunDetail(WireModel):
    """Receipt of run.get: the run, its sources, effects, and its final output or error.

    ``waiting_on`` is the pending request of a waiting run; ``decisions`` the audit of its
    newest checkpoints and decisions. A large output or error comes as ``output_ref`` /
    ``error_ref`` instead (the client resolves it). ``failure`` is the failure record of the
    node that ended a failed, timed-out or cancelled run (None when no node's failure ended
    it, for example a routing error or a cancel between nodes).
    """

    run: RunInfo
    sources: list[RunSource]
    #: Every unsettled effect (pending, applying, ambiguous) and the newest 50, in the order
    #: they were reserved; ``effect_count`` counts them all (None from an older server).
    effects: list[EffectInfo] = Field(default_factory=list)
    effect_count: int | None = None
    output: Any = None
    output_ref: ContentRef | None = None
    error: str | None = None
    error_ref: ContentRef | None = None
    waiting_on: OpenRequestInfo | None = None
    #: The newest 50 checkpoints and decisions, and agent requests with submissions, oldest
    #: first (the pending one among them); the counts say how many (None: an older server).
    decisions: list[DecisionInfo] = Field(default_factory=list)
    decision_count: int | None = None
    agent_requests: list[AgentRequestInfo] = Field(default_factory=list)
    agent_request_count: int | None = None
    #: Why the run is parked, as stored with its queue error (``run.errorCode``): the broken
    #: protocol rule, the crash count, the changed files. None when there is nothing to say.
    parked_reason: str | None = None
    #: The agent command running for its agent step now, if any.
    agent_process: AgentProcessInfo | None = None
    failure: NodeFailureInfo | None = None
    #: The origin session of an interactive run (None: the run is headless).
    session: str | None = None
    #: The newest 50 live-settings scopes, by mount path and entry; ``settingsCount`` says how
    #: many the run has (None from an older server).
    settings: list[SettingsSummary] = Field(default_factory=list)
    settings_count: int | None = None


class AnswerPayload(WireModel):
    """An answer to one exact request (``checkpoint.answer`` / ``decision.answer``)."""

    request_id: OpaqueId
    response: Any = None
    coordinator_epoch: str | None = Field(default=None, max_length=256)


class AnswerReceipt(WireModel):
    """Receipt of an answer: ``won`` (this answer settled the request), ``adopted`` (equal to
    the winner) or ``already_resolved`` (another winner exists); the winner comes back."""

    request_id: str
    run_id: str
    outcome: Literal["won", "adopted", "already_resolved"]
    resolution: ResolutionInfo


#: The most pending requests one ``requests.list`` answer (one frame) carries.
REQUEST_PAGE = 200


class RequestCursor(WireModel):
    """Position in the oldest-first list of pending requests (the last one a page held)."""

    created_at: int = Field(ge=0)
    request_id: OpaqueId


class RequestsListPayload(WireModel):
    """List pending requests, of one run or of all runs, oldest first, a page at a time:
    ``after`` is the ``next_cursor`` of the page before."""

    run_id: str | None = Field(default=None, min_length=1, max_length=256)
    limit: int = Field(default=REQUEST_PAGE, ge=1, le=REQUEST_PAGE)
    after: RequestCursor | None = None


class RequestList(WireModel):
    """Receipt of requests.list, oldest first; ``next_cursor`` is set while more follow."""

    requests: list[OpenRequestInfo]
    next_cursor: RequestCursor | None = None


class EffectResolvePayload(WireModel):
    """An operator's decision about an ambiguous effect, recorded as an event."""

    effect_id: OpaqueId
    resolution: Literal["applied", "retry"]
    note: str | None = Field(default=None, max_length=1000)


class EffectReceipt(WireModel):
    """Receipt of effect.resolve: the effect as it is now, and ``outcome``: ``resolved`` when
    this request settled or retried it, ``unchanged`` when there was nothing to resolve (the
    same resolution again, or a retry of an effect already pending or applying again).
    A receipt without ``outcome`` (from a server before it) reads as ``resolved``."""

    effect: EffectInfo
    outcome: Literal["resolved", "unchanged"] = "resolved"


class RunPage(WireModel):
    """Receipt of run.list."""

    runs: list[RunInfo]
    next_cursor: RunCursor | None = None


class RunWaitReceipt(WireModel):
    """Receipt of run.wait: the run and, once it is terminal, its final output or error (or
    their references, as in :class:`RunDetail`) and the ``failure`` of the node that ended
    it. A run that needs an operator (``run.needsAction``: paused, or parked until someone
    acts) ends the wait too, with ``timedOut`` false and ``parkedReason`` saying why (its
    stored reason, when it has one)."""

    run: RunInfo
    timed_out: bool
    parked_reason: str | None = None
    output: Any = None
    output_ref: ContentRef | None = None
    error: str | None = None
    error_ref: ContentRef | None = None
    failure: NodeFailureInfo | None = None


class ServerStatus(WireModel):
    """Privacy-safe server status: the process id and counts, never a payload or a path."""

    state: str
    epoch: int
    #: The server process's id (as ``piwf server start`` printed it).
    pid: int
    package_version: str
    socket_available: bool
    max_workers: int
    active_runners: int
    connections: int
    #: Runs that will start by themselves (admitted, or parked resumable, maybe backing off).
    queued_runs: int
    #: Runs a runner is starting or executing.
    running_runs: int
    #: Runs waiting for an answer to a pending request.
    waiting_runs: int
    #: Runs stopped until an operator acts, in total and by reason (``paused`` or a blocking
    #: failure class such as ``runnerNoProgress``, ``sourceChanged``, ``effectAmbiguous``).
    parked_runs: int
    parked_by_reason: dict[str, int]
    #: Paused runs, whatever their state.
    paused_runs: int
    expired_claims: int
    pending_interactions: int
    #: Pending agent requests that have an active-time deadline (counting or not).
    agent_deadlines: int
    ambiguous_effects: int


class StopReceipt(WireModel):
    """Receipt of server.stop."""

    stopping: bool
