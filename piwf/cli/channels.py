"""``piwf channel``: the channel adapters (status, reload, recovery of ambiguous sends)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from piwf.cli import render
from piwf.cli.common import command, effect_id_argument, json_option, open_client
from piwf.config import CHANNELS_FILE_NAME, state_home
from piwf.errors import ServerNotRunningError

if TYPE_CHECKING:
    from piwf.client.launcher import ServerStarted
    from piwf.protocol.channel_payloads import ChannelReloadReceipt

DUPLICATE_WARNING = (
    "warning: retry sends the message again; if the first send did reach the chat, the "
    "person sees a duplicate message"
)


@click.group("channel")
def channel_group() -> None:
    """Deliver protected decisions through channel adapters (Telegram).

    Profiles live in channels.json in the state home; docs/CHANNELS.md shows the setup.

    \b
    Example:
      piwf channel status
      piwf channel reload
      piwf channel recover effect-3f2a confirm
    """


@channel_group.command("status")
@json_option
@command
def channel_status(as_json: bool) -> None:
    """Show each profile, its adapter process and its pending or ambiguous sends, and the
    decisions still open that the API refused to post (piwf channel reload sends those again).

    No credential, chat id or answer is shown.

    \b
    Example:
      piwf channel status --json
    """
    with open_client() as client:
        status = client.channel_status()
    if as_json:
        render.emit_json(status.to_wire())
        return
    if status.config_error:
        kept = "; the adapters below keep the last valid configuration" if status.profiles else ""
        click.echo(f"configuration error: {status.config_error}{kept}")
    if not status.profiles:
        click.echo(f"no channel profiles (configure them in {status.config_file})")
    for profile in status.profiles:
        pid = "-" if profile.pid is None else str(profile.pid)
        epoch = "-" if profile.epoch is None else str(profile.epoch)
        click.echo(
            f"{profile.profile}  {profile.kind}  {profile.state}  pid {pid}  epoch {epoch}  "
            f"pending {profile.pending_sends}  ambiguous {len(profile.ambiguous)}"
            + (f"  failed {len(profile.failed)}" if profile.failed else "")
        )
        if profile.error:
            click.echo(f"  since {render.timestamp(profile.since)}: {profile.error}")
        for send in profile.ambiguous:
            click.echo(
                f"  ambiguous {send.effect_id} ({send.effect_type}, {send.attempt_count} "
                f"attempt(s)): check the chat, then piwf channel recover {send.effect_id} "
                "confirm|retry"
            )
        for send in profile.failed:
            why = "" if send.error is None else f" ({render.one_line(send.error)})"
            answer = f"piwf answer {send.decision_id} VALUE (piwf requests shows its choices)"
            then = (
                f"fix what it says, then piwf channel reload sends it again, or answer it with "
                f"{answer}"
                if send.resends_left
                else f"it is not sent again (refused after every resend): answer it with {answer}"
            )
            click.echo(
                f"  failed {send.effect_id}: the API refused to post decision {send.decision_id}"
                f"{why}; {then}"
            )


@channel_group.command("reload")
@json_option
@command
def channel_reload(as_json: bool) -> None:
    """Re-read channels.json; restart the adapters whose profile or credential changed.

    Each open decision whose delivery the API refused is sent again (a refused send never
    reached the chat, so this cannot duplicate it; at most 5 times each).

    A file that cannot be used is an error (exit 1) naming the file and what is wrong; nothing
    changes then: the running adapters keep the last valid configuration. With no server
    running, one is started, which reads channels.json and starts its adapters.

    \b
    Example:
      piwf channel reload
    """
    report, started = _reload()
    home = state_home()
    if started is not None:
        # The new server started what it read; its reload then found nothing changed.
        report = report.model_copy(
            update={"started": sorted(report.started + report.unchanged), "unchanged": []}
        )
    if as_json:
        render.emit_json({**report.to_wire(), "serverStarted": started is not None})
        return
    if started is not None:
        click.echo(
            render.one_line(
                f"started piwf server (pid {started.pid}, epoch {started.epoch}) for {home}; "
                f"it read {CHANNELS_FILE_NAME}"
            )
        )
    changes = (
        ("started", report.started),
        ("restarted", report.restarted),
        ("stopped", report.stopped),
        ("unchanged", report.unchanged),
    )
    if not any(names for _, names in changes):
        click.echo(
            f"no channel profiles: nothing to start (configure them in {home / CHANNELS_FILE_NAME};"
            " docs/CHANNELS.md shows the setup)"
        )
    for label, names in changes:
        if names:
            click.echo(f"{label}: {', '.join(names)}")
    if report.resent:
        click.echo(
            f"sending again the refused delivery of decision(s): {', '.join(report.resent)} "
            "(piwf channel status shows how it goes)"
        )
    for failure in report.failed:
        click.echo(
            render.one_line(
                f"failed: {failure.profile}: {failure.reason} (it is tried again with a"
                " back-off; piwf channel status shows it)"
            )
        )


def _reload() -> tuple[ChannelReloadReceipt, ServerStarted | None]:
    """Reload the running server's profiles, or start a server (it reads them as it starts)
    and reload that one; the second value is the server this call started, if any."""
    from piwf.client import launcher  # only a start needs it

    try:
        with open_client(autostart=False) as client:
            return client.reload_channels(), None
    except ServerNotRunningError:
        pass  # nothing was sent: start one
    started = launcher.ensure_server(state_home())
    with open_client() as client:
        return client.reload_channels(), started


@channel_group.command("recover")
@effect_id_argument
@click.argument("action", type=click.Choice(["confirm", "retry"]))
@json_option
@command
def channel_recover(effect_id: str, action: str, as_json: bool) -> None:
    """Resolve an ambiguous send after checking the chat.

    confirm: the message did arrive (nothing is sent). retry: send it again as a new attempt
    (a duplicate message is possible).

    \b
    Example:
      piwf channel recover effect-3f2a confirm
      piwf channel recover effect-3f2a retry
    """
    with open_client() as client:
        receipt = client.recover_channel_send(effect_id, action)
    if action == "retry":  # only once the send is back to pending: a refusal retries nothing
        click.echo(DUPLICATE_WARNING, err=True)
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        effect = receipt.effect
        click.echo(f"{effect.effect_id}  {effect.effect_type}  now {effect.status}")
