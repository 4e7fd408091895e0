"""Start, serve and stop one server process (``piwf server run``).

Start order, each step refusing cleanly before the next::

    socket path fits -> state home 0700 and writable -> server dir 0700 and writable
    -> server log -> single-instance lock
    -> open the database (identity verified) -> take the server epoch (epoch + 1)
    -> bind the socket (0600, stale one replaced) -> request a retention sweep (it runs once
    the server is idle, docs/RETENTION.md) -> report ready -> serve

Stop order: stop accepting, close clients, stop children, release the epoch claim, remove the
socket, close the database, drop the lock. A failed epoch renewal stops the server at once:
another server owns the state now, and this one must not write.

With ``ready_fd`` the server reports its start on that descriptor as one canonical JSON line,
``{"ok": true, "epoch": N, "pid": P}`` or ``{"ok": false, "error": {"code", "message"}}``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from pathlib import Path

from piwf import canonical, faults
from piwf._version import __version__
from piwf.config import ensure_private_dir
from piwf.errors import ClaimLostError, PiwfError, ServerRunningError, ServerStartError
from piwf.lifecycle import Applied
from piwf.processes import has_file_open, is_alive, own_identity
from piwf.protocol.client_v1 import Hello
from piwf.server.channels.adapters import ChannelAdapters, ChannelSettings
from piwf.server.children.resolvers import ResolverJobs
from piwf.server.children.start_methods import EarlyHelpers
from piwf.server.children.supervisor import Supervisor
from piwf.server.commands import DurableCommands
from piwf.server.connection_services import ConnectionServices
from piwf.server.context import ServerContext
from piwf.server.coordinators import COORDINATOR_OPERATIONS, Coordinators
from piwf.server.handlers import Handlers
from piwf.server.listener import bind_listener, check_socket_path
from piwf.server.lock import InstanceLock
from piwf.server.loop import ClientListener, EventLoop
from piwf.server.maintenance import RetentionSettings, RetentionSweeper
from piwf.server.recovery import recover_previous_server, revalidate_left_by_crash
from piwf.server.resources.reconciler import Reconciler, ReconcileSettings
from piwf.server.runs.answers import DecisionDeadlines
from piwf.server.runs.deadlines import AgentDeadlines
from piwf.server.runs.pool import ExecutionSettings, Executor
from piwf.server.runs.validations import Validations, ValidationSettings
from piwf.server.server_log import server_log_handler
from piwf.server.settings import ServerSettings
from piwf.server.subscriptions import SUBSCRIPTION_OPERATIONS, Subscriptions
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.execution.submissions import SubmissionRow
from piwf.state.server_epoch import (
    ServerClaim,
    acquire_server_claim,
    read_server_owner,
    release_server_claim,
    renew_server_claim,
)
from piwf.state.writable import refuse_unwritable_dir

log = logging.getLogger("piwf.server")

EXIT_OK = 0
EXIT_FAILED = 1


def run_server(
    settings: ServerSettings,
    ready_fd: int | None = None,
    early_helpers: EarlyHelpers | None = None,
) -> int:
    """Run a server until it is stopped; return the process exit code.

    ``early_helpers`` are the start helpers ``piwf server run`` started before it imported
    this module (:func:`~piwf.server.children.start_methods.start_helpers_early`); the
    supervisor adopts them.

    A server that does not start (another one runs for the home, the home is unusable, the
    socket cannot be bound) logs why (once the server log is open: what fails before that is
    never printed here), reports it on ``ready_fd`` and raises it, as the typed
    error (:class:`~piwf.errors.ServerRunningError`, ...) or a
    :class:`~piwf.errors.ServerStartError`, so the caller says why too.
    """
    paths = settings.paths
    lock: InstanceLock | None = None
    db: StateDatabase | None = None
    claim: ServerClaim | None = None
    logging_configured = False
    try:
        check_socket_path(paths.socket)  # before anything is created for a home of no use
        ensure_private_dir(paths.home)
        refuse_unwritable_dir(paths.home)
        ensure_private_dir(paths.server_dir)
        refuse_unwritable_dir(paths.server_dir, "the server directory")
        _configure_logging(paths.log)
        logging_configured = True
        identity = own_identity()
        lock = InstanceLock(paths.lock)
        lock.acquire(identity)
        db = StateDatabase(paths.database, quick_check_s=settings.quick_check_s)
        claim, previous_server_id = _take_epoch(db, settings, identity)
        faults.point("server.after_epoch")
        recover_previous_server(
            db,
            epoch=claim.epoch,
            previous_server_id=previous_server_id,
            owner_id=claim.server_id,
            lease_ms=settings.run_lease_ms,
        )
        faults.point("server.before_listen")
        listener = bind_listener(paths.socket)
    except PiwfError as error:
        if logging_configured:  # else Python's last-resort handler would print it to stderr
            log.error("server did not start: %s", error)
        _report(ready_fd, {"ok": False, "error": {"code": error.code, "message": str(error)}})
        _cleanup(db, claim, lock, socket_path=None)
        raise
    except OSError as error:
        named = error.filename not in (None, str(paths.home))
        where = f"{error.filename}: " if named else ""
        reason = f"{where}{error.strerror or error}"
        message = (
            f"server did not start for the state home {paths.home}: {reason}; fix or move that"
            " path, or set PIWF_HOME to a directory you can write"
        )
        if logging_configured:
            log.error("%s", message)
        _report(ready_fd, {"ok": False, "error": {"code": "serverStart", "message": message}})
        _cleanup(db, claim, lock, socket_path=None)
        raise ServerStartError(message) from None
    except Exception as error:  # a bug: its traceback goes to the log, where the message points
        message = f"server did not start: unexpected {type(error).__name__}: {error}" + (
            f"; the traceback is in {paths.log}" if logging_configured else ""
        )
        if logging_configured:
            log.exception("server did not start: unexpected error")
        _report(ready_fd, {"ok": False, "error": {"code": "serverStart", "message": message}})
        _cleanup(db, claim, lock, socket_path=None)
        raise
    log.info("server started: epoch %d, pid %d", claim.epoch, os.getpid())
    server = Server(settings, db, claim, listener, early_helpers)
    server.retention.request()  # recovery is done: the sweep runs once the server is idle
    _report(ready_fd, {"ok": True, "epoch": claim.epoch, "pid": os.getpid()})
    try:
        server.serve()
    except Exception:  # a bug: the server stops, and the log says why (stderr may go nowhere)
        log.exception("server stopping: unexpected error")
        raise
    finally:
        server.shutdown()
        try:
            faults.point("server.before_release")
            _cleanup(
                db, server.claim, lock, socket_path=paths.socket, socket_inode=server.socket_inode
            )
        finally:
            # Last: a `piwf server stop` returns when its connection closes, so by then the
            # database is closed (its WAL checkpointed) and the home's lock released, and a
            # script may copy the files or start another server at once.
            server.close_clients()
        log.info("server stopped: epoch %d", claim.epoch)
    return EXIT_OK if server.claim_held else EXIT_FAILED


class Server:
    """One running server: the loop, the client listener, the handlers and the timers."""

    def __init__(
        self,
        settings: ServerSettings,
        db: StateDatabase,
        claim: ServerClaim,
        listener: object,
        early_helpers: EarlyHelpers | None = None,
    ) -> None:
        import socket

        assert isinstance(listener, socket.socket)
        self.settings = settings
        self.db = db
        self.claim = claim
        self.claim_held = True
        self.socket_inode = settings.paths.socket.stat().st_ino
        self.loop = EventLoop()
        self.loop.install_signal_handlers()
        self.commands = DurableCommands(db, claim, on_epoch_lost=self._epoch_lost)
        self.clients: ClientListener
        # Every child (runners, reconciles, resolvers) starts through the one supervisor, with
        # the configured start method; its helpers (the fork server) start now if `piwf server
        # run` did not start them before its imports, not with the first child, so that child
        # does not wait for their imports.
        supervisor = Supervisor(
            self.loop,
            settings.paths.runners_dir,
            method=settings.start_method,
            early_helpers=early_helpers,
        )
        supervisor.prepare()
        self.executor = Executor(
            db=db,
            loop=self.loop,
            server_claim=lambda: self.claim,
            supervisor=supervisor,
            settings=ExecutionSettings(
                max_workers=settings.max_workers,
                spare_runners=settings.spare_runners,
                run_lease_ms=settings.run_lease_ms,
                renew_s=settings.run_renew_s,
                poll_s=settings.claim_poll_s,
                ready_timeout_s=settings.runner_ready_timeout_s,
                agent_command=settings.agent_command,
                state_home=str(settings.paths.home),
            ),
            run_changed=self._run_changed,
        )
        self.resolvers = ResolverJobs(self.loop, supervisor, settings.resolver_timeout_s)
        self.reconciler = Reconciler(
            db=db,
            loop=self.loop,
            supervisor=supervisor,
            server_claim=lambda: self.claim,
            home=settings.paths.home,
            settings=ReconcileSettings(
                lease_ms=settings.run_lease_ms,
                renew_s=settings.run_renew_s,
                poll_s=settings.claim_poll_s,
                ready_timeout_s=settings.runner_ready_timeout_s,
                deadline_grace_s=settings.reconcile_grace_s,
            ),
            wake_scheduler=self._wake_scheduler,
        )
        self.executor.reconciler = self.reconciler
        self.validations = Validations(
            db=db,
            loop=self.loop,
            supervisor=supervisor,
            server_claim=lambda: self.claim,
            settings=ValidationSettings(timeout_s=settings.validation_timeout_s),
            has_live_runner=self.executor.has_live_runner,
            settled=self._submission_settled,
            freed=self._wake_scheduler,
        )
        self.executor.validations = self.validations
        self.channels = ChannelAdapters(
            db=db,
            loop=self.loop,
            supervisor=supervisor,
            server_claim=lambda: self.claim,
            home=settings.paths.home,
            settings=ChannelSettings(
                poll_s=settings.claim_poll_s, ready_timeout_s=settings.runner_ready_timeout_s
            ),
            answered=lambda run_id: self._decisions_settled([run_id]),
        )
        context = ServerContext(
            db=db,
            commands=self.commands,
            loop=self.loop,
            resolvers=self.resolvers,
            home=settings.paths.home,
            epoch=claim.epoch,
            max_workers=settings.max_workers,
            connection_count=lambda: len(self.clients.connections),
            request_stop=self.request_stop,
            server_id=claim.server_id,
            run_lease_ms=settings.run_lease_ms,
            active_runners=self.executor.busy_slots,
            active_claim=self.executor.claim_of_run,
            stop_runner=self.executor.stop_run,
            wake_scheduler=self._wake_scheduler,
            request_validation=self.validations.request,
            run_changed=self._run_changed,
            coordinators=Coordinators(claim.epoch),
            channels=self.channels,
        )
        self.handlers = Handlers(context)
        self.retention = RetentionSweeper(
            db=db,
            loop=self.loop,
            executor=self.executor,
            resolvers=self.resolvers,
            server_claim=lambda: self.claim,
            settings=RetentionSettings.from_server(settings),
        )
        self.executor.on_runner_exit = self.retention.request
        self.deadlines = DecisionDeadlines(
            db=db,
            loop=self.loop,
            owner_id=lambda: self.claim.server_id,
            lease_ms=settings.run_lease_ms,
            poll_s=settings.claim_poll_s,
            settled=self._decisions_settled,
        )
        self.agent_deadlines = AgentDeadlines(
            db=db,
            loop=self.loop,
            runners=self.executor,
            poll_s=settings.claim_poll_s,
            expired=self._decisions_settled,
        )
        self.executor.on_agent_activity = lambda _run_id: self.agent_deadlines.nudge()
        self.clients = ClientListener(
            self.loop,
            listener,
            handle=self.handlers.handle,
            hello=self._hello,
            max_connections=settings.max_connections,
            max_inflight=settings.max_inflight_per_connection,
            output_cap=settings.output_cap_bytes,
            frame_deadline_s=settings.frame_deadline_s,
            first_frame_deadline_s=settings.first_frame_deadline_s,
            output_stall_deadline_s=settings.output_stall_deadline_s,
        )
        services = ConnectionServices(
            {
                SUBSCRIPTION_OPERATIONS: Subscriptions(
                    self.handlers.context, self.loop, self.clients.send
                ),
                COORDINATOR_OPERATIONS: context.coordinators,
            }
        )
        self.clients.subscriptions = services
        self.clients.subscription_operations = services.operations
        self.loop.every(settings.server_renew_s, self._renew_epoch)
        self.loop.on_wake.append(self._keep_epoch)
        # Runner messages read in one turn commit together, then are answered (group_commit.py).
        self.loop.after_dispatch.append(self.db.group.flush)
        if settings.idle_exit_s > 0:
            self.loop.every(min(settings.idle_exit_s / 4, 5.0), self._exit_if_idle)

    def serve(self) -> None:
        """Run loop turns until a stop is requested and pending output is flushed."""
        revalidate_left_by_crash(self.db, self.validations)  # recovery step 9
        self.channels.start()  # recovery step 7: channel decisions (interrupted sends ambiguous)
        self._wake_scheduler()  # work recovery made claimable starts now, not at the next poll
        while not self.loop.stop_requested:
            self.loop.run_once()
        self._drain_output(deadline_s=1.0)

    def request_stop(self) -> None:
        """Stop after this loop turn (answers already queued are flushed first)."""
        self.loop.stop_requested = True

    def shutdown(self) -> None:
        """Stop every child; the caller then releases the epoch and the lock, and only then
        closes the clients (:meth:`close_clients`)."""
        self.reconciler.stop_all()
        self.channels.stop_all()
        self.resolvers.stop_all()
        self.validations.stop_all()
        self.executor.stop_all()  # every child of the supervisor

    def close_clients(self) -> None:
        """Close every client connection, the listener and the loop."""
        self.clients.close_all()
        self.loop.close()

    def _wake_scheduler(self) -> None:
        self.loop.call_later(0, self.executor.schedule)
        self.channels.nudge()  # an answer or a new request: a channel may present or edit

    def _run_changed(self, run_id: str) -> None:
        self.handlers.notify_run_changed(run_id)
        self.reconciler.wake_parents()  # a child run of a managed resource may have ended
        self.deadlines.nudge()  # a run that just parked may already be past its deadline
        self.channels.nudge()  # a run that just parked may wait on a decision to present
        self.agent_deadlines.nudge()  # a runner ended, a run was paused or resumed

    def _submission_settled(self, submission: SubmissionRow) -> None:
        self.handlers.interactions.submission_settled(submission)
        # A live headless runner waiting on its agent command for this request learns it now.
        self.executor.request_settled(submission.run_id)

    def _decisions_settled(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            self.handlers.notify_run_changed(run_id)
        self._wake_scheduler()

    def _hello(self, connection_id: str) -> Hello:
        return Hello(
            connection_id=connection_id, package_version=__version__, server_epoch=self.claim.epoch
        )

    def _keep_epoch(self) -> None:
        """Renew the epoch now if less than half its lease is left (a wake duty of the loop).

        The timer renews it too, but a server that was stopped or starved inside ``select``
        wakes with its lease lapsed and work waiting: renewing (or re-taking) the epoch first
        means commands and runner calls find a live epoch instead of failing ``claimLost``.
        """
        left_ms = self.claim.expires_at - self.db.clock.now_ms()
        if self.claim_held and left_ms <= self.settings.server_lease_ms // 2:
            self._renew_epoch()

    def _renew_epoch(self) -> None:
        """Renew the epoch lease; take epoch + 1 if it lapsed; stop if another server owns it.

        A lease can lapse while this process still holds the single-instance lock (it was
        stopped with SIGSTOP, or starved, past the server lease): no other server can have
        started, so this server takes the next epoch exactly as a new server would, which
        fences everything stamped with the old one. Any other loss means another server owns
        the state: stop at once, writing nothing more.
        """
        try:
            with self.db.write() as tx:
                self.claim = renew_server_claim(tx, self.claim, self.settings.server_lease_ms)
        except ClaimLostError as error:
            if error.reason != "expired" or not self._retake_epoch():
                self._epoch_lost(error)
        except PiwfError as error:
            log.warning("server epoch renewal failed: %s", error)
        self.commands.claim = self.claim

    def _retake_epoch(self) -> bool:
        """Take epoch + 1 after this server's own lease lapsed; False if that is not possible."""
        try:
            with self.db.write() as tx:
                taken = acquire_server_claim(
                    tx,
                    server_id=self.claim.server_id,
                    pid=os.getpid(),
                    process_start_identity=own_identity(),
                    lease_ms=self.settings.server_lease_ms,
                )
        except PiwfError as error:
            log.warning("taking a new epoch failed: %s", error)
            return False
        if not isinstance(taken, Applied):
            return False
        log.warning(
            "server epoch %d lapsed while this server held the lock (stopped or starved); "
            "took epoch %d",
            self.claim.epoch,
            taken.value.epoch,
        )
        self.claim = taken.value
        self.commands.claim = self.claim
        return True

    def _epoch_lost(self, error: ClaimLostError) -> None:
        """Another server owns the state now, or this one's lease ran out: stop at once."""
        if self.claim_held:
            log.error("server epoch lost (%s); stopping without further writes", error.reason)
        self.claim_held = False
        self.request_stop()

    def _exit_if_idle(self) -> None:
        if self.clients.connections or self.resolvers.active or self.executor.active:
            return
        if self.validations.jobs or self.validations.ready:
            return  # a submission is being validated (after a restart, nobody may be waiting)
        if self.reconciler.has_work() or self.channels.has_work():
            return
        if time.monotonic() - self.clients.last_activity < self.settings.idle_exit_s:
            return
        # A scheduled wake (a back-off, a decision deadline) keeps the server up: leaving would
        # postpone it until some later command happened to start a server again.
        with self.db.read() as tx:
            if ex.has_scheduled_work(tx):
                return
        log.info("idle for %.0f s; exiting", self.settings.idle_exit_s)
        self.request_stop()

    def _drain_output(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and any(
            connection.output for connection in self.clients.connections.values()
        ):
            self.loop.run_once()


def _take_epoch(
    db: StateDatabase, settings: ServerSettings, identity: str
) -> tuple[ServerClaim, str | None]:
    """Take epoch + 1; return the claim and the id of the server that held the previous one."""
    with db.write() as tx:
        owner = read_server_owner(tx)
        # We hold the instance lock, so a recorded owner whose exact process is gone is dead
        # even if its lease has not expired yet. A live recorded process that does not have
        # this database open is the server of another home this file was copied from (a backup
        # restored here while that server runs): it owns that home's copy, not this one. A live
        # process with this file open is another server of it.
        recorded = owner.process_start_identity
        previous_dead = (
            recorded is None or not is_alive(recorded) or not has_file_open(recorded, db.path)
        )
        result = acquire_server_claim(
            tx,
            server_id=f"server-{secrets.token_hex(8)}",
            pid=os.getpid(),
            process_start_identity=identity,
            lease_ms=settings.server_lease_ms,
            previous_dead=previous_dead,
        )
    if not isinstance(result, Applied):
        raise ServerRunningError(result.evidence)
    return result.value, owner.server_id


def _cleanup(
    db: StateDatabase | None,
    claim: ServerClaim | None,
    lock: InstanceLock | None,
    *,
    socket_path: Path | None,
    socket_inode: int | None = None,
) -> None:
    if socket_path is not None:
        try:
            if socket_inode is None or socket_path.stat().st_ino == socket_inode:
                socket_path.unlink()
        except FileNotFoundError:
            pass
    if db is not None:
        if claim is not None:
            try:
                with db.write() as tx:
                    release_server_claim(tx, claim)
            except PiwfError as error:
                log.warning("server epoch not released: %s", error)
        db.close()
    if lock is not None:
        lock.release()


def _report(ready_fd: int | None, message: dict[str, object]) -> None:
    if ready_fd is None:
        return
    try:
        os.write(ready_fd, canonical.encode(message) + b"\n")
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.close(ready_fd)


def _configure_logging(path: Path) -> None:
    """Send the ``piwf`` loggers to the private, size-bounded, rate-limited server log."""
    handler = server_log_handler(path)
    root = logging.getLogger("piwf")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
