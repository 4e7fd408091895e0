"""The live run view (``piwf.run-view.v1``): ``view.run.get`` and ``view.page``.

One read snapshot builds the whole document: the run's projection (what ``run.get`` answers),
the :class:`~piwf.protocol.view_payloads.Display` derived here once, and a page of steps. Renderers
(``run show``, ``run steps``, ``run explain``, the viewer) use it as it is. A view read creates
no receipt and repairs nothing.

A steps page holds at most its item limit and aims at :data:`STEP_PAGE_BYTES` encoded bytes:
each step's values go through the response's one
:class:`~piwf.server.content_offer.ContentOffer` (16 KiB inline, the rest by content reference,
readable with ``view.content`` under the run's scope), and a page ends early once its encoded
steps reach the budget (a page always holds at least one step; its inline values share the
same budget, so one step cannot carry more). A step carries its latest
:data:`MAX_STEP_UPDATES` updates and their count. The cursor is the index of its last step.
"""

from __future__ import annotations

from piwf.lifecycle import TERMINAL_RUN_STATUSES
from piwf.protocol.client_v1 import Request
from piwf.protocol.payloads import ContentRef, NodeFailureInfo, RunDetail
from piwf.protocol.view_payloads import (
    EARLIER_TRIES_BYTES,
    MAX_QUEUED_AHEAD,
    MAX_STEP_INDEX,
    MAX_STEP_UPDATES,
    MAX_TOPOLOGY_EDGES,
    MAX_TOPOLOGY_NODES,
    STEP_PAGE_BYTES,
    Activity,
    Capacity,
    Control,
    Display,
    EffectToResolve,
    NodeRef,
    RunView,
    Step,
    StepPage,
    StepUpdate,
    Topology,
    TopologyEdge,
    TopologyNode,
    ViewPagePayload,
    ViewRunPayload,
    WaitingOn,
)
from piwf.server.content_offer import ContentOffer, within_budget
from piwf.server.context import ServerContext
from piwf.server.loop import Reply
from piwf.server.replies import (
    InvalidPayloadError,
    not_found,
    ok,
    payload_of,
    request_command,
    run_id_of,
)
from piwf.server.runs.failure_records import step_failure
from piwf.server.runs.handlers import run_detail
from piwf.state import Transaction, blobs
from piwf.state.enums import AttemptStatus, FailureClass
from piwf.state.execution import attempts, run_view
from piwf.state.execution import queue as run_queue
from piwf.state.execution import runs as run_store
from piwf.state.execution.attempts import AttemptRow
from piwf.state.execution.run_view import PublishedUpdate, StepRow

#: The reason of a run parked ``effectAmbiguous`` once no effect of it is ambiguous any more.
RESOLVED_EFFECTS_REASON = "its ambiguous effects are resolved; it goes on when resumed"

#: What a pending request's kind asks for (its command: :data:`REQUEST_COMMANDS`).
_ACTIONS: dict[str, Control] = {
    "checkpoint": "answer",
    "human_decision": "humanAnswer",
    "agent": "submit",
}

_OUTCOMES = {
    AttemptStatus.COMPLETED: "completed",
    AttemptStatus.FAILED: "failed",
    AttemptStatus.TIMED_OUT: "timed_out",
    AttemptStatus.CANCELLED: "cancelled",
    AttemptStatus.INTERRUPTED: "interrupted",
}


class RunViews:
    """The ``view.run.get`` and ``view.page`` handlers."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context

    def view_run_get(self, request: Request, reply: Reply) -> None:
        """The run view at the current revision, with the first page of steps."""
        payload = payload_of(request, ViewRunPayload)
        run_id = run_id_of(request)
        with self.context.db.read() as tx:
            view = run_store.load_run(tx, run_id)
            document = None if view is None else self.run_view(tx, view, payload.step_limit)
        if view is None or document is None:
            reply(not_found(request, run_id, self.context.home))
            return
        reply(ok(request, document, revision=view.revision))

    def view_page(self, request: Request, reply: Reply) -> None:
        """The steps after a cursor of an earlier page."""
        payload = payload_of(request, ViewPagePayload)
        run_id = run_id_of(request)
        after = _cursor_index(payload.cursor)
        with self.context.db.read() as tx:
            view = run_store.load_run(tx, run_id)
            page = None if view is None else steps_page(tx, run_id, after, payload.limit)
        if view is None or page is None:
            reply(not_found(request, run_id, self.context.home))
            return
        reply(ok(request, page, revision=view.revision))

    def run_view(self, tx: Transaction, view: run_store.RunRow, step_limit: int) -> RunView:
        """The whole document of ``view``, read inside ``tx``."""
        detail = run_detail(tx, view)
        return RunView(
            revision=view.revision,
            detail=detail,
            display=display_of(tx, view, detail, self.context.max_workers),
            steps=steps_page(tx, view.run_id, -1, step_limit),
            topology=topology_of(blobs.read_json(tx, view.definition_digest)),
        )


def topology_of(snapshot: object) -> Topology | None:
    """The bounded graph of a recorded definition snapshot (``piwf.workflow-definition.v1``);
    None for a snapshot of another shape. Edges other than plain and switch ones are left out."""
    workflow = snapshot.get("workflow") if isinstance(snapshot, dict) else None
    if not isinstance(workflow, dict) or not isinstance(workflow.get("nodes"), dict):
        return None
    nodes = [
        TopologyNode(
            path=str(path), kind=str(spec.get("kind", "?")) if isinstance(spec, dict) else "?"
        )
        for path, spec in sorted(workflow["nodes"].items())
    ]
    edges: list[TopologyEdge] = []
    for edge in workflow.get("edges") or []:
        if not isinstance(edge, dict) or not isinstance(edge.get("from"), str):
            continue
        switch = edge.get("switch")
        if isinstance(edge.get("to"), str):
            edges.append(TopologyEdge.model_validate({"from": edge["from"], "to": edge["to"]}))
        elif isinstance(switch, dict) and isinstance(switch.get("cases"), dict):
            cases = {str(k): str(v) for k, v in switch["cases"].items() if isinstance(v, str)}
            found = {"from": edge["from"], "on": str(switch.get("on")), "cases": cases}
            edges.append(TopologyEdge.model_validate(found))
    truncated = len(nodes) > MAX_TOPOLOGY_NODES or len(edges) > MAX_TOPOLOGY_EDGES
    return Topology(
        start_at=str(workflow.get("startAt", "")),
        nodes=nodes[:MAX_TOPOLOGY_NODES],
        edges=edges[:MAX_TOPOLOGY_EDGES],
        truncated=truncated,
    )


def display_of(
    tx: Transaction, view: run_store.RunRow, detail: RunDetail, max_workers: int
) -> Display:
    """The display of a run (:mod:`piwf.protocol.view_payloads` gives the closed sets)."""
    status = detail.run.display_status
    run_id = view.run_id
    ambiguous = [
        EffectToResolve(
            effect_id=effect.effect_id,
            effect_type=effect.effect_type,
            command=f"piwf effect resolve {effect.effect_id} --applied|--retry",
        )
        for effect in detail.effects
        if effect.status == "ambiguous"
    ]
    if view.status in TERMINAL_RUN_STATUSES:
        # A restart is refused while an effect is unsettled (resolve it first), and for a run
        # whose input its workflow refused (a restart gives it the same input).
        controls: list[Control] = ["resolve"] if ambiguous else ["restart"]
        if view.error_code == FailureClass.INPUT_REJECTED.value:
            controls = []
        return Display(
            status=status,  # type: ignore[arg-type]  # the closed set, by construction
            activity="idle",
            controls=controls,
            effects_to_resolve=ambiguous,
            restarted_as=run_store.restart_child_of(tx, run_id),
        )
    current = run_view.current_attempt(tx, run_id)
    tries = [] if current is None else attempts.earlier_failed_tries(tx, current)
    node = (
        None
        if current is None
        else NodeRef(
            path=current.path,
            visit=current.visit,
            attempt=current.attempt,
            node_type=current.node_type,
            started_at=current.started_at,
            deadline_at=current.deadline_at,
            wake_at=current.wake_at,
            failed_tries=len(tries),
            last_failure=step_failure(tx, tries[-1]) if tries else None,
        )
    )
    waiting = _waiting_on(detail)
    activity: Activity = "idle"
    stored, reason_ref = _stored_reason(tx, run_id) if view.needs_action else (None, None)
    reason = None
    capacity = None
    available_at = None
    if ambiguous:
        activity = "blocked"
        reason = stored or "an effect could not be proved applied or not applied"
    elif view.paused:
        activity = "blocked"
        reason = stored or "paused"
    elif waiting is not None:
        if waiting.kind == "agent":
            activity = "agentCommand" if detail.agent_process is not None else "waitingForAgent"
        else:
            activity = "waitingForPerson"
    elif view.executing:
        activity = "executing" if node is not None else "idle"
    elif view.needs_action and view.error_code == FailureClass.EFFECT_AMBIGUOUS.value:
        # Parked for an effect that is settled since: the stored reason tells why it parked,
        # not what it waits for now (the resolution is on the effect's own audit events).
        activity = "blocked"
        reason = RESOLVED_EFFECTS_REASON
    elif view.needs_action:
        activity = "blocked"
        reason = stored or view.error_code
    elif view.available_at is not None and view.available_at > tx.now:
        sleeping = current is not None and current.wake_at == view.available_at
        activity = "sleeping" if sleeping else "scheduled"
        available_at = view.available_at
    else:
        holders = run_queue.executing_run_ids(tx, max_workers + 1)
        # A run behind others waits for them too, even while a slot is free for a moment.
        ahead = run_queue.count_runnable_ahead(tx, run_id, MAX_QUEUED_AHEAD)
        if len(holders) >= max_workers or ahead:
            activity = "waitingForSlot"
            capacity = Capacity(
                max_workers=max_workers, busy=len(holders), holders=holders, queued_ahead=ahead
            )
    current_updates: list[StepUpdate] = []
    if current is not None and waiting is None:
        offer = ContentOffer(tx, budget=STEP_PAGE_BYTES)
        published = run_view.updates_of(tx, [current.attempt_id]).get(current.attempt_id, [])
        current_updates = [
            _update(offer, run_id, update) for update in published[-MAX_STEP_UPDATES:]
        ]
    return Display(
        status=status,  # type: ignore[arg-type]  # the closed set, by construction
        activity=activity,
        controls=_controls(view, waiting, ambiguous=bool(ambiguous)),
        current_updates=current_updates,
        reason=reason,
        reason_ref=reason_ref if activity == "blocked" else None,
        reason_code=view.error_code if activity == "blocked" else None,
        current_node=node if waiting is None else None,
        waiting_on=waiting,
        capacity=capacity,
        available_at=available_at,
        effects_to_resolve=ambiguous,
    )


def _stored_reason(tx: Transaction, run_id: str) -> tuple[str | None, ContentRef | None]:
    """The stored parked reason: inline up to 16 KiB, above that a notice and its reference."""
    offered = ContentOffer(tx).text("run", run_id, run_queue.reason_digest(tx, run_id))
    if offered.ref is None:
        return offered.value, None
    notice = f"the reason is {offered.ref.length} bytes long; it travels as reasonRef"
    return notice, offered.ref


def _waiting_on(detail: RunDetail) -> WaitingOn | None:
    request = detail.waiting_on
    if request is None:
        return None
    action = _ACTIONS.get(request.kind, "answer")
    command = request_command(request.kind)
    if detail.session is not None and request.kind != "human_decision":
        # The model-facing actions of an interactive run belong to its session.
        command = f"piwf session attach {detail.session}"
    return WaitingOn(
        path=request.path,
        visit=request.visit,
        request_id=request.request_id,
        kind=request.kind,
        action=action,
        command=command.format(request=request.request_id),
    )


def _controls(
    view: run_store.RunRow, waiting: WaitingOn | None, *, ambiguous: bool
) -> list[Control]:
    """What may be done to a run that is not terminal (each command checks again). A paused
    run refuses answers, submissions and updates (``runPaused``), so its request's controls
    are left out until it is resumed."""
    controls: list[Control] = []
    if waiting is not None and not view.paused:
        controls.append(waiting.action)
        if waiting.kind == "agent":
            controls.append("update")
    if ambiguous:
        controls.append("resolve")
    controls.append("resume" if view.paused or view.needs_action else "pause")
    controls.append("cancel")
    return controls


def steps_page(tx: Transaction, run_id: str, after: int, limit: int) -> StepPage:
    """Up to ``limit`` steps after index ``after``, within the page's byte budget."""
    rows = run_view.step_page(tx, run_id, after=after, limit=limit + 1)
    offer = ContentOffer(tx, budget=STEP_PAGE_BYTES)
    steps = within_budget((_step(tx, offer, run_id, row) for row in rows[:limit]), STEP_PAGE_BYTES)
    more = len(steps) < len(rows)
    return StepPage(
        steps=steps,
        total=run_view.step_count(tx, run_id),
        next_cursor=str(steps[-1].index) if more and steps else None,
    )


def _step(tx: Transaction, offer: ContentOffer, run_id: str, row: StepRow) -> Step:
    attempt = row.attempt
    output = offer.json("run", run_id, attempt.output_hash)
    error = offer.text("run", run_id, attempt.error_hash)
    duration = (
        attempt.finished_at - attempt.started_at
        if attempt.finished_at is not None and attempt.started_at is not None
        else None
    )
    updates = [_update(offer, run_id, update) for update in row.updates[-MAX_STEP_UPDATES:]]
    earlier_tries, earlier_total = _earlier_tries(tx, attempt)
    return Step(
        index=row.index,
        path=attempt.path,
        visit=attempt.visit,
        attempt=attempt.attempt,
        node_type=attempt.node_type,
        outcome=_OUTCOMES.get(attempt.status, attempt.status.value),
        started_at=attempt.started_at,
        finished_at=attempt.finished_at,
        duration_ms=duration,
        output=output.value,
        output_ref=output.ref,
        error=error.value,
        error_ref=error.ref,
        failure=step_failure(tx, attempt),
        earlier_tries=earlier_tries,
        earlier_tries_total=earlier_total,
        updates=updates,
        updates_total=len(row.updates),
    )


def _earlier_tries(tx: Transaction, attempt: AttemptRow) -> tuple[list[NodeFailureInfo], int]:
    """The records of the latest earlier tries that fit in :data:`EARLIER_TRIES_BYTES` (at
    least the last one), oldest first, and how many earlier tries there are."""
    if attempt.attempt == 1:
        return [], 0
    tries = attempts.earlier_failed_tries(tx, attempt)
    failures = (step_failure(tx, earlier) for earlier in reversed(tries))
    kept = within_budget((item for item in failures if item is not None), EARLIER_TRIES_BYTES)
    return kept[::-1], len(tries)


def _update(offer: ContentOffer, run_id: str, update: PublishedUpdate) -> StepUpdate:
    data = offer.json("run", run_id, update.data_hash)
    return StepUpdate(
        type=update.update_type,
        key=update.key,
        seq=update.seq,
        recorded_at=update.recorded_at,
        data=data.value,
        data_ref=data.ref,
    )


def _cursor_index(cursor: str) -> int:
    """The step index a cursor names; a cursor this server never gave is refused."""
    if not cursor.isdigit() or len(cursor) > len(str(MAX_STEP_INDEX)):
        raise InvalidPayloadError("cursor: not a cursor of a steps page; use the nextCursor given")
    return int(cursor)
