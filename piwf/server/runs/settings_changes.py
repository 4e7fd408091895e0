"""``run.settings`` and ``run.changeSettings``: reading and changing a run's live settings.

A change is judged in three steps, and nothing is written unless all pass::

    1  read: the run (not terminal), its newest scope of ``mountPath``, the actor (``human``,
       or the origin session's active coordinator epoch: ``session``), the grants in the
       run's definition snapshot, the patch applied to the newest value (pure JSON)
    2  the workflow's ``parse``, if it declares one: in a resolver child, from the run's
       recorded sources (the server runs no workflow code)
    3  write, with the command's receipt: the change, on top of the change step 1 read (else
       ``settingsConflict``: a newer change came first), event ``settings.changed``

The request's idempotency key is the change's request id: a retry adopts the first answer,
and the same key can never make two changes. A change reaches only attempts that start after
it; the run's revision does not move, so a working runner keeps its authority.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import (
    PiwfError,
    SessionAuthorityError,
    SettingsChangeError,
    SettingsConflictError,
    WorkflowLoadError,
)
from piwf.json_patch import JsonPatchError, apply_patch, parse_patch
from piwf.lifecycle import Conflict, RunStatus
from piwf.protocol.client_v1 import Outcome, Request, Response
from piwf.protocol.settings_payloads import (
    RunChangeSettingsPayload,
    RunSettings,
    RunSettingsPayload,
    SettingsChangeInfo,
    SettingsChangeReceipt,
    SettingsScopeInfo,
)
from piwf.server.commands import CommandResult
from piwf.server.context import ServerContext
from piwf.server.failures import answering, failure_response
from piwf.server.loop import Reply
from piwf.server.replies import error_response, not_found, ok, payload_of, run_id_of
from piwf.server.runs.recorded_sources import workflow_source
from piwf.settings_grants import mount_paths, patch_refusal, readable, scope_structure
from piwf.state import Transaction, blobs
from piwf.state.enums import ActorType
from piwf.state.execution import messages, settings
from piwf.state.execution import runs as run_store
from piwf.state.records import Actor
from piwf.workflow.settings import MAX_SETTINGS_BYTES

#: ``run.settings`` shows at most this many of a mount's entries (a loop that enters a mount
#: with settings adds one on every entry), the newest, and only as many as fit in
#: :data:`SHOWN_SCOPE_BYTES` (at least one): each may hold a value of up to 64 KiB.
SHOWN_SCOPES = 10
SHOWN_SCOPE_BYTES = 512 * 1024

_TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED}
)


@dataclass(frozen=True)
class _Proposal:
    """A change that passed step 1: what it is based on and the value it makes."""

    run_id: str
    scope: settings.ScopeRow
    structure: Mapping[str, JsonValue]
    actor: Actor
    patch: JsonValue
    value: JsonValue
    check: dict[str, JsonValue] | None


class SettingsHandlers:
    """The live-settings operations of one server."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context

    def run_settings(self, request: Request, reply: Reply) -> None:
        """Every scope of the run (of ``mountPath``), as far as a person may read it."""
        payload = payload_of(request, RunSettingsPayload)
        run_id = run_id_of(request)
        with self.context.db.read() as tx:
            run = run_store.load_run(tx, run_id)
            if run is None:
                reply(not_found(request, run_id, self.context.home))
                return
            snapshot = blobs.read_json(tx, run.definition_digest)
            scopes = _newest_that_fit(
                _scope_info(tx, scope, snapshot, "human")
                for scope in settings.mount_scopes(tx, run_id, payload.mount_path, SHOWN_SCOPES)
            )
            scope_count = settings.count_scopes(tx, run_id, payload.mount_path)
        if not scopes and scope_structure(snapshot, payload.mount_path) is None:
            error = SettingsChangeError(_no_settings(snapshot, payload.mount_path))
            reply(error_response(request, "notFound", error.code, str(error)))
            return
        reply(ok(request, RunSettings(run_id=run_id, scopes=scopes, scope_count=scope_count)))

    def run_change_settings(self, request: Request, reply: Reply) -> None:
        """Judge the patch (steps 1 and 2), then commit it with the receipt (step 3)."""
        payload = payload_of(request, RunChangeSettingsPayload)
        run_id = run_id_of(request)
        earlier = self.context.commands.lookup(request)
        if earlier is not None:
            reply(earlier)
            return
        try:
            proposal = self._propose(request, payload, run_id)
        except SettingsConflictError as error:
            reply(self._refuse(request, "conflict", error))
            return
        except (SettingsChangeError, SessionAuthorityError) as error:
            reply(self._refuse(request, "rejected", error))
            return
        except LookupError:
            reply(not_found(request, run_id, self.context.home))
            return
        if proposal.check is None:
            self._commit(request, reply, proposal, proposal.value)
            return

        def checked(result: dict[str, JsonValue] | PiwfError) -> None:
            with answering(request, reply):
                if isinstance(result, PiwfError):  # the child died or overran: try again
                    reply(error_response(request, "unavailable", result.code, str(result)))
                elif result.get("ok") is not True:
                    reply(self._refuse(request, "rejected", _check_refusal(result)))
                else:
                    self._commit(request, reply, proposal, result.get("value"))

        try:
            self.context.resolvers.resolve(proposal.check, checked)
        except PiwfError as error:
            reply(failure_response(request, error))

    def _propose(
        self, request: Request, payload: RunChangeSettingsPayload, run_id: str
    ) -> _Proposal:
        """Step 1; raises :class:`SettingsChangeError` (or ``LookupError``: no such run)."""
        with self.context.db.read() as tx:
            run = run_store.load_run(tx, run_id)
            if run is None:
                raise LookupError(run_id)
            if run.status in _TERMINAL:
                raise SettingsChangeError(
                    f"run {run_id} is {run.status.value}: its settings can no longer change"
                )
            snapshot = blobs.read_json(tx, run.definition_digest)
            structure = scope_structure(snapshot, payload.mount_path)
            if structure is None:
                raise SettingsChangeError(_no_settings(snapshot, payload.mount_path))
            scope = settings.newest_scope(tx, run_id, payload.mount_path)
            if scope is None:
                raise SettingsChangeError(
                    f"run {run_id} has not started the workflow at "
                    f"{payload.mount_path or 'the root'!r} yet, so it has no settings to change;"
                    " change them once its first node has started"
                )
            actor = self._actor(tx, request, run_id, payload.coordinator_epoch)
            source = workflow_source(tx, run_id) if structure.get("parses") is True else None
            definition_digest = run.definition_digest.hex()
            project_path = run.project_path
        if payload.expected_change is not None and payload.expected_change != scope.change_number:
            raise SettingsConflictError(
                f"the settings are at change {scope.change_number}, not "
                f"{payload.expected_change}: read them (piwf run settings {run_id}) and patch again"
            )
        try:
            operations = parse_patch(payload.patch)
            refusal = patch_refusal(structure, operations, actor.actor_type.value)
            if refusal is not None:
                raise SettingsChangeError(refusal)
            value = apply_patch(scope.value, operations)
        except JsonPatchError as error:
            raise SettingsChangeError(f"the patch does not apply: {error}") from None
        _check_size(value)
        check: dict[str, JsonValue] | None = None
        if source is not None:
            check = {
                "kind": "settingsCheck",
                "workflowSource": source,
                "definitionDigest": definition_digest,
                "mountPath": payload.mount_path,
                "projectPath": project_path,
                "value": value,
            }
        patch: JsonValue = list(payload.patch)
        return _Proposal(run_id, scope, structure, actor, patch, value, check)

    def _actor(self, tx: Transaction, request: Request, run_id: str, epoch: str | None) -> Actor:
        """A person, or (with a coordinator epoch) the run's origin session."""
        if epoch is None:
            return Actor(ActorType.HUMAN, request.client_id)
        session_id = messages.session_of(tx, run_id)
        if session_id is None:
            raise SessionAuthorityError(
                f"run {run_id} has no origin session; change its settings without a"
                " coordinator epoch (as a person)"
            )
        if not self.context.coordinators.is_active(session_id, epoch):
            raise SessionAuthorityError(
                f"only the active coordinator of session {session_id} may change settings as"
                " the session"
            )
        return Actor(ActorType.SESSION, session_id)

    def _commit(
        self, request: Request, reply: Reply, proposal: _Proposal, value: JsonValue
    ) -> None:
        def change(tx: Transaction) -> CommandResult:
            _check_size(value)  # a parse may have grown it (a refusal is stored like any)
            key = request.idempotency_key or request.request_id
            scope = proposal.scope
            earlier = settings.change_by_request(tx, scope.scope_id, key)
            if earlier is None:
                accepted = settings.accept_change(
                    tx,
                    scope,
                    based_on=scope.change_number,
                    request_id=key,
                    actor=proposal.actor,
                    patch=proposal.patch,
                    value=value,
                )
                if isinstance(accepted, Conflict):
                    conflict = SettingsConflictError(
                        f"{accepted.evidence}: a newer change was accepted first; read the"
                        f" settings (piwf run settings {proposal.run_id}) and patch again"
                    )
                    return CommandResult.failed("conflict", conflict, run_id=proposal.run_id)
            newest = settings.newest_scope(tx, proposal.run_id, scope.mount_path) or scope
            snapshot: JsonValue = {"workflow": {"settings": dict(proposal.structure)}}
            info = _scope_info(tx, newest, snapshot, proposal.actor.actor_type.value, root=True)
            receipt = SettingsChangeReceipt(run_id=proposal.run_id, scope=info)
            return CommandResult.accepted(receipt.to_wire(), run_id=proposal.run_id)

        try:
            reply(self.context.commands.execute(request, change))
        except Exception as error:
            reply(failure_response(request, error))

    def _refuse(self, request: Request, outcome: Outcome, error: PiwfError) -> Response:
        """Store the refusal as the command's receipt, so a retry gets the same answer."""
        return self.context.commands.execute(
            request,
            lambda _tx: CommandResult.failed(outcome, error, run_id=request.run_id),
        )


def _newest_that_fit(infos: Iterable[SettingsScopeInfo]) -> list[SettingsScopeInfo]:
    """The scopes (oldest first) that fit in :data:`SHOWN_SCOPE_BYTES`, kept from the newest
    back; the newest is always kept (one scope is bounded by the settings size limit)."""
    kept: list[SettingsScopeInfo] = []
    size = 0
    for info in reversed(list(infos)):
        size += len(canonical.encode(info.to_wire()))
        if kept and size > SHOWN_SCOPE_BYTES:
            break
        kept.append(info)
    return kept[::-1]


def _scope_info(
    tx: Transaction,
    scope: settings.ScopeRow,
    snapshot: JsonValue,
    actor: str,
    *,
    root: bool = False,
) -> SettingsScopeInfo:
    structure = scope_structure(snapshot, "" if root else scope.mount_path) or {}
    description = structure.get("description")
    paths = structure.get("paths")
    changes = [
        SettingsChangeInfo(
            change_number=change.change_number,
            actor=change.actor_type,
            accepted_at=change.accepted_at_ms,
            patch=change.patch if isinstance(change.patch, list) else [],
        )
        for change in settings.recent_changes(tx, scope.scope_id)
    ]
    return SettingsScopeInfo(
        mount_path=scope.mount_path,
        invocation=scope.invocation,
        change_number=scope.change_number,
        value=readable(structure, scope.value, actor),
        description=description if isinstance(description, str) else None,
        paths=[path for path in paths if isinstance(path, dict)] if isinstance(paths, list) else [],
        changes=changes,
    )


def _check_size(value: JsonValue) -> None:
    from piwf import canonical

    if len(canonical.encode(value)) > MAX_SETTINGS_BYTES:
        raise SettingsChangeError(f"the patched settings pass {MAX_SETTINGS_BYTES} bytes")


def _check_refusal(result: dict[str, JsonValue]) -> PiwfError:
    """The typed error of a settings check the child refused: ``parse`` said no, or the
    workflow could not be loaded from its recorded sources."""
    error = result.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    text = message if isinstance(message, str) else "the settings check failed"
    if code == SettingsChangeError.code:
        return SettingsChangeError(text)
    return WorkflowLoadError(text)


def _no_settings(snapshot: JsonValue, mount_path: str) -> str:
    """Why the workflow at ``mount_path`` has no settings: it declares none, or the run's
    workflow mounts nothing there (then the message lists its mounts, not the path asked)."""
    mounts = mount_paths(snapshot)
    if mount_path and mount_path not in mounts:
        known = f"its mounts: {', '.join(mounts)}" if mounts else "it mounts none"
        return (
            f"the run's workflow mounts no workflow at that path ({known}); give one of its "
            "mount paths, or none for the run's own workflow"
        )
    where = f"the workflow mounted at {mount_path!r}" if mount_path else "the run's workflow"
    return f"{where} declares no live settings (define_workflow(settings=workflow_settings(...)))"
