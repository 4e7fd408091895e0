"""Fork a run from a step: a new run of the same recorded sources that starts at one node with
the outputs the source run had recorded before it.

::

    source: not executing, every effect settled
      ─fork_run(from_node=NODE)─▶ fork: queued/queued, lineage ``fork``, parent = source
        copied    the source's steps before NODE (every attempt of their visits under new
                  ids, with the same outputs, errors, failure records, statuses and times),
                  its definition, input, recorded sources, binding, project, title and
                  launch options
        not       effects, requests, decisions, updates, notifications, logs, agent turns
      ─claim_next_run─▶ ``resume`` (the fork has attempts): the engine replays the copied
        steps, lands on NODE and runs it as a new visit; nothing before NODE runs again

Which steps are copied: ``run_steps`` in order, up to and not including the first step whose
node path is NODE, so a node visited more than once (a loop) forks from its *first* visit. NODE
may also be the visit the source left open (running, waiting, or closed by a cancel without a
step): every step is copied then. NODE is a full node path as ``piwf run steps`` shows it (a
node of a mount is ``mount/node``).

This module decides and composes; the owners write: the fork's row is a restart child's
(:func:`piwf.state.execution.runs.insert_restart`) with ``lineage_kind = 'fork'`` and no terminal
fingerprint, ``restart_number`` the source's + 1 (the schema keeps it positive for every run with
a parent) and the source's root (retention keeps and deletes the two together); each copied
visit is :func:`piwf.state.execution.attempts.copy_finished_visit` (lease generation 1, the
fork's first claim, so no attempt names a generation its own lease never reached).

Refused with a :class:`~piwf.lifecycle.Conflict` that names the cause, before anything is
written: the source executes (a runner holds it, or it is queued to start), has an unsettled
(pending, applying or ambiguous) effect, its workflow has no node NODE, NODE never ran in it,
nothing ran before NODE (that is a fresh run: ``piwf run restart``), or its origin session is
reserved by another unfinished run.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence

from piwf.canonical import JsonValue
from piwf.lifecycle import Applied, Conflict, Lineage
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import QueueStatus, ResourceType
from piwf.state.execution import attempts, messages, runs
from piwf.state.execution.core import unsettled_effects_refusal
from piwf.state.leases import read_lease
from piwf.state.records import Actor, ensure_resource, record_change

#: At most this many node paths are named in a refusal.
_LISTED = 20

# Paths of the attempts that finished no visit: the visit left open, a visit a cancel closed,
# and the crash-retried or policy-retried tries of visits that later finished.
_SELECT_OPEN_PATHS = """
SELECT DISTINCT a.node_path FROM node_attempts a
WHERE a.run_id = ? AND NOT EXISTS (SELECT 1 FROM run_steps s WHERE s.attempt_id = a.attempt_id)
"""


def fork_point(step_paths: Sequence[str], open_paths: Collection[str], node: str) -> int | None:
    """Return how many of the source's steps (node paths in step order) a fork from ``node``
    copies: those before the first step of ``node``, or every step when ``node`` only has an
    attempt that finished no visit (``open_paths``). None when ``node`` never ran."""
    for index, path in enumerate(step_paths):
        if path == node:
            return index
    return len(step_paths) if node in open_paths else None


def definition_paths(snapshot: JsonValue) -> list[str]:
    """Return the full path of every node of a definition snapshot (mounts as ``mount/node``),
    sorted. Raises ``TypeError`` or ``KeyError`` for a value without a snapshot's shape."""
    found: list[str] = []

    def walk(tree: JsonValue, prefix: str) -> None:
        found.extend(prefix + name for name in _object(_object(tree)["nodes"]))
        for name, mount in _object(_object(tree)["includes"]).items():
            walk(_object(mount)["workflow"], f"{prefix}{name}/")

    walk(_object(snapshot)["workflow"], "")
    return sorted(found)


def fork_run(
    tx: Transaction, run_id: str, *, from_node: str, new_run_id: str, actor: Actor
) -> Applied[runs.RunRow] | Conflict:
    """Queue a fork of ``run_id`` that starts at node ``from_node`` (see the module docstring).

    One change: event ``run.forked`` on the fork (payload: parent, lineage, node, how many
    steps were copied); the source is not changed. Every fork is a new run (a second fork of
    the same source and node is another run; the receipt of the durable command makes a retry
    adopt the first). Refusals are a ``Conflict`` and write nothing. Raises ``LookupError`` for
    an unknown run. Expects a write transaction.
    """
    source = runs.require_run(tx, run_id)
    refused = _refusal(tx, source)
    if refused is not None:
        return Conflict(refused)
    # The node text came in the request: a refusal (a stored receipt) names the run's own
    # nodes, never it; the CLI, which has it from its user, names it.
    paths = definition_paths(blobs.read_json(tx, source.definition_digest))
    if from_node not in paths:
        return Conflict(
            f"run {run_id}'s workflow has no node of that path; its nodes: {_list(paths)}"
            f"{_closest_hint(from_node, paths)}; give a full node path as piwf run steps"
            f" {run_id} shows it"
        )
    steps = attempts.list_steps(tx, run_id)
    step_paths = [step.path for step in steps]
    open_paths = {str(row[0]) for row in tx.all(_SELECT_OPEN_PATHS, (run_id,))}
    copied = fork_point(step_paths, open_paths, from_node)
    if copied is None:
        ran = list(dict.fromkeys([*step_paths, *sorted(open_paths)]))
        if not ran:
            return Conflict(
                f"no node has run in run {run_id} yet, so there is nothing to fork from; let"
                f" it run (piwf run resume {run_id} if it is paused) or start it afresh"
                f" (piwf run restart {run_id}, once it ended)"
            )
        return Conflict(
            f"that node never ran in run {run_id}; fork from a node that ran: {_list(ran)}"
        )
    if copied == 0:
        return Conflict(
            f"nothing ran in run {run_id} before that node (the run starts there), so a fork "
            f"would copy nothing; start afresh instead (piwf run restart {run_id}, once it ended)"
        )
    if runs.load_run(tx, new_run_id) is not None:
        return Conflict(f"run {new_run_id} already exists")
    resource_id = ensure_resource(tx, ResourceType.RUN, new_run_id)
    payload: dict[str, JsonValue] = {
        "parentRunId": source.run_id,
        "lineage": "fork",
        "fromNode": from_node,
        "copiedSteps": copied,
    }
    record_change(tx, resource_id, 0, "run.forked", actor, payload=payload)
    runs.insert_restart(
        tx,
        source,
        child_id=new_run_id,
        child_resource_id=resource_id,
        fingerprint=None,
        lineage=Lineage.FORK,
    )
    for step in steps[:copied]:
        attempts.copy_finished_visit(tx, step, new_run_id)
    return Applied(runs.require_run(tx, new_run_id))


def _refusal(tx: Transaction, source: runs.RunRow) -> str | None:
    """Why ``source`` cannot be forked now (its state, not the node), or None."""
    run_id = source.run_id
    lease = read_lease(tx, source.resource_id)
    held = lease is not None and lease.is_live(tx.now)
    if source.executing or held or source.queue_status is QueueStatus.QUEUED:
        return (
            f"run {run_id} is {source.display_status}: a runner holds it or is about to; "
            f"pause it (piwf run pause {run_id}) or let it stop, then fork it"
        )
    unsettled = unsettled_effects_refusal(tx, source, then="fork it")
    if unsettled is not None:
        return unsettled
    session = messages.session_of(tx, run_id)
    holder = None if session is None else messages.session_holder(tx, session)
    if holder is not None:
        return f"session {session} is reserved by run {holder} until it ends"
    return None


def _object(value: JsonValue) -> dict[str, JsonValue]:
    if not isinstance(value, dict):
        raise TypeError("a definition snapshot holds a JSON object here")
    return value


def _closest_hint(node: str, paths: Sequence[str]) -> str:
    """`` (did you mean P?)`` for the run's node path closest to ``node`` (case aside), else
    nothing."""
    folded = {path.casefold(): path for path in paths}
    closest = difflib.get_close_matches(node.casefold(), list(folded), n=1)
    return f" (did you mean {folded[closest[0]]}?)" if closest else ""


def _list(paths: Sequence[str]) -> str:
    shown = ", ".join(paths[:_LISTED])
    return (shown + (", ..." if len(paths) > _LISTED else "")) or "none"
