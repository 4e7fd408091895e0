"""``piwf.run-view.v1``: the one document every renderer of a run uses (docs/OBSERVING.md).

``view.run.get`` answers a :class:`RunView`: the run's bounded projection (the same
:class:`~piwf.protocol.payloads.RunDetail` as ``run.get``), a :class:`Display` the server
derives once, and the first page of its steps. ``view.page`` answers the next
:class:`StepPage` after a cursor. Renderers show ``display`` as it is: they never combine other
queries or derive a status of their own. Values above the inline threshold (16 KiB), and any
that would push one answer past its byte budget, come as content references read with
``view.content``.

Display status (closed set, the seed's precedence)::

    completed | failed | timed_out | cancelled   a terminal run (keeps its label)
    ambiguous                                    an effect piwf could not prove
    paused                                       a durable pause
    waiting                                      a pending request
    running                                      a runner executes it
    queued                                       admitted or parked, not executing

``activity`` says what is happening independently of the status: ``idle``, ``executing`` (a
node runs: ``currentNode``), ``agentCommand`` (a headless agent command works on the request),
``waitingForPerson`` / ``waitingForAgent`` (a request is pending: ``waitingOn``),
``waitingForSlot`` (runnable, every slot busy: ``capacity``), ``scheduled`` (runnable later:
``availableAt``), ``sleeping`` (a durable timer: a ``sleep``/``wait_until`` node or a retry
policy's back-off, ``currentNode`` waits until ``availableAt``; no runner is held),
``blocked`` (parked until someone acts: ``reason``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from piwf.protocol.payloads import (
    ContentRef,
    NodeFailureInfo,
    RunDetail,
    RunDisplayStatus,
    WireModel,
)

SCHEMA: Literal["piwf.run-view.v1"] = "piwf.run-view.v1"

DisplayStatus = RunDisplayStatus
Activity = Literal[
    "idle",
    "executing",
    "agentCommand",
    "waitingForPerson",
    "waitingForAgent",
    "waitingForSlot",
    "scheduled",
    "sleeping",
    "blocked",
]
#: What a renderer may offer; each maps to one CLI command and one client method.
Control = Literal[
    "pause", "resume", "cancel", "restart", "answer", "humanAnswer", "submit", "update", "resolve"
]

#: Steps on one page at most, and the encoded bytes a page aims to stay under.
MAX_STEP_PAGE_ITEMS = 200
DEFAULT_STEP_PAGE_ITEMS = 50
#: The largest step index a steps cursor names (a cursor is its decimal digits, 12 at most).
MAX_STEP_INDEX = 999_999_999_999
STEP_PAGE_BYTES = 256 * 1024
#: ``Capacity.queued_ahead`` counts at most this many runs (more shows as this number).
MAX_QUEUED_AHEAD = 1000
#: A step carries at most this many of its latest updates (``updates_total`` counts them all).
MAX_STEP_UPDATES = 20
#: The encoded bytes a step's earlier tries may take (``earlier_tries_total`` counts them all):
#: a retry policy allows 100 tries, each record up to about 22 KiB, which together would not fit
#: in one answer.
EARLIER_TRIES_BYTES = 64 * 1024


class NodeRef(WireModel):
    """The unfinished attempt of a node: the one the run executes or waits on."""

    path: str
    visit: int
    attempt: int
    node_type: str
    started_at: int | None = None
    deadline_at: int | None = None
    #: A timer's wake time, or when a retry policy's next try starts.
    wake_at: int | None = None
    #: How many tries of this visit failed and were run again by a retry policy (a crash
    #: retry is not a try, so this is not ``attempt - 1`` after a crash).
    failed_tries: int = 0
    #: The record of the last of those tries (what the retry policy's back-off follows).
    last_failure: NodeFailureInfo | None = None


class WaitingOn(WireModel):
    """The pending request a waiting run waits on, and the command that settles it."""

    path: str
    visit: int
    request_id: str
    kind: str
    #: The control that settles it (``answer``, ``humanAnswer``, ``submit``).
    action: Control
    command: str


class Capacity(WireModel):
    """The execution slots, when a runnable run waits for one: which runs hold them, and how
    many runnable runs the scheduler starts before this one (counted up to
    :data:`MAX_QUEUED_AHEAD`)."""

    max_workers: int
    busy: int
    holders: list[str]
    queued_ahead: int = 0


class EffectToResolve(WireModel):
    """An effect piwf could not prove applied or not: what ``resolve`` settles."""

    effect_id: str
    effect_type: str
    command: str


class StepUpdate(WireModel):
    """The latest update a step published under one (type, key)."""

    type: str
    key: str
    seq: int
    recorded_at: int
    data: Any = None
    data_ref: ContentRef | None = None


class Display(WireModel):
    """What every renderer shows, derived by the server from one read (module docstring)."""

    status: DisplayStatus
    activity: Activity
    controls: list[Control]
    #: Why action is required (a parked reason, a pause), as stored; None when none is.
    reason: str | None = None
    reason_ref: ContentRef | None = None
    #: The stored failure class of a parked run (``sourceChanged``, ``effectAmbiguous`` …).
    reason_code: str | None = None
    current_node: NodeRef | None = None
    #: The latest updates the current node published so far (at most MAX_STEP_UPDATES).
    current_updates: list[StepUpdate] = Field(default_factory=list)
    waiting_on: WaitingOn | None = None
    capacity: Capacity | None = None
    available_at: int | None = None
    effects_to_resolve: list[EffectToResolve] = Field(default_factory=list)
    #: The run a restart of this ended run started (a run restarts once), or None.
    restarted_as: str | None = None


class Step(WireModel):
    """One finished node visit, in the run's step order."""

    index: int
    path: str
    visit: int
    attempt: int
    node_type: str
    outcome: str
    started_at: int | None = None
    finished_at: int | None = None
    duration_ms: int | None = None
    output: Any = None
    output_ref: ContentRef | None = None
    error: str | None = None
    error_ref: ContentRef | None = None
    failure: NodeFailureInfo | None = None
    #: The latest tries of this visit a retry policy ran again that fit in
    #: :data:`EARLIER_TRIES_BYTES` (at least the last one), oldest first, each one's record;
    #: ``earlier_tries_total`` counts them all.
    earlier_tries: list[NodeFailureInfo] = Field(default_factory=list)
    earlier_tries_total: int = 0
    #: The latest :data:`MAX_STEP_UPDATES` updates, oldest first.
    updates: list[StepUpdate] = Field(default_factory=list)
    updates_total: int = 0


class StepPage(WireModel):
    """A page of steps; ``next_cursor`` names the page after it (None: this was the last)."""

    steps: list[Step]
    total: int
    next_cursor: str | None = None


#: A view's topology holds at most this many nodes and edges (``truncated`` says when cut).
MAX_TOPOLOGY_NODES = 200
MAX_TOPOLOGY_EDGES = 400


class TopologyNode(WireModel):
    """One node of the run's workflow definition."""

    path: str
    kind: str


class TopologyEdge(WireModel):
    """One edge: ``from`` to ``to``, or a switch ``on`` a value with its ``cases``."""

    source: str = Field(alias="from")
    to: str | None = None
    on: str | None = None
    cases: dict[str, str] | None = None


class Topology(WireModel):
    """The bounded graph of the run's recorded definition (its nodes and edges)."""

    start_at: str
    nodes: list[TopologyNode]
    edges: list[TopologyEdge]
    truncated: bool = False


class RunView(WireModel):
    """The ``piwf.run-view.v1`` document of one run at one revision."""

    schema_id: Literal["piwf.run-view.v1"] = Field(default=SCHEMA, alias="schema")
    revision: int
    detail: RunDetail
    display: Display
    steps: StepPage
    topology: Topology | None = None


class ViewRunPayload(WireModel):
    """``view.run.get``: the run view, with at most ``step_limit`` steps on its first page."""

    step_limit: int = Field(default=DEFAULT_STEP_PAGE_ITEMS, ge=1, le=MAX_STEP_PAGE_ITEMS)


class ViewPagePayload(WireModel):
    """``view.page``: the page of ``kind`` after ``cursor`` (from a previous page)."""

    kind: Literal["steps"]
    cursor: str = Field(min_length=1, max_length=64)
    limit: int = Field(default=DEFAULT_STEP_PAGE_ITEMS, ge=1, le=MAX_STEP_PAGE_ITEMS)


class ViewRunWatchPayload(WireModel):
    """``view.run.watch``: push the run's view to this connection whenever it changes.

    ``from_revision`` is the revision the client already has (after a reconnect): the first
    snapshot comes only once the run is past it.
    """

    subscription_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    from_revision: int | None = Field(default=None, ge=0)
    step_limit: int = Field(default=DEFAULT_STEP_PAGE_ITEMS, ge=1, le=MAX_STEP_PAGE_ITEMS)


class ViewRunsWatchPayload(WireModel):
    """``view.runs.watch``: push the run list (newest first) whenever any run changes."""

    subscription_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    limit: int = Field(default=50, ge=1, le=500)
    status: RunDisplayStatus | None = None


class ViewUnwatchPayload(WireModel):
    """``view.unwatch``: end one subscription of this connection."""

    subscription_id: str = Field(min_length=1, max_length=128)


class WatchReceipt(WireModel):
    """The answer to a watch or an unwatch: the subscription and, for a run, its revision now."""

    subscription_id: str
    revision: int | None = None
    active: bool = True
