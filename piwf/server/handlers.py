"""Operation handlers: validate the payload, run the store operation, answer.

The run operations live in :mod:`piwf.server.runs.handlers`; this module dispatches every
operation and handles the server, state, effect and answer operations.

Each handler receives the parsed request and a ``reply`` callback. Reads answer at once from one
read snapshot; durable operations go through :class:`~piwf.server.commands.DurableCommands`, so
their receipt commits with their change before the answer is sent. ``run.start`` waits for a
resolver child and ``run.wait`` for a run to finish; both answer later through ``reply``.

:meth:`Handlers.handle` is the boundary: whatever a handler raises (a damaged or full
database, an OS error, a bug) is answered at once with a typed error and logged in one safe
line (:mod:`piwf.server.failures`); no request is left waiting for its client's timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from piwf._version import __version__
from piwf.errors import BackupError, RunCommandError, StateUnavailableError
from piwf.lifecycle import Applied, Conflict, EffectStatus
from piwf.protocol.client_v1 import Request, Response
from piwf.protocol.payloads import (
    AnswerPayload,
    EffectReceipt,
    EffectResolvePayload,
    EmptyPayload,
    RequestsListPayload,
    ServerStatus,
    StopReceipt,
)
from piwf.protocol.state_payloads import (
    BackupReceipt,
    RetentionInfo,
    StateBackupPayload,
    StatePrunePayload,
    StatePrunePreviewPayload,
    StateStatus,
    VerifyReceipt,
    ViolationInfo,
)
from piwf.server import maintenance
from piwf.server.channels.handlers import ChannelHandlers
from piwf.server.commands import CommandResult
from piwf.server.content_reads import ContentReads
from piwf.server.context import ServerContext
from piwf.server.failures import answering, failure_response, log_failure
from piwf.server.loop import Reply
from piwf.server.replies import (
    InvalidPayloadError,
    UnknownEffectError,
    as_int,
    as_int_map,
    effect_info,
    error_response,
    not_found,
    ok,
    payload_of,
    unknown_effect,
)
from piwf.server.resources.handlers import ResourceHandlers
from piwf.server.runs import answers
from piwf.server.runs.handlers import RunHandlers
from piwf.server.runs.interactions import InteractionHandlers
from piwf.server.runs.logs import RunLogReads
from piwf.server.runs.settings_changes import SettingsHandlers
from piwf.server.runs.views import RunViews
from piwf.server.session_capture import CaptureHandlers
from piwf.server.sessions import SessionHandlers, refuse_without_authority
from piwf.server.workflows import WorkflowHandlers
from piwf.state import Transaction, retention
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.backup import backup_database
from piwf.state.diagnostics import server_counts, status_counts, verify_database
from piwf.state.enums import ActorType, ResourceQueueReason, ResourceType, SubmissionSource
from piwf.state.execution import runs as run_store
from piwf.state.records import Actor
from piwf.state.resources import managed

log = logging.getLogger("piwf.server")


class Handlers:
    """Maps every operation name to its handler."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context
        self.runs = RunHandlers(context, self.handle)
        self.resources = ResourceHandlers(context)
        self.interactions = InteractionHandlers(context)
        self.views = RunViews(context)
        self.sessions = SessionHandlers(context)
        self.session_capture = CaptureHandlers(context)
        self.workflows = WorkflowHandlers(context)
        self.settings = SettingsHandlers(context)
        self.table: dict[str, Callable[[Request, Reply], None]] = {}
        if context.channels is not None:
            channels = ChannelHandlers(context, context.channels)
            self.table |= {
                "channel.status": channels.status,
                "channel.reload": channels.reload,
                "channel.recover": channels.recover,
            }
        self.table |= {
            "server.status": self.server_status,
            "server.stop": self.server_stop,
            "run.start": self.runs.run_start,
            "run.list": self.runs.run_list,
            "run.get": self.runs.run_get,
            "run.cancel": self.runs.run_cancel,
            "run.pause": self.runs.run_pause,
            "run.resume": self.runs.run_resume,
            "run.restart": self.runs.run_restart,
            "run.fork": self.runs.run_fork,
            "run.settings": self.settings.run_settings,
            "run.changeSettings": self.settings.run_change_settings,
            "effect.resolve": self.effect_resolve,
            "run.wait": self.runs.run_wait,
            "run.logs": RunLogReads(context).run_logs,
            "state.status": self.state_status,
            "state.verify": self.state_verify,
            "state.backup": self.state_backup,
            "state.prunePreview": self.state_prune_preview,
            "state.prune": self.state_prune,
            "checkpoint.answer": self.checkpoint_answer,
            "decision.answer": self.decision_answer,
            "requests.list": self.requests_list,
            "interaction.submit": self.interactions.interaction_submit,
            "interaction.update": self.interactions.interaction_update,
            "resource.apply": self.resources.apply,
            "resource.get": self.resources.get,
            "resource.list": self.resources.list,
            "resource.delete": self.resources.delete,
            "resource.reconcile": self.resources.reconcile,
            "view.content": ContentReads(context).view_content,
            "view.run.get": self.views.view_run_get,
            "view.page": self.views.view_page,
            "session.view": self.sessions.session_view,
            "session.list": self.sessions.session_list,
            "workflowMessage.reportBranch": self.sessions.report_branch,
            "workflowTurn.report": self.sessions.turn_report,
            "followUp.queue": self.sessions.follow_up_queue,
            "followUp.remove": self.sessions.follow_up_remove,
            "sessionCapture.record": self.session_capture.record,
            "sessionCapture.read": self.session_capture.read,
            "workflow.list": self.workflows.workflow_list,
            "workflow.show": self.workflows.workflow_show,
        }

    def handle(self, request: Request, reply: Reply) -> None:
        """Dispatch one request; unsupported operations are rejected, never ignored.

        Anything the handler raises becomes a typed answer at once (``unavailable`` for a
        database that cannot serve, ``rejected`` otherwise; see :mod:`piwf.server.failures`).
        """
        handler = self.table.get(request.operation)
        if handler is None:
            reply(
                error_response(
                    request,
                    "rejected",
                    "unsupportedOperation",
                    f"{request.operation} is not supported by this server yet",
                )
            )
            return
        with answering(request, reply):
            try:
                handler(request, reply)
            except InvalidPayloadError as error:
                reply(error_response(request, "rejected", error.code, str(error)))

    def notify_run_changed(self, run_id: str) -> None:
        """Answer the ``run.wait`` requests of a run that became terminal."""
        self.runs.notify_run_changed(run_id)

    # -- server ---------------------------------------------------------------------------

    def server_status(self, request: Request, reply: Reply) -> None:
        payload_of(request, EmptyPayload)
        with self.context.db.read() as tx:
            counts = server_counts(tx)
            agent_deadlines = ex.count_open_agent_deadlines(tx)
        status = ServerStatus(
            state="running",
            epoch=self.context.epoch,
            pid=os.getpid(),
            package_version=__version__,
            socket_available=True,
            max_workers=self.context.max_workers,
            active_runners=self.context.active_runners(),
            connections=self.context.connection_count(),
            queued_runs=counts["queued"],
            running_runs=counts["running"],
            waiting_runs=counts["waiting"],
            parked_runs=counts["parked"],
            parked_by_reason={
                key.removeprefix("parked:"): number
                for key, number in counts.items()
                if key.startswith("parked:")
            },
            paused_runs=counts["paused"],
            expired_claims=counts["expiredLeases"],
            pending_interactions=counts["pendingRequests"],
            agent_deadlines=agent_deadlines,
            ambiguous_effects=counts["ambiguousEffects"],
        )
        reply(ok(request, status))

    def server_stop(self, request: Request, reply: Reply) -> None:
        """Store the stop receipt and answer, then stop; the server stops even when the receipt
        cannot be stored (a full or damaged database): it answers that error first.

        A ``conflict`` (the idempotency key was used for another command) is the one answer
        that does not stop the server: that request was refused, and nothing may change.
        """
        payload_of(request, EmptyPayload)
        stop = True
        try:
            response = self.context.commands.execute(
                request, lambda _tx: CommandResult.accepted(StopReceipt(stopping=True).to_wire())
            )
            stop = response.outcome != "conflict"
        except Exception as error:
            response = failure_response(request, error)
        finally:
            if stop:
                self.context.request_stop()
        reply(response)

    # -- checkpoints and decisions --------------------------------------------------------

    def checkpoint_answer(self, request: Request, reply: Reply) -> None:
        """Answer a checkpoint as a client; a protected decision refuses this path."""
        self._answer(request, reply, SubmissionSource.CLIENT)

    def decision_answer(self, request: Request, reply: Reply) -> None:
        """Answer a checkpoint or a protected decision as a person."""
        self._answer(request, reply, SubmissionSource.HUMAN)

    def _answer(self, request: Request, reply: Reply, source: SubmissionSource) -> None:
        payload = payload_of(request, AnswerPayload)
        if source is SubmissionSource.CLIENT:  # a person's answer needs no session authority
            refusal = refuse_without_authority(
                self.context, request, payload.request_id, payload.coordinator_epoch
            )
            if refusal is not None:
                reply(refusal)
                return
        response = self.context.commands.execute(
            request, answers.answer_change(request, payload, source, self.context.home)
        )
        reply(response)
        if response.outcome in ("accepted", "adopted"):
            self.context.wake_scheduler()

    def requests_list(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, RequestsListPayload)
        found = answers.list_requests(self.context.db, payload)
        if found is None:
            assert payload.run_id is not None  # only an unknown run leaves nothing to list
            reply(not_found(request, payload.run_id, self.context.home))
            return
        reply(ok(request, found))

    # -- effects --------------------------------------------------------------------------

    def effect_resolve(self, request: Request, reply: Reply) -> None:
        """Record an operator's decision on an ambiguous effect (``applied`` or ``retry``)."""
        payload = payload_of(request, EffectResolvePayload)

        def change(tx: Transaction) -> CommandResult:
            effect = fx.get_effect(tx, payload.effect_id)
            if effect is None:
                unknown = UnknownEffectError(unknown_effect(payload.effect_id, self.context.home))
                return CommandResult.failed("notFound", unknown)
            stopped_by = _paused_run_of_applying(tx, effect)
            if stopped_by is not None:
                refusal = RunCommandError(
                    f"effect {effect.effect_id} is not ambiguous yet: its run {stopped_by} is "
                    "paused, and the pause stopped its action while it applied. Resume the run "
                    f"(piwf run resume {stopped_by}): a manual effect then becomes ambiguous "
                    "and the run parks until this command settles it (an idempotent one is "
                    "applied again by itself)"
                )
                return CommandResult.failed("rejected", refusal)
            result = fx.resolve_ambiguous(
                tx,
                payload.effect_id,
                resolution=payload.resolution,
                actor=Actor(ActorType.HUMAN, request.client_id),
                note=payload.note,
                owner_ended=_run_ended(tx, effect.source_resource_id),
            )
            if isinstance(result, Conflict):
                return CommandResult.failed("rejected", RunCommandError(result.evidence))
            if isinstance(result, Applied):
                _wake_resource_of(tx, effect)
            receipt = EffectReceipt(
                effect=effect_info(result.value),
                # Adopted: the same resolution again, or the runner's retry already under way.
                outcome="resolved" if isinstance(result, Applied) else "unchanged",
            ).to_wire()
            return CommandResult.accepted(receipt)

        response = self.context.commands.execute(request, change)
        reply(response)
        if response.outcome == "accepted":
            self.context.wake_scheduler()

    # -- state ----------------------------------------------------------------------------

    def state_status(self, request: Request, reply: Reply) -> None:
        payload_of(request, EmptyPayload)
        with self.context.db.read() as tx:
            counts = status_counts(tx)
            swept = retention.read_status(tx)
        status = StateStatus(
            runs=as_int_map(counts["runs"]),
            queue=as_int_map(counts["queue"]),
            paused_runs=as_int(counts["pausedRuns"]),
            active_leases=as_int(counts["activeLeases"]),
            expired_leases=as_int(counts["expiredLeases"]),
            unsettled_effects=as_int(counts["unsettledEffects"]),
            ambiguous_effects=as_int(counts["ambiguousEffects"]),
            events=as_int(counts["events"]),
            blobs=as_int(counts["blobs"]),
            database_bytes=as_int(counts["databaseBytes"]),
            retention=RetentionInfo(**vars(swept)),
        )
        reply(ok(request, status))

    def state_verify(self, request: Request, reply: Reply) -> None:
        payload_of(request, EmptyPayload)
        violations = verify_database(self.context.db)
        receipt = VerifyReceipt(
            valid=not violations,
            violations=[ViolationInfo(code=v.code, detail=v.detail) for v in violations],
        )
        reply(ok(request, receipt))

    def state_backup(self, request: Request, reply: Reply) -> None:
        """Write a verified backup, then store its receipt.

        A destination to fix is a stored ``rejected`` (``backupFailed``): a retry under the same
        key gets the same answer. A full disk or an I/O error is ``unavailable`` with nothing
        stored, so the same key succeeds once space is back.
        """
        payload = payload_of(request, StateBackupPayload)
        earlier = self.context.commands.lookup(request)
        if earlier is not None:
            reply(earlier)
            return
        try:
            report = backup_database(self.context.db, Path(payload.destination))
        except StateUnavailableError as error:
            reply(failure_response(request, error))
            return
        except BackupError as error:
            log_failure(request.operation, error)
            reply(self.context.commands.store(request, CommandResult.failed("rejected", error)))
            return
        receipt = BackupReceipt(destination=str(report.destination), bytes=report.byte_length)
        reply(self.context.commands.store(request, CommandResult.accepted(receipt.to_wire())))

    def state_prune_preview(self, request: Request, reply: Reply) -> None:
        """List the trees a prune with this cutoff would delete (ids and counts only)."""
        payload = payload_of(request, StatePrunePreviewPayload)
        reply(ok(request, maintenance.preview_prune(self.context.db, payload.before)))

    def state_prune(self, request: Request, reply: Reply) -> None:
        """Back up (verified) to a new absolute path, then delete every expired tree in the
        transaction of the receipt. A backup destination to fix is a stored rejection, a full
        disk ``unavailable`` with nothing stored; either way nothing is deleted."""
        payload = payload_of(request, StatePrunePayload)
        earlier = self.context.commands.lookup(request)
        if earlier is not None:
            reply(earlier)
            return
        try:
            copy = backup_database(self.context.db, Path(payload.backup))
        except StateUnavailableError as error:
            reply(failure_response(request, error))
            return
        except BackupError as error:
            log_failure(request.operation, error)
            reply(self.context.commands.store(request, CommandResult.failed("rejected", error)))
            return
        made = BackupReceipt(destination=str(copy.destination), bytes=copy.byte_length)
        response: Response | None = None
        try:
            response = self.context.commands.execute(
                request,
                lambda tx: CommandResult.accepted(
                    maintenance.apply_prune(tx, payload.before, made).to_wire()
                ),
                own_savepoint=False,  # a savepoint per tree: see DurableCommands.execute
            )
        finally:
            if response is None or response.outcome == "unavailable":
                # Nothing was deleted and nothing stored: take the backup back too, so a retry
                # under the same key (and destination) runs afresh once the database can.
                with contextlib.suppress(OSError):
                    copy.destination.unlink()
        reply(response)
        if response.outcome == "accepted":
            log.info("prune: deleted %s tree(s)", (response.receipt or {}).get("treeCount"))
            maintenance.compact_after_prune(self.context.db, self._idle)

    def _idle(self) -> bool:
        if self.context.active_runners() or self.context.resolvers.active:
            return False
        with self.context.db.read() as tx:
            return ex.count_runnable(tx) == 0


def _paused_run_of_applying(tx: Transaction, effect: fx.Effect) -> str | None:
    """The id of an ``applying`` effect's run when that run is paused, else None. A pause
    stops the run's child, so such an effect's action is not running: it stays ``applying``
    until the resume's recovery makes it ambiguous (manual) or runs it again (idempotent)."""
    if effect.status is not EffectStatus.APPLYING:
        return None
    kind, _, run_id = effect.source_resource_id.partition(":")
    if kind != ResourceType.RUN.value:
        return None
    run = run_store.load_run(tx, run_id)
    return run_id if run is not None and run.paused and not run.terminal else None


def _wake_resource_of(tx: Transaction, effect: fx.Effect) -> None:
    """Enqueue the managed resource whose reconcile reserved ``effect`` (a resolution is an
    event: its next reconcile adopts the settled effect, or observes a retried one, at once
    rather than after a failure's backoff); nothing for a run's effect or a removed resource."""
    kind, _, uid = effect.source_resource_id.partition(":")
    if kind == ResourceType.MANAGED_RESOURCE.value and managed.get_resource_by_uid(tx, uid):
        managed.enqueue(tx, uid, ResourceQueueReason.REQUESTED)


def _run_ended(tx: Transaction, source_resource_id: str) -> bool:
    """Whether an effect's source is a run that has ended (no runner takes it up again)."""
    kind, _, run_id = source_resource_id.partition(":")
    if kind != ResourceType.RUN.value:
        return False
    run = run_store.load_run(tx, run_id)
    return run is not None and run.terminal
