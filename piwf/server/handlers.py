"""Operation handlers: validate the payload, run the store operation, answer.

Each handler receives the parsed request and a ``reply`` callback. Reads answer at once from one
read snapshot; durable operations go through :class:`~piwf.server.commands.DurableCommands`, so
their receipt commits with their change before the answer is sent. ``run.start`` waits for a
resolver child and ``run.wait`` for a run to finish; both answer later through ``reply``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from piwf._version import __version__
from piwf.canonical import JsonValue
from piwf.errors import PiwfError, RunCommandError
from piwf.protocol.client_v1 import ErrorInfo, Request, Response
from piwf.protocol.fingerprint import request_fingerprint
from piwf.protocol.payloads import (
    AnswerPayload,
    BackupReceipt,
    EffectInfo,
    EffectReceipt,
    EffectResolvePayload,
    EmptyPayload,
    RequestsListPayload,
    RunCursor,
    RunDetail,
    RunInfo,
    RunListPayload,
    RunPage,
    RunReceipt,
    RunSource,
    RunStartPayload,
    RunWaitPayload,
    RunWaitReceipt,
    ServerStatus,
    StateBackupPayload,
    StateStatus,
    StopReceipt,
    VerifyReceipt,
    ViolationInfo,
    WireModel,
)
from piwf.server import answers
from piwf.server.commands import CommandResult, DurableCommands
from piwf.server.loop import EventLoop, Reply, Timer
from piwf.server.resolver_jobs import ResolverJobs
from piwf.state import Adopted, Applied, Conflict, RecoveryRequired, StateDatabase, Transaction
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state import runs as run_store
from piwf.state.backup import backup_database
from piwf.state.diagnostics import find_violations, status_counts
from piwf.state.enums import ActorType, SourceType, SubmissionSource
from piwf.state.leases import Claim
from piwf.state.records import Actor

log = logging.getLogger("piwf.server")

P = TypeVar("P", bound=WireModel)


_CLIENT_RUN_ID = re.compile(r"run-[A-Za-z0-9_-]{8,64}")


class InvalidPayloadError(PiwfError):
    """A request payload does not match its operation's schema; nothing was done."""

    code = "invalidPayload"


class UnknownRunError(PiwfError):
    """The request names a run that does not exist."""

    code = "runNotFound"


class UnknownEffectError(PiwfError):
    """The request names an effect that does not exist."""

    code = "effectNotFound"


@dataclass
class _Waiter:
    reply: Reply
    request_id: str
    timer: Timer


@dataclass
class ServerContext:
    """What handlers may use; the lifecycle builds it once per server process."""

    db: StateDatabase
    commands: DurableCommands
    loop: EventLoop
    resolvers: ResolverJobs
    home: Path
    epoch: int
    max_workers: int
    connection_count: Callable[[], int]
    request_stop: Callable[[], None]
    server_id: str = "server"
    run_lease_ms: int = 30_000
    active_runners: Callable[[], int] = lambda: 0
    active_claim: Callable[[str], Claim | None] = lambda _run_id: None
    stop_runner: Callable[[str, str], None] = lambda _run_id, _reason: None
    wake_scheduler: Callable[[], None] = lambda: None
    waiters: dict[str, list[_Waiter]] = field(default_factory=dict)
    starts_in_flight: dict[tuple[str, str], list[tuple[Request, Reply]]] = field(
        default_factory=dict
    )
    #: Client-chosen run ids whose start is still resolving → controls that wait for it.
    pending_run_ids: dict[str, list[tuple[Request, Reply]]] = field(default_factory=dict)


class Handlers:
    """Maps every operation name to its handler."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context
        self.table: dict[str, Callable[[Request, Reply], None]] = {
            "server.status": self.server_status,
            "server.stop": self.server_stop,
            "run.start": self.run_start,
            "run.list": self.run_list,
            "run.get": self.run_get,
            "run.cancel": self.run_cancel,
            "run.pause": self.run_pause,
            "run.resume": self.run_resume,
            "run.restart": self.run_restart,
            "effect.resolve": self.effect_resolve,
            "run.wait": self.run_wait,
            "state.status": self.state_status,
            "state.verify": self.state_verify,
            "state.backup": self.state_backup,
            "checkpoint.answer": self.checkpoint_answer,
            "decision.answer": self.decision_answer,
            "requests.list": self.requests_list,
        }

    def handle(self, request: Request, reply: Reply) -> None:
        """Dispatch one request; unsupported operations are rejected, never ignored."""
        handler = self.table.get(request.operation)
        if handler is None:
            reply(
                _error(
                    request,
                    "rejected",
                    "unsupportedOperation",
                    f"{request.operation} is not supported by this server yet",
                )
            )
            return
        try:
            handler(request, reply)
        except InvalidPayloadError as error:
            reply(_error(request, "rejected", error.code, str(error)))

    # -- server ---------------------------------------------------------------------------

    def server_status(self, request: Request, reply: Reply) -> None:
        _payload(request, EmptyPayload)
        with self.context.db.read() as tx:
            counts = status_counts(tx)
        runs = _int_map(counts["runs"])
        status = ServerStatus(
            state="running",
            epoch=self.context.epoch,
            package_version=__version__,
            socket_available=True,
            max_workers=self.context.max_workers,
            active_runners=self.context.active_runners(),
            connections=self.context.connection_count(),
            queued_runs=runs.get("queued", 0),
            running_runs=runs.get("running", 0),
            waiting_runs=runs.get("waiting", 0),
            paused_runs=_int(counts["pausedRuns"]),
            expired_claims=_int(counts["expiredLeases"]),
            pending_interactions=_int(counts["pendingRequests"]),
            ambiguous_effects=_int(counts["ambiguousEffects"]),
        )
        reply(_ok(request, status))

    def server_stop(self, request: Request, reply: Reply) -> None:
        _payload(request, EmptyPayload)
        response = self.context.commands.execute(
            request, lambda _tx: CommandResult.accepted(StopReceipt(stopping=True).to_wire())
        )
        reply(response)
        self.context.request_stop()

    # -- runs -----------------------------------------------------------------------------

    def run_start(self, request: Request, reply: Reply) -> None:
        """Resolve the workflow in a child, then commit a queued run and answer.

        A client may choose the run id (``runId`` in the envelope, ``run-`` + 8..64 letters,
        digits, ``_`` or ``-``); controls naming that id while the start is still resolving wait
        for it, so a pipelined start + cancel cancels the run before any runner starts.
        """
        payload = _payload(request, RunStartPayload)
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
                    _error(
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
        first_request, _ = waiting[0]
        if isinstance(result, PiwfError):
            change = lambda _tx: CommandResult.failed("rejected", result)  # noqa: E731
        elif result.get("ok") is not True:
            error = _resolver_error(result)
            change = lambda _tx: CommandResult.failed("rejected", error)  # noqa: E731
        else:
            new_run = _new_run(payload, result)
            chosen = first_request.run_id
            change = lambda tx: self._create_run(tx, new_run, chosen)  # noqa: E731
        response = self.context.commands.execute(first_request, change)
        for request, reply in waiting:
            if request is first_request:
                reply(response)
            else:
                answer = self.context.commands.lookup(request)
                reply(answer if answer is not None else response)
        # Controls that waited for this start run now, before the scheduler can admit the run.
        for request, reply in self.context.pending_run_ids.pop(first_request.run_id or "", []):
            self.handle(request, reply)
        self.context.wake_scheduler()

    def _create_run(
        self, tx: Transaction, new_run: run_store.NewRun, chosen_run_id: str | None
    ) -> CommandResult:
        run_id = chosen_run_id or run_store.new_run_id()
        if run_store.get_run(tx, run_id) is not None:
            return CommandResult.failed("conflict", RunCommandError(f"run {run_id} already exists"))
        view = run_store.create_run(tx, run_id, new_run, Actor(ActorType.CLIENT))
        receipt = RunReceipt(run=_run_info(view)).to_wire()
        return CommandResult.accepted(receipt, run_id=run_id, revision=view.revision)

    def run_list(self, request: Request, reply: Reply) -> None:
        payload = _payload(request, RunListPayload)
        before = (
            None if payload.before is None else (payload.before.created_at, payload.before.run_id)
        )
        with self.context.db.read() as tx:
            views = run_store.list_runs(tx, limit=payload.limit + 1, before=before)
        page = views[: payload.limit]
        cursor = None
        if len(views) > payload.limit:
            cursor = RunCursor(created_at=page[-1].created_at, run_id=page[-1].run_id)
        reply(_ok(request, RunPage(runs=[_run_info(v) for v in page], next_cursor=cursor)))

    def run_get(self, request: Request, reply: Reply) -> None:
        _payload(request, EmptyPayload)
        run_id = _run_id(request)
        with self.context.db.read() as tx:
            view = run_store.get_run(tx, run_id)
            sources = run_store.list_run_sources(tx, run_id) if view is not None else []
            output = run_store.read_run_final_output(tx, run_id) if view is not None else None
            error = run_store.read_run_error(tx, run_id) if view is not None else None
            run_effects = [] if view is None else fx.list_effects(tx, f"run:{run_id}")
            waiting = None if view is None else answers.waiting_on(tx, run_id)
            audit = [] if view is None else answers.decision_infos(tx, run_id)
        if view is None:
            reply(_not_found(request, run_id))
            return
        detail = RunDetail(
            run=_run_info(view),
            sources=[
                RunSource(
                    mount_path=source.mount_path,
                    source_type=source.source_type.value,
                    source_ref=source.source_ref,
                    source_revision=source.source_revision,
                )
                for source in sources
            ],
            effects=[_effect_info(effect) for effect in run_effects],
            output=output,
            error=error,
            waiting_on=waiting,
            decisions=audit,
        )
        reply(_ok(request, detail, revision=view.revision))

    def run_cancel(self, request: Request, reply: Reply) -> None:
        """Cancel in one transaction (receipt included), then stop the fenced child."""
        self._control(request, reply, ex.cancel_run, stop_reason="cancelled")

    def run_pause(self, request: Request, reply: Reply) -> None:
        """Pause: flag, park and release the claim atomically, then stop the child."""
        self._control(request, reply, ex.pause_run, stop_reason="paused")

    def _control(
        self,
        request: Request,
        reply: Reply,
        transition: Callable[..., object],
        *,
        stop_reason: str,
    ) -> None:
        _payload(request, EmptyPayload)
        run_id = _run_id(request)
        waiting = self.context.pending_run_ids.get(run_id)
        if waiting is not None:
            waiting.append((request, reply))  # its start is still resolving
            return
        context = self.context

        def change(tx: Transaction) -> CommandResult:
            if run_store.get_run(tx, run_id) is None:
                return CommandResult.failed("notFound", UnknownRunError(f"no run {run_id}"))
            result = transition(
                tx,
                run_id,
                actor=Actor(ActorType.CLIENT),
                control_owner_id=context.server_id,
                lease_ms=context.run_lease_ms,
                expected_revision=request.expected_revision,
                claim=context.active_claim(run_id),
            )
            return _run_result(result, run_id)

        response = context.commands.execute(request, change)
        reply(response)
        if response.outcome == "accepted":
            context.stop_runner(run_id, stop_reason)
        self.notify_run_changed(run_id)

    def run_resume(self, request: Request, reply: Reply) -> None:
        """Make a paused or parked run eligible again (the only way out of a blocking park)."""
        _payload(request, EmptyPayload)
        run_id = _run_id(request)

        def change(tx: Transaction) -> CommandResult:
            if run_store.get_run(tx, run_id) is None:
                return CommandResult.failed("notFound", UnknownRunError(f"no run {run_id}"))
            result = ex.resume_run(
                tx,
                run_id,
                actor=Actor(ActorType.CLIENT),
                expected_revision=request.expected_revision,
            )
            return _run_result(result, run_id)

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()

    def run_restart(self, request: Request, reply: Reply) -> None:
        """Queue a fresh run of a terminal run's workflow from its first node."""
        _payload(request, EmptyPayload)
        run_id = _run_id(request)

        def change(tx: Transaction) -> CommandResult:
            if run_store.get_run(tx, run_id) is None:
                return CommandResult.failed("notFound", UnknownRunError(f"no run {run_id}"))
            result = ex.restart_run(
                tx, run_id, new_run_id=run_store.new_run_id(), actor=Actor(ActorType.CLIENT)
            )
            return _run_result(result, run_id)

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()

    def run_wait(self, request: Request, reply: Reply) -> None:
        payload = _payload(request, RunWaitPayload)
        run_id = _run_id(request)
        with self.context.db.read() as tx:
            view = run_store.get_run(tx, run_id)
        if view is None:
            reply(_not_found(request, run_id))
            return
        if view.finished_at is not None or payload.timeout_ms == 0:
            timed_out = view.finished_at is None
            reply(_ok(request, RunWaitReceipt(run=_run_info(view), timed_out=timed_out)))
            return
        waiters = self.context.waiters.setdefault(run_id, [])

        def expire() -> None:
            still_waiting = [w for w in waiters if w.request_id != request.request_id]
            waiters[:] = still_waiting
            self._answer_wait(request, reply, run_id, timed_out=True)

        timer = self.context.loop.call_later(payload.timeout_ms / 1000, expire)
        waiters.append(_Waiter(reply, request.request_id, timer))

    def notify_run_changed(self, run_id: str) -> None:
        """Answer every ``run.wait`` on ``run_id`` if the run is now terminal."""
        waiters = self.context.waiters.get(run_id)
        if not waiters:
            return
        with self.context.db.read() as tx:
            view = run_store.get_run(tx, run_id)
        if view is None or view.finished_at is None:
            return
        for waiter in self.context.waiters.pop(run_id, []):
            waiter.timer.cancel()
            waiter.reply(
                Response(
                    request_id=waiter.request_id,
                    outcome="accepted",
                    receipt=RunWaitReceipt(run=_run_info(view), timed_out=False).to_wire(),
                )
            )

    def _answer_wait(self, request: Request, reply: Reply, run_id: str, *, timed_out: bool) -> None:
        with self.context.db.read() as tx:
            view = run_store.get_run(tx, run_id)
        if view is None:
            reply(_not_found(request, run_id))
            return
        reply(_ok(request, RunWaitReceipt(run=_run_info(view), timed_out=timed_out)))

    # -- checkpoints and decisions --------------------------------------------------------

    def checkpoint_answer(self, request: Request, reply: Reply) -> None:
        """Answer a checkpoint as a client; a protected decision refuses this path."""
        self._answer(request, reply, SubmissionSource.CLIENT)

    def decision_answer(self, request: Request, reply: Reply) -> None:
        """Answer a checkpoint or a protected decision as a person."""
        self._answer(request, reply, SubmissionSource.HUMAN)

    def _answer(self, request: Request, reply: Reply, source: SubmissionSource) -> None:
        payload = _payload(request, AnswerPayload)
        response = self.context.commands.execute(
            request, answers.answer_change(request, payload, source)
        )
        reply(response)
        if response.outcome in ("accepted", "adopted"):
            self.context.wake_scheduler()

    def requests_list(self, request: Request, reply: Reply) -> None:
        payload = _payload(request, RequestsListPayload)
        reply(_ok(request, answers.list_requests(self.context.db, payload)))

    # -- effects --------------------------------------------------------------------------

    def effect_resolve(self, request: Request, reply: Reply) -> None:
        """Record an operator's decision on an ambiguous effect (``applied`` or ``retry``)."""
        payload = _payload(request, EffectResolvePayload)

        def change(tx: Transaction) -> CommandResult:
            effect = fx.get_effect(tx, payload.effect_id)
            if effect is None:
                return CommandResult.failed(
                    "notFound", UnknownEffectError(f"no effect {payload.effect_id}")
                )
            result = fx.resolve_ambiguous(
                tx,
                payload.effect_id,
                resolution=payload.resolution,
                actor=Actor(ActorType.HUMAN, request.client_id),
                note=payload.note,
            )
            if isinstance(result, Conflict):
                return CommandResult.failed("rejected", RunCommandError(result.evidence))
            receipt = EffectReceipt(effect=_effect_info(result.value)).to_wire()
            return CommandResult.accepted(receipt)

        reply(self.context.commands.execute(request, change))

    # -- state ----------------------------------------------------------------------------

    def state_status(self, request: Request, reply: Reply) -> None:
        _payload(request, EmptyPayload)
        with self.context.db.read() as tx:
            counts = status_counts(tx)
        status = StateStatus(
            runs=_int_map(counts["runs"]),
            queue=_int_map(counts["queue"]),
            paused_runs=_int(counts["pausedRuns"]),
            active_leases=_int(counts["activeLeases"]),
            expired_leases=_int(counts["expiredLeases"]),
            unsettled_effects=_int(counts["unsettledEffects"]),
            ambiguous_effects=_int(counts["ambiguousEffects"]),
            events=_int(counts["events"]),
            blobs=_int(counts["blobs"]),
            database_bytes=_int(counts["databaseBytes"]),
        )
        reply(_ok(request, status))

    def state_verify(self, request: Request, reply: Reply) -> None:
        _payload(request, EmptyPayload)
        with self.context.db.read() as tx:
            violations = find_violations(tx)
        receipt = VerifyReceipt(
            valid=not violations,
            violations=[ViolationInfo(code=v.code, detail=v.detail) for v in violations],
        )
        reply(_ok(request, receipt))

    def state_backup(self, request: Request, reply: Reply) -> None:
        payload = _payload(request, StateBackupPayload)
        earlier = self.context.commands.lookup(request)
        if earlier is not None:
            reply(earlier)
            return
        try:
            report = backup_database(self.context.db, Path(payload.destination))
        except PiwfError as error:
            reply(self.context.commands.store(request, CommandResult.failed("rejected", error)))
            return
        receipt = BackupReceipt(destination=str(report.destination), bytes=report.byte_length)
        reply(self.context.commands.store(request, CommandResult.accepted(receipt.to_wire())))


def _effect_info(effect: fx.Effect) -> EffectInfo:
    return EffectInfo(
        effect_id=effect.effect_id,
        effect_type=effect.effect_type,
        recovery=effect.recovery.value,
        status=effect.status.value,
        attempt_count=effect.attempt_count,
    )


def _run_result(result: object, run_id: str) -> CommandResult:
    """Turn a typed run transition result into a stored command result."""
    if isinstance(result, Conflict):
        return CommandResult.failed("rejected", RunCommandError(result.evidence), run_id=run_id)
    if isinstance(result, RecoveryRequired):
        return CommandResult.failed("rejected", RunCommandError(result.reason), run_id=run_id)
    assert isinstance(result, (Applied, Adopted))
    view = result.value
    assert isinstance(view, run_store.RunView)
    receipt = RunReceipt(run=_run_info(view)).to_wire()
    return CommandResult.accepted(receipt, run_id=view.run_id, revision=view.revision)


def _payload(request: Request, model: type[P]) -> P:
    try:
        return model.model_validate(request.payload)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        raise InvalidPayloadError(f"{request.operation} payload: {where}: {first['msg']}") from None


def _run_id(request: Request) -> str:
    if request.run_id is None:
        raise InvalidPayloadError(f"{request.operation} needs a runId")
    return request.run_id


def _new_run(payload: RunStartPayload, result: dict[str, JsonValue]) -> run_store.NewRun:
    sources_json = result["sources"]
    assert isinstance(sources_json, dict)
    root = sources_json["root"]
    mounted = sources_json["mounted"]
    assert isinstance(root, dict)
    assert isinstance(mounted, list)
    files = [("", root)]
    files += [(str(item["location"]), item) for item in mounted if isinstance(item, dict)]
    sources = [
        run_store.SourceFile(
            mount_path=mount,
            source_type=SourceType.BUILTIN
            if str(entry["location"]).startswith("builtin:")
            else SourceType.FILE,
            source_ref=str(entry["location"]),
            source_revision=str(entry["sha256"]),
        )
        for mount, entry in files
    ]
    digest = result["definitionDigest"]
    assert isinstance(digest, str)
    title = payload.title if payload.title is not None else result.get("title")
    return run_store.NewRun(
        workflow_ref=str(result["workflowRef"]),
        workflow_name=str(result["workflowName"]),
        definition_digest=bytes.fromhex(digest),
        definition_snapshot=result["snapshot"],
        input=payload.input,
        sources=sources,
        title=title if isinstance(title, str) else None,
        project_path=payload.project_path,
    )


def _resolver_error(result: dict[str, JsonValue]) -> PiwfError:
    from piwf.errors import WorkflowLoadError

    error = result.get("error")
    message = "the workflow could not be loaded"
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message = str(error["message"])
    return WorkflowLoadError(message)


def _run_info(view: run_store.RunView) -> RunInfo:
    return RunInfo.model_validate(view.to_json())


def _ok(request: Request, receipt: WireModel, *, revision: int | None = None) -> Response:
    return Response(
        request_id=request.request_id,
        outcome="accepted",
        receipt=receipt.to_wire(),
        revision=revision,
    )


def _error(request: Request, outcome: str, code: str, message: str) -> Response:
    return Response(
        request_id=request.request_id,
        outcome=outcome,  # type: ignore[arg-type]
        error=ErrorInfo(code=code, message=message[:1000]),
    )


def _not_found(request: Request, run_id: str) -> Response:
    return _error(request, "notFound", "runNotFound", f"no run {run_id}")


def _int(value: JsonValue) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _int_map(value: JsonValue) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {key: _int(item) for key, item in value.items()}
