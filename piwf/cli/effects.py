"""``piwf effect resolve``: an operator's explicit decision about an ambiguous effect."""

from __future__ import annotations

import click

from piwf.cli import render
from piwf.cli.common import command, effect_id_argument, json_option, open_client


@click.group("effect")
def effect_group() -> None:
    """Resolve managed effects that piwf could not prove applied or not.

    An effect becomes ambiguous when its action may have run but no result was recorded (a
    manual effect whose runner died, or an applying effect whose run was cancelled). piwf never
    retries it by itself; `piwf run show RUN_ID` lists a run's effects and their ids.

    \b
    Example:
      piwf effect resolve effect-3f2a --applied --note "checked the dashboard"
    """


@effect_group.command("resolve")
@effect_id_argument
@click.option("--applied", is_flag=True, help="It did happen: settle it.")
@click.option("--retry", is_flag=True, help="It did not: run it again.")
@click.option("--note", default=None, help="Why (kept in the effect's audit event).")
@json_option
@command
def effect_resolve(
    effect_id: str, applied: bool, retry: bool, note: str | None, as_json: bool
) -> None:
    """Settle an ambiguous effect as applied, or send it back to pending for a retry.

    Exactly one of --applied and --retry. Then resume its run with `piwf run resume RUN_ID`
    (a managed resource's effect needs none: its resource is reconciled at once).

    \b
    Example:
      piwf effect resolve effect-3f2a --retry
    """
    if applied == retry:
        raise click.UsageError("choose exactly one of --applied (it happened) and --retry")
    resolution = "applied" if applied else "retry"
    with open_client() as client:
        receipt = client.resolve_effect_receipt(effect_id, resolution, note=note)
    effect = receipt.effect
    if as_json:
        render.emit_json({"effect": effect.to_wire(), "outcome": receipt.outcome})
    elif receipt.outcome == "unchanged":
        click.echo(
            f"{effect.effect_id}  {effect.effect_type}  already {effect.status}: nothing to resolve"
        )
    else:
        click.echo(f"{effect.effect_id}  {effect.effect_type}  now {effect.status}")
