"""Why a run command cannot apply to a run in its present state, said as the person reading
it needs it: what the run is (the status every renderer shows), and the command that moves on.

Each function returns a :class:`~piwf.errors.RunCommandError` for the handler to answer
``rejected`` with, or None when the command may go ahead; the state layer's transitions check
their preconditions again.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Literal

from piwf.errors import RunCommandError
from piwf.lifecycle import EffectStatus, RunStatus
from piwf.server.runs import recorded_sources
from piwf.state import Transaction
from piwf.state import effects as fx
from piwf.state.enums import FailureClass
from piwf.state.execution import runs as run_store


def ended_refuses(
    verb: Literal["pause", "resume"],
) -> Callable[[run_store.RunRow], RunCommandError | None]:
    """The refusal of ``verb`` for a run that ended (None for an unfinished run): only an
    unfinished run pauses or resumes; a restart runs an ended one again."""

    def refusal(run: run_store.RunRow) -> RunCommandError | None:
        if not run.terminal:
            return None
        return RunCommandError(
            f"run {run.run_id} has ended ({run.status.value}); only an unfinished run can"
            f" {verb}. To run it again: piwf run restart {run.run_id}"
        )

    return refusal


def ended_refuses_cancel(run: run_store.RunRow) -> RunCommandError | None:
    """The refusal of a cancel of a run that ended other than cancelled (None for an
    unfinished run, and for a cancelled one, whose cancel changes nothing): there is nothing
    left to stop; a restart runs it again."""
    if not run.terminal or run.status is RunStatus.CANCELLED:
        return None
    return RunCommandError(
        f"run {run.run_id} has already ended ({run.status.value}); there is nothing to cancel."
        f" To run it again: piwf run restart {run.run_id}"
    )


def restart_refusal(tx: Transaction, parent: run_store.RunRow) -> RunCommandError | None:
    """Why ``parent`` cannot restart now (:func:`unfinished_refuses_restart`,
    :func:`rejected_input_refuses_restart`, then :func:`sources_refuse_restart`), or None when
    ``restart_run`` may decide."""
    return (
        unfinished_refuses_restart(parent)
        or rejected_input_refuses_restart(tx, parent)
        or sources_refuse_restart(tx, parent)
    )


def rejected_input_refuses_restart(
    tx: Transaction, parent: run_store.RunRow
) -> RunCommandError | None:
    """The refusal of a restart of a run whose workflow refused its input (failure class
    ``inputRejected``; None for any other run, and once a restart exists, which is adopted): a
    restart gives the same sources the same input, which they would refuse again. The error
    says to start a new run with a corrected input; the workflow's message is on the run."""
    if parent.error_code != FailureClass.INPUT_REJECTED.value:
        return None
    if run_store.restart_child_of(tx, parent.run_id) is not None:
        return None
    run_id = parent.run_id
    return RunCommandError(
        f"run {run_id} cannot restart: its workflow rejected its input (inputRejected), and a"
        " restart gives the workflow the same input again. Start a new run with a corrected"
        f" input: {recorded_sources.start_command(parent.workflow_ref)} --input JSON (what"
        f" the workflow refused: piwf run show {run_id}; the input it accepts: piwf workflows"
        f" show {shlex.quote(parent.workflow_ref)})"
    )


def unfinished_refuses_restart(parent: run_store.RunRow) -> RunCommandError | None:
    """The refusal of a restart of a run that has not ended (None once it has), naming the
    status every renderer shows, how it goes on and how to start over instead."""
    if parent.terminal:
        return None
    run_id = parent.run_id
    return RunCommandError(
        f"run {run_id} is {parent.display_status} and has not ended; only a run that ended"
        f" restarts. To go on with it: piwf run explain {run_id}; to start over, cancel it"
        f" first (piwf run cancel {run_id}), then restart it"
    )


#: How many effects a refusal names (the rest are in ``piwf run show``).
_NAMED_EFFECTS = 10


def ambiguous_refuses_resume(tx: Transaction, run: run_store.RunRow) -> RunCommandError:
    """The refusal of a resume while an effect of ``run`` is ambiguous: each one (up to
    :data:`_NAMED_EFFECTS`) and the command that settles it."""
    ambiguous = [
        effect.effect_id
        for effect in fx.list_unsettled_effects(tx, run.resource_id)
        if effect.status is EffectStatus.AMBIGUOUS
    ]
    named = ", ".join(ambiguous[:_NAMED_EFFECTS])
    more = f" and {len(ambiguous) - _NAMED_EFFECTS} more" if len(ambiguous) > _NAMED_EFFECTS else ""
    return RunCommandError(
        f"run {run.run_id} cannot resume while an effect of it is ambiguous ({named}{more}):"
        " check the outside system, settle each with piwf effect resolve EFFECT_ID --applied"
        " (it happened) or --retry (it did not), then resume it"
    )


def sources_refuse_restart(tx: Transaction, parent: run_store.RunRow) -> RunCommandError | None:
    """Why a restart of ``parent`` cannot run its recorded sources, or None when it can (or
    when the restart is refused or adopted for another reason, which ``restart_run`` answers).

    A restart runs the parent's recorded files; a file that changed or is gone would park the
    new run ``sourceChanged`` at once. The error says which and how to run the current sources.
    """
    if not parent.terminal or run_store.restart_child_of(tx, parent.run_id) is not None:
        return None
    return _sources_refusal(tx, parent, "restart")


def sources_refuse_fork(tx: Transaction, parent: run_store.RunRow) -> RunCommandError | None:
    """Why a fork of ``parent`` cannot run its recorded sources, or None when they are on disk
    as recorded. A fork runs the parent's recorded files, as a restart does: a file that
    changed or is gone would park the new run ``sourceChanged`` at once."""
    return _sources_refusal(tx, parent, "fork")


def _sources_refusal(
    tx: Transaction, parent: run_store.RunRow, verb: Literal["restart", "fork"]
) -> RunCommandError | None:
    drift = recorded_sources.drift_of(tx, parent.run_id)
    if not drift:
        return None
    return RunCommandError(
        f"run {parent.run_id} cannot {verb}: a {verb} runs the workflow sources the run"
        f" recorded, and they are not on disk as recorded ({drift.describe()}). Restore the"
        f" recorded file to {verb} it, or start a new run of the current sources:"
        f" {recorded_sources.start_command(parent.workflow_ref)}"
    )
