"""Channel adapters: one supervised, transport-only child per configured profile.

Duties, driven by the server loop::

    start      read the profiles (an invalid file keeps the server up and shows in status),
               take each profile's next adapter epoch (what the previous adapter left applying
               becomes ambiguous), start a ``ChildKind.CHANNEL_ADAPTER`` child and send its
               launch (profile, allowed identities, its one credential, the update offset)
    serve      fence every frame (epoch, profile, sequence) before its payload; ready, settle
               and answer each commit one transaction; an answer is checked against the
               profile's allowed identities again and applied like ``decision.answer``;
               the first health report moves a started adapter to ``ready`` (its API
               answered) or ``degraded``, later ones between the two while its API fails and
               back (one log line per change)
    dispatch   (on a nudge and on the poll timer) for each ready adapter (not a degraded
               one: what it sent would be refused, and waits for a reload): present open
               protected decisions, resume sends an operator or a reload made pending, edit
               deliveries whose decision was settled (on the channel or anywhere else); every
               attempt is recorded before the adapter is asked
    reap       an adapter that ends leaves its open attempts ambiguous; it is started again
               with a bounded back-off (a new epoch), and nothing it may have sent is resent
    reload     re-read the profiles; start new ones, restart changed ones, stop removed ones

Adapter states::

    starting -> ready <-> degraded        (its API fails: unreachable, credential refused, ...)
    starting -> degraded                  (its first poll failed: it never was ready)
    starting | ready | degraded -> exited -> starting   (a new epoch, after a back-off)
    starting -> failed -> starting        (it could not be launched: a credential file, ...)
    any -> stopping -> stopped            (a reload removed or changed its profile)

The server never sees the Bot API: only the adapter does. Every durable change above is one
transaction of :mod:`piwf.server.channels.commits`; this module runs the children, their
frames and timers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from piwf.errors import PiwfError
from piwf.processes import ChildKind
from piwf.protocol.channel_payloads import ChannelReloadReceipt
from piwf.protocol.channel_v1 import (
    AnswerFrame,
    ApiProblem,
    ExitingFrame,
    HealthFrame,
    LaunchFrame,
    PresentFrame,
    PresentRequest,
    ReadyFrame,
    ResponseFrame,
    SettleFrame,
    TelegramProfile,
    fence_refusal,
    parse_child_frame,
)
from piwf.server.channels.commits import ChannelCommits
from piwf.server.channels.health import degraded_error
from piwf.server.channels.profiles import (
    ChannelConfigError,
    Profile,
    load_profiles,
    read_credential,
)
from piwf.server.children.link import ChildLink
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.loop import EventLoop, Timer
from piwf.state import StateDatabase
from piwf.state import channels as channel_store
from piwf.state.enums import ChannelAdapterType
from piwf.state.server_epoch import ServerClaim

log = logging.getLogger("piwf.server")


@dataclass(frozen=True)
class ChannelSettings:
    """Timing of adapters (tests shorten them)."""

    poll_s: float = 2.0
    restart_min_s: float = 0.5
    restart_max_s: float = 60.0
    ready_timeout_s: float = 30.0


@dataclass
class Adapter:
    """One profile's adapter child (the current one; an old epoch is forgotten).

    ``error`` says why the state is not a good one, ``problem`` which way its API fails while
    ``degraded``, ``since`` when it entered its state (epoch milliseconds).
    """

    profile: Profile
    channel_id: str
    state: str = "starting"
    since: int = 0
    problem: ApiProblem | None = None
    epoch: int = 0
    revision: int = 0
    handle: ChildHandle | None = None
    link: ChildLink | None = None
    last_sequence: int = 0
    sent_sequence: int = 0
    #: The child of this epoch reported ready (it is ``starting`` until its API answers once).
    launched: bool = False
    error: str | None = None
    failures: int = 0
    stopping: bool = False
    timers: list[Timer] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs."""
        handle = self.handle
        return None if handle is None or handle.exited else handle.pid


class ChannelAdapters:
    """Every channel adapter of one server process."""

    def __init__(
        self,
        *,
        db: StateDatabase,
        loop: EventLoop,
        supervisor: Supervisor,
        server_claim: Callable[[], ServerClaim],
        home: Path,
        settings: ChannelSettings,
        answered: Callable[[str], None],
    ) -> None:
        self.db = db
        self.loop = loop
        self.supervisor = supervisor
        self.server_claim = server_claim
        self.home = home
        self.settings = settings
        self.answered = answered
        self.commits = ChannelCommits(db, server_claim)
        self.adapters: dict[str, Adapter] = {}
        self.config_error: str | None = None
        self._dispatch_scheduled = False
        self._closed = False
        loop.every(settings.poll_s, self.nudge)

    # -- configuration ----------------------------------------------------------------------

    def start(self) -> None:
        """Read the profiles and launch one adapter each (the server's start). An invalid
        file is logged and shown in status; no adapter runs until a reload reads a valid one."""
        with contextlib.suppress(ChannelConfigError):
            self.reload()

    def reload(self) -> ChannelReloadReceipt:
        """Re-read the profiles; start, restart (profile or credential changed) and stop
        adapters to match.

        Raises :class:`ChannelConfigError` when the file cannot be used: then nothing changes
        (the running adapters keep the last valid configuration) and status shows the error
        until a reload reads a valid file.
        """
        try:
            profiles = {profile.name: profile for profile in load_profiles(self.home)}
        except ChannelConfigError as error:
            self.config_error = str(error)
            log.warning("channels: %s; nothing changed", error)
            kept = sorted(name for name, adapter in self.adapters.items() if not adapter.stopping)
            running = (
                f"{', '.join(kept)} keep{'s' if len(kept) == 1 else ''} the last valid "
                "configuration"
                if kept
                else "no adapter runs"
            )
            raise ChannelConfigError(
                f"{error}. Nothing changed ({running}); fix the file, then run "
                "piwf channel reload again"
            ) from None
        self.config_error = None
        started, restarted, stopped, unchanged = [], [], [], []
        for name in sorted(set(self.adapters) - set(profiles)):
            self._retire(self.adapters.pop(name))
            stopped.append(name)
        for name, profile in profiles.items():
            current = self.adapters.get(name)
            if current is not None and current.profile.digest == profile.digest:
                unchanged.append(name)
                continue
            if current is not None:
                self._retire(current)
                restarted.append(name)
            else:
                started.append(name)
            channel_id = channel_store.channel_id_for(ChannelAdapterType.TELEGRAM, name)
            adapter = Adapter(profile=profile, channel_id=channel_id, since=self.db.clock.now_ms())
            self.adapters[name] = adapter
            self._launch(adapter)
        return ChannelReloadReceipt(
            started=started, restarted=restarted, stopped=stopped, unchanged=unchanged
        )

    def stop_all(self) -> None:
        """Server shutdown: the supervisor stops the children; nothing is restarted."""
        self._closed = True
        for adapter in self.adapters.values():
            adapter.stopping = True
            for timer in adapter.timers:
                timer.cancel()

    def has_work(self) -> bool:
        """Whether an adapter runs (a pending channel decision keeps the server up)."""
        return any(not adapter.stopping for adapter in self.adapters.values())

    # -- launching --------------------------------------------------------------------------

    def _launch(self, adapter: Adapter) -> None:
        if self._closed or adapter.stopping or self.loop.stop_requested:
            return
        profile = adapter.profile
        try:
            credential = read_credential(self.home, profile.config.credential_file)
            begun = self.commits.begin_epoch(profile.name)
        except PiwfError as error:
            self._failed(adapter, str(error))
            return
        for effect_id in begun.interrupted:
            log.warning("channel %s: send %s may have happened: ambiguous", profile.name, effect_id)
        adapter.epoch, adapter.revision = begun.epoch, begun.revision
        adapter.last_sequence = adapter.sent_sequence = 0
        adapter.launched = False
        self._enter(adapter, "starting")
        launch = LaunchFrame(
            adapter_epoch=begun.epoch,
            profile=profile.name,
            sequence=0,
            expected_revision=begun.revision,
            attempt_id="launch",
            channel=TelegramProfile(
                api_base_url=profile.config.api_base_url,
                chat_id=profile.config.chat_id,
                allowed_identities=list(profile.config.allowed_user_ids),
                poll_timeout_s=profile.config.poll_timeout_s,
                request_timeout_s=profile.config.request_timeout_s,
            ),
            credential=credential,
            offset=begun.offset,
        )
        name = f"channel-{profile.name}-e{begun.epoch}"
        try:
            handle = self.supervisor.start(
                ChildSpec(
                    name,
                    ChildKind.CHANNEL_ADAPTER,
                    on_exit=lambda ended: self._ended(adapter, ended),
                )
            )
        except OSError as error:
            self._failed(adapter, f"the adapter could not be started: {error.strerror or error}")
            return
        adapter.handle = handle
        adapter.link = ChildLink(
            self.loop,
            handle,
            lambda messages: self._received(adapter, handle, messages),
            lambda why: self._broken(adapter, handle, why),
        )
        adapter.link.watch()
        adapter.link.send(launch.encode())
        epoch = begun.epoch
        adapter.timers.append(
            self.loop.call_later(
                self.settings.ready_timeout_s, lambda: self._ready_overdue(adapter, epoch)
            )
        )

    def _failed(self, adapter: Adapter, why: str) -> None:
        log.warning("channel %s: %s", adapter.profile.name, why)
        self._enter(adapter, "failed", error=why)
        self._restart_later(adapter)

    def _restart_later(self, adapter: Adapter) -> None:
        if self._closed or adapter.stopping:
            return
        adapter.failures += 1
        delay = min(
            self.settings.restart_max_s,
            self.settings.restart_min_s * 2 ** min(adapter.failures - 1, 8),
        )
        adapter.timers.append(self.loop.call_later(delay, lambda: self._launch(adapter)))

    def _retire(self, adapter: Adapter) -> None:
        adapter.stopping = True
        self._enter(adapter, "stopping")
        for timer in adapter.timers:
            timer.cancel()
        if adapter.handle is not None and not adapter.handle.exited:
            self.supervisor.stop(adapter.handle)

    def _ready_overdue(self, adapter: Adapter, epoch: int) -> None:
        overdue = adapter.state == "starting" and not adapter.launched
        if adapter.epoch == epoch and overdue and adapter.handle is not None:
            log.warning("channel %s: its adapter did not report ready", adapter.profile.name)
            self.supervisor.kill(adapter.handle)

    def _ended(self, adapter: Adapter, handle: ChildHandle) -> None:
        """The adapter of ``handle`` is gone: its open attempts become ambiguous."""
        if adapter.handle is not handle:
            return
        self.commits.record_end(adapter.profile.name, adapter.channel_id, adapter.epoch)
        adapter.handle, adapter.link = None, None
        if adapter.stopping:
            self._enter(adapter, "stopped")
            return
        code = handle.returncode
        how = f"signal {-code}" if code is not None and code < 0 else f"code {code}"
        self._enter(
            adapter, "exited", error=f"the adapter exited ({how}; its log: {handle.log_path})"
        )
        log.warning("channel %s: %s; starting it again", adapter.profile.name, adapter.error)
        self._restart_later(adapter)

    # -- serving ----------------------------------------------------------------------------

    def _received(self, adapter: Adapter, handle: ChildHandle, messages: list[bytes]) -> None:
        for raw in messages:
            if adapter.handle is not handle:
                return
            self._serve(adapter, handle, raw)

    def _broken(self, adapter: Adapter, handle: ChildHandle, why: str) -> None:
        if why == "overflow" and adapter.handle is handle:
            log.warning("channel %s: its adapter sent an oversized frame", adapter.profile.name)
            self.supervisor.kill(handle)

    def _serve(self, adapter: Adapter, handle: ChildHandle, raw: bytes) -> None:
        try:
            frame = parse_child_frame(raw)
        except (PiwfError, ValidationError):
            log.warning("channel %s: its adapter sent a malformed message", adapter.profile.name)
            self.supervisor.kill(handle)
            return
        refusal = fence_refusal(
            frame,
            epoch=adapter.epoch,
            profile=adapter.profile.name,
            last_sequence=adapter.last_sequence,
        )
        if refusal is not None:
            log.warning("channel %s: refused a message: %s", adapter.profile.name, refusal)
            self.supervisor.kill(handle)
            return
        adapter.last_sequence = frame.sequence
        if isinstance(frame, ReadyFrame):
            # Still ``starting``: nothing is sent before its API has answered once (its first
            # health report), since a send the API refuses at the door waits for a reload.
            adapter.failures = 0
            adapter.launched = True
        elif isinstance(frame, SettleFrame):
            self._settle(adapter, frame)
        elif isinstance(frame, AnswerFrame):
            self._answer(adapter, frame)
        elif isinstance(frame, HealthFrame):
            self._health(adapter, frame)
        elif isinstance(frame, ExitingFrame):
            self._enter(adapter, "exiting")

    def _enter(
        self,
        adapter: Adapter,
        state: str,
        *,
        error: str | None = None,
        problem: ApiProblem | None = None,
    ) -> None:
        adapter.state, adapter.error, adapter.problem = state, error, problem
        adapter.since = self.db.clock.now_ms()

    def _health(self, adapter: Adapter, frame: HealthFrame) -> None:
        """The adapter's first poll answered or failed, or its API failed, failed differently
        or answers again (reported on change only). Status shows the newest reason; one log
        line per change of state or problem, not per reason (one may change each poll). Nothing
        is dispatched to it before its API answered once, nor while it fails."""
        if adapter.state not in ("starting", "ready", "degraded") or not adapter.launched:
            return
        name = adapter.profile.name
        if frame.problem is None:
            if adapter.state == "degraded":
                failed_s = (self.db.clock.now_ms() - adapter.since) / 1000
                log.info(
                    "channel %s: the Bot API answers again (%s for %.0f s)",
                    name,
                    adapter.problem,
                    failed_s,
                )
            if adapter.state != "ready":
                self._enter(adapter, "ready")
                self.nudge()
            return
        credential_file = adapter.profile.config.credential_file
        error = degraded_error(frame.problem, frame.reason, credential_file)
        if adapter.state == "degraded" and adapter.problem == frame.problem:
            adapter.error = error  # the same failure since the same moment, a newer reason
            return
        log.warning("channel %s: %s", name, error)
        self._enter(adapter, "degraded", error=error, problem=frame.problem)

    def _settle(self, adapter: Adapter, frame: SettleFrame) -> None:
        if self.commits.settle(adapter.profile.name, adapter.channel_id, frame):
            self.nudge()  # a decision settled meanwhile can be edited now

    def _answer(self, adapter: Adapter, frame: AnswerFrame) -> None:
        reply = self.commits.answer(adapter.profile, adapter.channel_id, adapter.revision, frame)
        adapter.revision = reply.revision
        if adapter.link is not None:
            response = ResponseFrame(
                adapter_epoch=adapter.epoch,
                profile=adapter.profile.name,
                sequence=self._next_sequence(adapter),
                expected_revision=reply.revision,
                attempt_id=frame.attempt_id,
                reply_to=frame.sequence,
                outcome=reply.outcome,
                revision=reply.revision,
                notice=reply.notice,
            )
            adapter.link.send(response.encode())
        if reply.run_id is not None:
            self.answered(reply.run_id)
            self.nudge()

    def _next_sequence(self, adapter: Adapter) -> int:
        adapter.sent_sequence += 1
        return adapter.sent_sequence

    # -- dispatching ------------------------------------------------------------------------

    def nudge(self) -> None:
        """Look for work on the next loop turn (a decision opened or settled, a recovery)."""
        if not self._dispatch_scheduled and not self._closed:
            self._dispatch_scheduled = True
            self.loop.call_later(0, self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        for adapter in list(self.adapters.values()):
            if adapter.state == "ready" and not adapter.stopping and adapter.link is not None:
                try:
                    self._dispatch_one(adapter)
                except PiwfError as error:
                    log.warning("channel %s: dispatch failed: %s", adapter.profile.name, error)

    def _dispatch_one(self, adapter: Adapter) -> None:
        epoch = adapter.epoch
        work = self.commits.claim_work(adapter.channel_id, epoch)
        for item in work:  # recorded (committed) first, then asked for
            if adapter.link is None:
                return  # it ended meanwhile: its end made these attempts ambiguous
            present = PresentFrame(
                adapter_epoch=epoch,
                profile=adapter.profile.name,
                sequence=self._next_sequence(adapter),
                expected_revision=item.revision,
                attempt_id=item.attempt_id,
                request=PresentRequest.model_validate(item.request),
            )
            adapter.link.send(present.encode())
