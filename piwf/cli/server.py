"""``piwf server start | stop | status | run``."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import uuid
from typing import TYPE_CHECKING

import click

from piwf import canonical
from piwf.cli.collector import collector_paused
from piwf.cli.common import Integer, Seconds, command, emit_json, json_option, open_client
from piwf.cli.safe_text import one_line
from piwf.config import (
    MAX_SETTING_INTEGER,
    MAX_SETTING_SECONDS,
    ServerPaths,
    server_setting_variables,
    socket_path_problem,
    state_home,
    verify_private_dir,
)
from piwf.errors import (
    PiwfError,
    ServerNotRunningError,
    ServerStartError,
    UnsafeStateHomeError,
)

if TYPE_CHECKING:
    from piwf.protocol.payloads import ServerStatus


@click.group("server")
def server_group() -> None:
    """Start, stop and inspect the piwf server of $PIWF_HOME.

    \b
    Example:
      piwf server status
    """


_MAX_WORKERS = click.option(
    "--max-workers",
    type=Integer(1, MAX_SETTING_INTEGER),
    default=None,
    metavar="N",
    help="Execution slots (default: $PIWF_MAX_WORKERS or 4).",
)
_IDLE_EXIT = click.option(
    "--idle-exit",
    "idle_exit_s",
    type=Seconds(maximum=MAX_SETTING_SECONDS),
    default=None,
    metavar="SECONDS",
    help="Exit after this long with no clients and no work (default: $PIWF_IDLE_EXIT_S or 300).",
)


@server_group.command("start")
@_MAX_WORKERS
@_IDLE_EXIT
@json_option
@command
def server_start(max_workers: int | None, idle_exit_s: float | None, as_json: bool) -> None:
    """Start the server in the background unless it already runs.

    Returns once the server accepts connections. If a server already runs, it is left alone
    and its options are not changed.

    \b
    Example:
      piwf server start --max-workers 2
    """
    from piwf.client import launcher  # not at import: `server run` (the server) needs no client

    home = state_home()
    # A server that answers is left alone before anything is launched: a launched `server run`
    # reads this environment's settings first, and a bad one would fail the start of a server
    # that was never needed.
    epoch = _quick_epoch()
    started = (
        None
        if epoch is not None or _answers()
        else launcher.ensure_server(home, max_workers=max_workers, idle_exit_s=idle_exit_s)
    )
    if started is not None or epoch is None:
        epoch = _quick_epoch()
    if epoch is None:
        with open_client() as client:
            epoch = client.server_status().epoch
    # A running server keeps the settings it started with: say which of those given here it
    # does not take, or `PIWF_AGENT_COMMAND=... piwf server start` looks as if it applied.
    not_applied = [] if started is not None else _given_settings(max_workers, idle_exit_s)
    if as_json:
        document: dict[str, object] = {"started": started is not None, "epoch": epoch}
        if started is not None:
            document["pid"] = started.pid
        if not_applied:
            document["notApplied"] = not_applied
        emit_json(document)
    elif started is not None:
        click.echo(one_line(f"started piwf server (pid {started.pid}, epoch {epoch}) for {home}"))
    else:
        click.echo(one_line(f"piwf server already running (epoch {epoch}) for {home}"))
        if not_applied:
            click.echo(
                "it keeps the settings it started with and does not take these given here:"
                f" {', '.join(not_applied)} (to apply them: piwf server stop, then piwf server"
                " start)",
                err=True,
            )


def _given_settings(max_workers: int | None, idle_exit_s: float | None) -> list[str]:
    """The options and ``PIWF_*`` setting variables given to this ``server start``."""
    options = [
        name
        for name, value in (("--max-workers", max_workers), ("--idle-exit", idle_exit_s))
        if value is not None
    ]
    return options + server_setting_variables(os.environ)


def _quick_epoch() -> int | None:
    """The running server's epoch, read without the protocol's models
    (:mod:`piwf.client.quick_read`); None when none answers or the full client must ask."""
    from piwf.client.quick_read import read_quickly
    from piwf.client.quick_stop import QUICK_TIMEOUT_S

    receipt = read_quickly(
        state_home(),
        "server.status",
        {},
        client_id=f"cli-{uuid.uuid4().hex}",
        timeout_s=QUICK_TIMEOUT_S,
    )
    epoch = None if receipt is None else receipt.get("epoch")
    return epoch if type(epoch) is int else None


@server_group.command("stop")
@json_option
@command
def server_stop(as_json: bool) -> None:
    """Stop the server after its in-flight commands finish; never starts one.

    Returns once the server has closed its connections. Exits 0 when no server runs (also
    when none can: a state home whose socket path is too long for the OS).

    \b
    Example:
      piwf server stop
    """
    cannot_run = _why_no_server_can_run()
    if cannot_run is not None:
        if as_json:
            emit_json({"state": "stopped", "wasRunning": False, "note": cannot_run})
        else:
            click.echo(one_line(f"no piwf server can run for {state_home()}: {cannot_run}"))
        return
    was_running = _stop_quickly()
    if was_running is None:
        try:
            with open_client(autostart=False) as client:
                client.stop_server()
            was_running = True
        except ServerNotRunningError:
            was_running = False
    if as_json:
        emit_json({"state": "stopped", "wasRunning": was_running})
    elif was_running:
        click.echo("piwf server stopped")
    else:
        click.echo(one_line(f"no piwf server is running for {state_home()}"))


@server_group.command("status")
@json_option
@command
def server_status(as_json: bool) -> None:
    """Show whether the server runs, with its counts; never starts one.

    Exits 0 in both cases; with --json a stopped server is {"state":"stopped"}. A state home
    whose socket path is too long for the OS can have no server: stopped, with a "note" why;
    so does a stopped server's home that no server could start in (its mode, its owner).

    \b
    Example:
      piwf server status --json
    """
    cannot_run = _why_no_server_can_run()
    if cannot_run is not None:
        if as_json:
            emit_json({"state": "stopped", "note": cannot_run})
        else:
            click.echo(one_line(f"no piwf server can run for {state_home()}: {cannot_run}"))
        return
    status = None if _nothing_listens() else _running_status()
    if status is None:
        unusable = _why_the_home_is_unusable()
        if as_json:
            emit_json(
                {"state": "stopped"} if unusable is None else {"state": "stopped", "note": unusable}
            )
        elif unusable is None:
            click.echo(one_line(f"no piwf server is running for {state_home()}"))
        else:
            click.echo(
                one_line(
                    f"no piwf server is running for {state_home()}, and none can start: {unusable}"
                )
            )
        return
    if as_json:
        emit_json(status.to_wire())
    else:
        from piwf.cli import render_state  # not at import: it loads the protocol's models

        click.echo(render_state.server_status(status))


def _running_status() -> ServerStatus | None:
    """The running server's status, None when none runs (the full client asks)."""
    try:
        with open_client(autostart=False) as client:
            return client.server_status()
    except ServerNotRunningError:
        return None


def _answers() -> bool:
    """Whether a server answers on this home's socket now (none is started). Any error is
    False: the start then goes on as before and meets the error where it did."""
    if _nothing_listens():
        return False
    try:
        with open_client(autostart=False) as client:
            client.server_status()
    except PiwfError:
        return False
    return True


def _nothing_listens() -> bool:
    """Whether no server listens for this home, found without the protocol's models
    (:func:`piwf.client.quick_stop.nothing_listens`); False when in doubt."""
    from piwf.client.quick_stop import nothing_listens

    return nothing_listens(state_home())


def _stop_quickly() -> bool | None:
    """Whether a server ran and is stopped now, asked without the protocol's models
    (:mod:`piwf.client.quick_stop`); None when the full client must ask instead."""
    from piwf.client.quick_stop import QUICK_TIMEOUT_S, STOP_WAIT_S, QuickStop, stop_quickly

    found = stop_quickly(
        state_home(),
        client_id=f"cli-{uuid.uuid4().hex}",
        timeout_s=QUICK_TIMEOUT_S,
        wait_s=STOP_WAIT_S,
    )
    return None if found is None else found is QuickStop.STOPPED


def _why_the_home_is_unusable() -> str | None:
    """Why no server could start in ``$PIWF_HOME`` as it is (its mode, its owner, its kind),
    or None; a home that does not exist yet is usable (the server creates it)."""
    home = state_home()
    try:
        verify_private_dir(home)
    except FileNotFoundError:
        return None
    except UnsafeStateHomeError as error:
        return str(error)
    except OSError as error:  # a parent we may not search, say
        return f"{home} cannot be read ({error.strerror})"
    return None


def _why_no_server_can_run() -> str | None:
    """Why no server can listen for ``$PIWF_HOME`` (its socket path is too long, or it is a
    file: no socket can lie under it), or None."""
    home = state_home()
    try:
        kind = home.lstat().st_mode
    except OSError:
        kind = None  # missing (the server creates it), or a parent's problem: the client says
    if kind is not None and not stat.S_ISDIR(kind) and not stat.S_ISLNK(kind):
        return (
            f"{home} is not a directory; move it away, or set PIWF_HOME to another directory"
            " (piwf creates it)"
        )
    return socket_path_problem(ServerPaths(home).socket)


@server_group.command("run")
@_MAX_WORKERS
@_IDLE_EXIT
@click.option("--ready-fd", type=Integer(0), default=None, hidden=True)
@json_option
@command
def server_run(
    max_workers: int | None, idle_exit_s: float | None, ready_fd: int | None, as_json: bool
) -> None:
    """Run the server attached to this terminal until it is stopped (SIGINT, SIGTERM,
    `piwf server stop`, or --idle-exit).

    `piwf server start` and the client run this command in the background. The server logs
    to $PIWF_HOME/server/server.log. With --json, one document {"exitCode": N} is printed
    when the server exits. A server that cannot start (one already runs for this home, say)
    exits 1 and says why, on stderr or as the JSON error.

    \b
    Example:
      piwf server run --max-workers 2 --idle-exit 0
    """
    # The one edge from the CLI into the server package (DESIGN.md §2, allowed by name in
    # tests/unit/test_import_rules.py): its entry point, imported when this command runs so
    # that no other command loads the server.
    try:
        with collector_paused():
            from piwf.server.children.start_methods import start_helpers_early
            from piwf.server.settings import ServerSettings

            settings = ServerSettings.from_environment(
                max_workers=max_workers, idle_exit_s=idle_exit_s
            )
            from piwf.server import lifecycle

        # Once imported and before anything is opened: the fork server is a fork of this
        # process and shares its imports instead of repeating them.
        early_helpers = start_helpers_early(settings.start_method)
    except (ImportError, ValueError) as error:
        message = f"the piwf server cannot start: {error}"
        _report_start_failure(ready_fd, message)
        raise ServerStartError(message) from None
    exit_code: int = lifecycle.run_server(settings, ready_fd=ready_fd, early_helpers=early_helpers)
    if as_json:
        emit_json({"exitCode": exit_code})
    sys.exit(exit_code)


def _report_start_failure(ready_fd: int | None, message: str) -> None:
    """Tell a waiting launcher why the server did not start (the launcher's ready protocol)."""
    if ready_fd is None:
        return
    line = canonical.encode({"error": {"code": "serverStart", "message": message}, "ok": False})
    with contextlib.suppress(OSError):
        os.write(ready_fd, line + b"\n")
    with contextlib.suppress(OSError):
        os.close(ready_fd)
