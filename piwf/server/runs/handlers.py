"""Handlers of the run operations: start, list, get, wait, and the controls.

``run.start`` waits for a resolver child before it commits; ``run.wait`` parks until the run is
terminal or needs an operator (paused, or parked until someone acts: it will not go on by
itself). Controls (cancel, pause) commit with their receipt and only then stop the run's child.
The deferred answers (a resolver's reply, a ``run.wait`` timer) are guarded like the handlers:
a failure is answered with a typed error (:mod:`piwf.server.failures`), never left waiting.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from piwf.canonical import JsonValue
from piwf.config import SESSION_OR_AGENT_COMMAND
from piwf.errors import (
    PiwfError,
    RunCommandError,
    SessionBusyError,
    SessionError,
    StateUnavailableError,
    WorkflowLoadError,
)
from piwf.lifecycle import RecoveryRequired
from piwf.protocol.client_v1 import Request, Response
from piwf.protocol.fingerprint import request_fingerprint
from piwf.protocol.payloads import (
    AgentProcessInfo,
    EmptyPayload,
    RunCursor,
    RunDetail,
    RunForkPayload,
    RunListPayload,
    RunPage,
    RunReceipt,
    RunStartPayload,
    RunWaitPayload,
    RunWaitReceipt,
    SettingsSummary,
)
from piwf.server.commands import CommandResult
from piwf.server.content_offer import ContentOffer
from piwf.server.context import ServerContext, Waiter
from piwf.server.failures import answering, failure_response
from piwf.server.loop import Reply
from piwf.server.replies import (
    InvalidPayloadError,
    effect_info,
    error_response,
    no_run,
    not_found,
    ok,
    payload_of,
    project_of,
    run_id_of,
    run_info,
    run_result,
    stale_revision,
)
from piwf.server.runs import answers, interactions, recorded_sources, refusals
from piwf.server.runs.failure_records import run_failure
from piwf.state import Transaction, content_owners, decisions
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.enums import ActorType
from piwf.state.execution import agents, forks, messages, submissions
from piwf.state.execution import queue as run_queue
from piwf.state.execution import runs as run_store
from piwf.state.execution import settings as run_settings
from piwf.state.records import Actor
from piwf.workflow.sources import SourceIdentity

#: ``run.get`` shows a run's newest this many effects (and every unsettled one), decisions,
#: agent requests and settings scopes, with how many it has: a long loop's run still answers
#: within one frame.
SHOWN_ITEMS = 50
#: ``run.get``'s decisions, and separately its agent requests, also end early once their
#: encoded items reach this many bytes (always holding the newest one): with the response's
#: inline budget and the bounded choices of a waiting request, the answer fits one frame.
SHOWN_ITEMS_BYTES = 128 * 1024
#: The newest submissions each shown decision and agent request carries, with how many it has.
SHOWN_SUBMISSIONS = 20

_CLIENT_RUN_ID = re.compile(r"run-[A-Za-z0-9_-]{8,64}")


class RunHandlers:
    """The run operations; ``dispatch`` re-enters the server's dispatcher for deferred controls."""

    def __init__(self, context: ServerContext, dispatch: Callable[[Request, Reply], None]) -> None:
        self.context = context
        self.dispatch = dispatch

    def run_start(self, request: Request, reply: Reply) -> None:
        """Resolve the workflow in a child, then commit a queued run and answer.

        A client may choose the run id (``runId`` in the envelope, ``run-`` + 8..64 letters,
        digits, ``_`` or ``-``); controls naming that id while the start is still resolving wait
        for it, so a pipelined start + cancel cancels the run before any runner starts.
        """
        payload = payload_of(request, RunStartPayload)
        project_of(payload.project_path)
        if payload.session is not None and payload.agent_command is not None:
            raise InvalidPayloadError(f"run.start payload: {SESSION_OR_AGENT_COMMAND}")
        if request.run_id is not None and not _CLIENT_RUN_ID.fullmatch(request.run_id):
            raise InvalidPayloadError("runId must be 'run-' and 8..64 of [A-Za-z0-9_-]")
        earlier = self.context.commands.lookup(request)
        if earlier is not None:
            reply(earlier)
            return
        key = (request.client_id, request.idempotency_key or "")
        joined = self.context.starts_in_flight.get(key)
        if joined is not None:
            if request_fingerprint(joined[0][0]) != request_fingerprint(request):
                reply(
                    error_response(
                        request,
                        "conflict",
                        "idempotencyConflict",
                        "this idempotency key is already starting another run",
                    )
                )
                return
            joined.append((request, reply))
            return
        self.context.starts_in_flight[key] = [(request, reply)]
        if request.run_id is not None:
            self.context.pending_run_ids.setdefault(request.run_id, [])
        resolver_request: dict[str, JsonValue] = {
            "workflow": payload.workflow,
            "projectPath": payload.project_path,
            "stateHome": str(self.context.home),
        }
        self.context.resolvers.resolve(
            resolver_request, lambda result: self._resolved(key, payload, result)
        )

    def _resolved(
        self,
        key: tuple[str, str],
        payload: RunStartPayload,
        result: dict[str, JsonValue] | PiwfError,
    ) -> None:
        waiting = self.context.starts_in_flight.pop(key, [])
        if not waiting:
            return
        try:
            self._answer_start(waiting, payload, result)
        except Exception as error:  # every joined start is answered; replies already sent stay
            for request, reply in waiting:
                reply(failure_response(request, error))
            self._run_deferred(waiting[0][0])

    def _answer_start(
        self,
        waiting: list[tuple[Request, Reply]],
        payload: RunStartPayload,
        result: dict[str, JsonValue] | PiwfError,
    ) -> None:
        """Commit the run (or the refusal) in the loop turn's group commit, then answer every
        joined start and run the controls that waited for it."""
        first_request, _ = waiting[0]
        if isinstance(result, PiwfError):
            # The resolver died or overran: nothing was decided about this command, so it is
            # answered `unavailable` with no receipt and a retry under the same key runs again.
            for request, reply in waiting:
                reply(error_response(request, "unavailable", result.code, str(result)))
            self._run_deferred(first_request)
            return
        if result.get("ok") is not True:
            error = resolver_error(result)
            change = lambda _tx: CommandResult.failed("rejected", error)  # noqa: E731
        else:
            new_run = new_run_from(payload, result)
            chosen = first_request.run_id
            change = lambda tx: self._create_run(tx, new_run, chosen)  # noqa: E731

        def answered(response: Response) -> None:
            for request, reply in waiting:
                with answering(request, reply):
                    if request is first_request:
                        reply(response)
                    else:
                        answer = self.context.commands.lookup(request)
                        reply(answer if answer is not None else response)
            self._run_deferred(first_request)

        self.context.commands.execute_later(first_request, change, answered)

    def _run_deferred(self, start: Request) -> None:
        """Run the controls that waited for this start, before the scheduler can admit it."""
        for request, reply in self.context.pending_run_ids.pop(start.run_id or "", []):
            self.dispatch(request, reply)
        self.context.wake_scheduler()

    def _create_run(
        self, tx: Transaction, new_run: run_store.NewRun, chosen_run_id: str | None
    ) -> CommandResult:
        run_id = chosen_run_id or run_store.new_run_id()
        if run_store.load_run(tx, run_id) is not None:
            return CommandResult.failed("conflict", RunCommandError(f"run {run_id} already exists"))
        holder = (
            None if new_run.session_id is None else messages.session_holder(tx, new_run.session_id)
        )
        assistant = None if new_run.session_id else _assistant_step(new_run.definition_snapshot)
        if assistant is not None:
            headless = SessionError(
                f"step {assistant!r} takes the session's visible reply (assistant_message), and"
                " a headless run has no session: start the run with --session SESSION_ID"
            )
            return CommandResult.failed("rejected", headless)
        if holder is not None:
            busy = SessionBusyError(
                f"session {new_run.session_id} is reserved by run {holder} until it ends"
                f" (one unfinished run per session): wait for it, or cancel it with"
                f" piwf run cancel {holder}"
            )
            return CommandResult.failed("conflict", busy)
        view = run_store.create_run(tx, run_id, new_run, Actor(ActorType.CLIENT))
        receipt = RunReceipt(run=run_info(view)).to_wire()
        return CommandResult.accepted(receipt, run_id=run_id, revision=view.revision)

    def run_list(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, RunListPayload)
        before = (
            None if payload.before is None else (payload.before.created_at, payload.before.run_id)
        )
        with self.context.db.read() as tx:
            views = run_store.list_runs(
                tx, limit=payload.limit + 1, before=before, display=payload.status
            )
        page = views[: payload.limit]
        cursor = None
        if len(views) > payload.limit:
            cursor = RunCursor(created_at=page[-1].created_at, run_id=page[-1].run_id)
        reply(ok(request, RunPage(runs=[run_info(v) for v in page], next_cursor=cursor)))

    def run_get(self, request: Request, reply: Reply) -> None:
        """One run in full, from one read snapshot; large values go by content reference."""
        payload_of(request, EmptyPayload)
        run_id = run_id_of(request)
        with self.context.db.read() as tx:
            view = run_store.load_run(tx, run_id)
            detail = None if view is None else run_detail(tx, view)
        if view is None or detail is None:
            reply(not_found(request, run_id, self.context.home))
            return
        reply(ok(request, detail, revision=view.revision))

    def run_cancel(self, request: Request, reply: Reply) -> None:
        """Cancel in one transaction (receipt included), then stop the fenced child."""
        refuse = refusals.ended_refuses_cancel
        self._control(request, reply, ex.cancel_run, stop_reason="cancelled", refuse=refuse)

    def run_pause(self, request: Request, reply: Reply) -> None:
        """Pause: flag, park and release the claim atomically, then stop the child."""
        refuse = refusals.ended_refuses("pause")
        self._control(request, reply, ex.pause_run, stop_reason="paused", refuse=refuse)

    def _control(
        self,
        request: Request,
        reply: Reply,
        transition: Callable[..., object],
        *,
        stop_reason: str,
        refuse: Callable[[run_store.RunRow], RunCommandError | None] | None = None,
    ) -> None:
        payload_of(request, EmptyPayload)
        run_id = run_id_of(request)
        waiting = self.context.pending_run_ids.get(run_id)
        if waiting is not None:
            waiting.append((request, reply))  # its start is still resolving
            return
        context = self.context

        def change(tx: Transaction) -> CommandResult:
            run = run_store.load_run(tx, run_id)
            if run is None:
                return no_run(run_id, self.context.home)
            if (stale := stale_revision(request, run)) is not None:
                return stale
            refusal = None if refuse is None else refuse(run)
            if refusal is not None:
                return CommandResult.failed("rejected", refusal, run_id=run_id)
            result = transition(
                tx,
                run_id,
                actor=Actor(ActorType.CLIENT),
                control_owner_id=context.server_id,
                lease_ms=context.run_lease_ms,
                expected_revision=request.expected_revision,
                claim=context.active_claim(run_id),
            )
            return run_result(result, run_id)

        response = context.commands.execute(request, change)
        reply(response)
        if response.outcome == "accepted":
            context.stop_runner(run_id, stop_reason)
        self.notify_run_changed(run_id)

    def run_resume(self, request: Request, reply: Reply) -> None:
        """Make a paused or parked run eligible again (the only way out of a blocking park)."""
        payload_of(request, EmptyPayload)
        run_id = run_id_of(request)

        def change(tx: Transaction) -> CommandResult:
            run = run_store.load_run(tx, run_id)
            if run is None:
                return no_run(run_id, self.context.home)
            if (stale := stale_revision(request, run)) is not None:
                return stale
            refusal = refusals.ended_refuses("resume")(run)
            if refusal is not None:
                return CommandResult.failed("rejected", refusal, run_id=run_id)
            result = ex.resume_run(
                tx,
                run_id,
                actor=Actor(ActorType.CLIENT),
                expected_revision=request.expected_revision,
            )
            if isinstance(result, RecoveryRequired) and result.reason == "effectAmbiguous":
                refusal = refusals.ambiguous_refuses_resume(tx, run)
                return CommandResult.failed("rejected", refusal, run_id=run_id)
            return run_result(result, run_id)

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()

    def run_restart(self, request: Request, reply: Reply) -> None:
        """Queue a fresh run of a terminal run's workflow from its first node, with the
        definition and sources the run recorded; refused up front when a recorded file changed
        or is gone (the restart could only park ``sourceChanged``)."""
        payload_of(request, EmptyPayload)
        run_id = run_id_of(request)

        def change(tx: Transaction) -> CommandResult:
            parent = run_store.load_run(tx, run_id)
            if parent is None:
                return no_run(run_id, self.context.home)
            refusal = refusals.restart_refusal(tx, parent)
            if refusal is not None:
                return CommandResult.failed("rejected", refusal, run_id=run_id)
            result = ex.restart_run(
                tx, run_id, new_run_id=run_store.new_run_id(), actor=Actor(ActorType.CLIENT)
            )
            return run_result(result, run_id)

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()

    def run_fork(self, request: Request, reply: Reply) -> None:
        """Queue a new run of a run's recorded sources that starts at one node with the
        outputs recorded before it (:mod:`piwf.state.execution.forks`); refused up front, as a
        restart is, when a recorded file changed or is gone (the fork could only park
        ``sourceChanged``)."""
        payload = payload_of(request, RunForkPayload)
        run_id = run_id_of(request)

        def change(tx: Transaction) -> CommandResult:
            parent = run_store.load_run(tx, run_id)
            if parent is None:
                return no_run(run_id, self.context.home)
            refusal = refusals.sources_refuse_fork(tx, parent)
            if refusal is not None:
                return CommandResult.failed("rejected", refusal, run_id=run_id)
            result = forks.fork_run(
                tx,
                run_id,
                from_node=payload.from_node,
                new_run_id=run_store.new_run_id(),
                actor=Actor(ActorType.CLIENT),
            )
            return run_result(result, run_id)

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()

    def run_wait(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, RunWaitPayload)
        run_id = run_id_of(request)
        answer_now = None
        with self.context.db.read() as tx:
            view = run_store.load_run(tx, run_id)
            if view is not None and (_wait_ends(view) or payload.timeout_ms == 0):
                answer_now = wait_receipt(tx, view, timed_out=not _wait_ends(view))
        if view is None:
            reply(not_found(request, run_id, self.context.home))
            return
        if answer_now is not None:
            reply(ok(request, answer_now))
            return
        waiters = self.context.waiters.setdefault(run_id, [])

        def expire() -> None:
            still_waiting = [w for w in waiters if w.request_id != request.request_id]
            waiters[:] = still_waiting
            with answering(request, reply):
                self._answer_wait(request, reply, run_id, timed_out=True)

        timer = self.context.loop.call_later(payload.timeout_ms / 1000, expire)
        waiters.append(Waiter(reply, request.request_id, timer))

    def notify_run_changed(self, run_id: str) -> None:
        """Answer every ``run.wait`` on ``run_id`` if the run is now terminal or needs an
        operator.

        Never raises for a database that cannot be read: the waiters are then answered by their
        own timers, and the caller (a runner's exit) goes on.
        """
        waiters = self.context.waiters.get(run_id)
        if not waiters:
            return
        try:
            with self.context.db.read() as tx:
                view = run_store.load_run(tx, run_id)
                if view is None or not _wait_ends(view):
                    return
                receipt = wait_receipt(tx, view, timed_out=False).to_wire()
        except StateUnavailableError:
            return
        for waiter in self.context.waiters.pop(run_id, []):
            waiter.timer.cancel()
            waiter.reply(
                Response(request_id=waiter.request_id, outcome="accepted", receipt=receipt)
            )

    def _answer_wait(self, request: Request, reply: Reply, run_id: str, *, timed_out: bool) -> None:
        with self.context.db.read() as tx:
            view = run_store.load_run(tx, run_id)
            receipt = None if view is None else wait_receipt(tx, view, timed_out=timed_out)
        if receipt is None:
            reply(not_found(request, run_id, self.context.home))
            return
        reply(ok(request, receipt))


def run_detail(tx: Transaction, view: run_store.RunRow) -> RunDetail:
    """The ``run.get`` receipt of ``view``, read inside ``tx``; large values go by content
    reference (:class:`~piwf.server.content_offer.ContentOffer`)."""
    run_id = view.run_id
    offer = ContentOffer(tx)
    values = content_owners.run_values(tx, run_id)
    output = offer.json("run", run_id, values.output)
    error = offer.text("run", run_id, values.error)
    return RunDetail(
        run=run_info(view),
        sources=[
            recorded_sources.source_info(source)
            for source in run_store.list_run_sources(tx, run_id)
        ],
        effects=[
            effect_info(effect)
            for effect in fx.list_shown_effects(tx, view.resource_id, SHOWN_ITEMS)
        ],
        effect_count=fx.count_effects(tx, view.resource_id),
        output=output.value,
        output_ref=output.ref,
        error=error.value,
        error_ref=error.ref,
        waiting_on=answers.waiting_on(tx, run_id, offer),
        decisions=answers.decision_infos(
            tx, run_id, offer, SHOWN_ITEMS, SHOWN_ITEMS_BYTES, SHOWN_SUBMISSIONS
        ),
        decision_count=decisions.count_run_decisions(tx, run_id),
        agent_requests=interactions.agent_request_infos(
            tx, run_id, offer, SHOWN_ITEMS, SHOWN_ITEMS_BYTES, SHOWN_SUBMISSIONS
        ),
        agent_request_count=submissions.count_submitted_requests(tx, run_id),
        parked_reason=run_queue.read_queue_reason(tx, run_id) if view.needs_action else None,
        session=messages.session_of(tx, run_id),
        agent_process=_agent_process(tx, run_id),
        failure=run_failure(tx, view),
        settings=[
            SettingsSummary(
                mount_path=scope.mount_path,
                invocation=scope.invocation,
                change_number=scope.change_number,
            )
            for scope in run_settings.run_scopes(tx, run_id, SHOWN_ITEMS)
        ],
        settings_count=run_settings.count_scopes(tx, run_id),
    )


def _agent_process(tx: Transaction, run_id: str) -> AgentProcessInfo | None:
    """The run's live headless agent command, as ``run show`` names it."""
    row = agents.live_process_of_run(tx, run_id)
    if row is None:
        return None
    return AgentProcessInfo(
        pid=row.pid,
        request_id=row.request_id,
        turn=row.turn_number,
        registered_at=row.registered_at,
    )


def _wait_ends(view: run_store.RunRow) -> bool:
    """Whether a ``run.wait`` on ``view`` is answered now: the run is terminal, or it will not
    go on until an operator acts (waiting on a request or a timer is not that)."""
    return view.finished_at is not None or view.needs_action


def wait_receipt(tx: Transaction, view: run_store.RunRow, *, timed_out: bool) -> RunWaitReceipt:
    """The ``run.wait`` answer: the run; once terminal, its output or error (inline or by
    content reference); while it needs an operator, its stored parked reason."""
    if view.finished_at is None:
        reason = run_queue.read_queue_reason(tx, view.run_id) if view.needs_action else None
        return RunWaitReceipt(run=run_info(view), timed_out=timed_out, parked_reason=reason)
    offer = ContentOffer(tx)
    values = content_owners.run_values(tx, view.run_id)
    output = offer.json("run", view.run_id, values.output)
    error = offer.text("run", view.run_id, values.error)
    return RunWaitReceipt(
        run=run_info(view),
        timed_out=timed_out,
        output=output.value,
        output_ref=output.ref,
        error=error.value,
        error_ref=error.ref,
        failure=run_failure(tx, view),
    )


def new_run_from(payload: RunStartPayload, result: dict[str, JsonValue]) -> run_store.NewRun:
    """The run to commit from a start payload and its resolver reply."""
    sources = recorded_sources.rows_of(SourceIdentity.from_json(result["sources"]))
    digest = result["definitionDigest"]
    assert isinstance(digest, str)
    title = payload.title if payload.title is not None else result.get("runTitle")
    return run_store.NewRun(
        workflow_ref=str(result["workflowRef"]),
        workflow_name=str(result["workflowName"]),
        definition_digest=bytes.fromhex(digest),
        definition_snapshot=result["snapshot"],
        input=payload.input,
        sources=sources,
        title=title if isinstance(title, str) else None,
        project_path=payload.project_path,
        session_id=payload.session,
        launch_options=(
            None
            if payload.agent_command is None
            else {"agentCommand": list[JsonValue](payload.agent_command)}
        ),
    )


def _assistant_step(snapshot: JsonValue) -> str | None:
    """The name of an assistant-message step anywhere in a definition snapshot, or None."""
    if isinstance(snapshot, dict):
        nodes = snapshot.get("nodes")
        if isinstance(nodes, dict):
            for name, node in nodes.items():
                if isinstance(node, dict) and "assistantMessage" in node:
                    return str(name)
        for value in snapshot.values():
            found = _assistant_step(value)
            if found is not None:
                return found
    elif isinstance(snapshot, list):
        for item in snapshot:
            found = _assistant_step(item)
            if found is not None:
                return found
    return None


def resolver_error(result: dict[str, JsonValue]) -> PiwfError:
    """The typed error of a resolver child's refusal."""
    error = result.get("error")
    message = "the workflow could not be loaded"
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message = str(error["message"])
    return WorkflowLoadError(message)
