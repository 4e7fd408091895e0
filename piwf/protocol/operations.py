"""The name (:data:`SCHEMA`) and the operations of ``piwf.client.v1``, and which are durable.

======================  =======  ==========================================================
operation               kind     meaning
======================  =======  ==========================================================
``server.status``       read     safe counts about the running server
``server.stop``         durable  stop the server after in-flight commands finish
``run.start``           durable  commit a new run as queued
``run.list``            read     the run list
``run.get``             read     one run's view
``run.cancel``          durable  cancel a run
``run.pause``           durable  set the run's pause flag
``run.resume``          durable  clear the pause flag / requeue a parked run
``run.restart``         durable  start a fresh child run from the first node
``run.fork``            durable  start a new run at one node with the source's earlier
                                 outputs (nothing before that node runs again)
``run.settings``        read     a run's live settings: each scope's value (as far as read
                                 grants reach), grants and recent changes
``run.changeSettings``  durable  apply an authorized RFC 6902 patch to a run's live settings
                                 (audited; only later attempts see it)
``run.wait``            read     answer once a run is terminal (or the wait times out)
``run.logs``            read     a run's node attempt logs, in bounded pages with a cursor
``state.status``        read     safe counts about the database
``state.verify``        read     check the invariants, report violations
``state.backup``        durable  write a verified backup through the SQLite backup API
``state.prune``         durable  back up, then delete the expired run trees (retention)
``state.prunePreview``  read     list the run trees a prune would delete
``effect.resolve``      durable  settle an ambiguous effect by explicit operator action
``channel.status``      read     channel profiles, their adapters, pending and ambiguous sends
``channel.reload``      durable  re-read the channel profiles; restart the adapters that changed
``channel.recover``     durable  settle an ambiguous channel send: ``confirm`` or ``retry``
``checkpoint.answer``   durable  answer a checkpoint
``decision.answer``     durable  answer a protected human decision
``requests.list``       read     the pending requests (checkpoints, decisions, agent steps)
``interaction.submit``  durable  submit an agent's output; answered once its validation is
                                 durable (accepted or rejected)
``interaction.update``  durable  record a non-completing progress update on an agent request
``resource.apply``      durable  create a managed resource or change its spec
``resource.get``        read     one managed resource in full
``resource.list``       read     the managed resources
``resource.delete``     durable  delete a managed resource (its finalizers run first)
``resource.reconcile``  durable  enqueue a managed resource for a reconcile now
``view.content``        read     one bounded part of a value sent by content reference
``view.run.get``        read     the live run view (``piwf.run-view.v1``) with its first
                                 page of steps
``view.page``           read     the next page of a run view's steps
``view.run.watch``      read     push the run's view on this connection whenever it changes
``view.runs.watch``     read     push the run list on this connection whenever a run changes
``view.unwatch``        read     end one subscription of this connection
``session.attach``      read     make this connection the coordinator of an origin session
                                 (a new epoch; the previous one is fenced; nothing durable)
``session.view``        read     a session's workflow messages; for the active epoch, the
                                 next one to send
``session.list``        read     the sessions runs were bound to
``workflowMessage.``    durable  the conversation's evidence from the active coordinator:
``reportBranch``                 messages found (now sent) and missing (presented again)
``workflowTurn.report`` durable  a model turn's start or end on a sent message
``followUp.queue``      durable  queue a prompt to follow an interactive run that completes
``followUp.remove``     durable  withdraw a follow-up not shown yet
``sessionCapture.``     durable  entries and events of an accepted turn, from the active
``record``                       coordinator (the turn's session capture)
``sessionCapture.read`` read     a run's captured turns and one turn's entries and events
``workflow.list``       read     the workflows ``run.start NAME`` finds, in discovery order
``workflow.show``       read     one workflow's nodes, edges and input contract (loaded in a
                                 resolver child, as ``run.start`` loads it)
======================  =======  ==========================================================

A *durable* operation changes state. Its request must carry an ``idempotencyKey``; the server
commits a receipt keyed by ``(clientId, idempotencyKey)`` together with the change and before it
answers, and replays that receipt to a retry (see :mod:`piwf.protocol.fingerprint`). A *read*
changes nothing, creates no receipt and must not carry an ``idempotencyKey``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

#: The schema every ``piwf.client.v1`` message names.
SCHEMA: Final = "piwf.client.v1"

Operation = Literal[
    "channel.recover",
    "channel.reload",
    "channel.status",
    "checkpoint.answer",
    "decision.answer",
    "effect.resolve",
    "followUp.queue",
    "followUp.remove",
    "interaction.submit",
    "interaction.update",
    "requests.list",
    "resource.apply",
    "resource.delete",
    "resource.get",
    "resource.list",
    "resource.reconcile",
    "run.cancel",
    "run.changeSettings",
    "run.fork",
    "run.get",
    "run.list",
    "run.logs",
    "run.pause",
    "run.restart",
    "run.resume",
    "run.settings",
    "run.start",
    "run.wait",
    "server.status",
    "server.stop",
    "session.attach",
    "session.list",
    "session.view",
    "sessionCapture.read",
    "sessionCapture.record",
    "state.backup",
    "state.prune",
    "state.prunePreview",
    "state.status",
    "state.verify",
    "view.content",
    "view.page",
    "view.run.get",
    "view.run.watch",
    "view.runs.watch",
    "view.unwatch",
    "workflow.list",
    "workflow.show",
    "workflowMessage.reportBranch",
    "workflowTurn.report",
]

#: Every operation name, sorted.
OPERATIONS: tuple[Operation, ...] = get_args(Operation)

#: State-changing operations: an idempotency key is required and a receipt is stored.
DURABLE_OPERATIONS: frozenset[Operation] = frozenset(
    {
        "channel.recover",
        "channel.reload",
        "checkpoint.answer",
        "decision.answer",
        "effect.resolve",
        "followUp.queue",
        "followUp.remove",
        "interaction.submit",
        "interaction.update",
        "resource.apply",
        "resource.delete",
        "resource.reconcile",
        "run.cancel",
        "run.changeSettings",
        "run.fork",
        "run.pause",
        "run.restart",
        "run.resume",
        "run.start",
        "server.stop",
        "sessionCapture.record",
        "state.backup",
        "state.prune",
        "workflowMessage.reportBranch",
        "workflowTurn.report",
    }
)

#: Operations that change nothing: no idempotency key, no receipt.
READ_OPERATIONS: frozenset[Operation] = frozenset(OPERATIONS) - DURABLE_OPERATIONS

#: Operations about one run: the request names it in ``runId``, and the server refuses one
#: without (``invalidPayload``); the client refuses a missing run id before sending.
RUN_OPERATIONS: frozenset[Operation] = frozenset(
    {
        "run.cancel",
        "run.changeSettings",
        "run.fork",
        "run.get",
        "run.logs",
        "run.pause",
        "run.restart",
        "run.resume",
        "run.settings",
        "run.wait",
        "view.page",
        "view.run.get",
        "view.run.watch",
    }
)

#: Operations that honour ``expectedRevision`` (a compare-and-set on the run's revision, or on
#: the resource's version); any other refuses it, since it would be ignored and a client
#: would believe the command guarded.
REVISION_OPERATIONS: frozenset[Operation] = frozenset(
    {"resource.apply", "resource.delete", "run.cancel", "run.pause", "run.resume"}
)

#: Payload keys left out of the durable fingerprint, per operation. A coordinator epoch belongs
#: to one live connection of an interactive session: a retry after reconnecting carries a new
#: one and must still adopt the receipt of the same answer (the original's rule).
FINGERPRINT_EXCLUDED_PAYLOAD_KEYS: Mapping[Operation, frozenset[str]] = MappingProxyType(
    {
        "checkpoint.answer": frozenset({"coordinatorEpoch"}),
        "run.changeSettings": frozenset({"coordinatorEpoch"}),
        "decision.answer": frozenset({"coordinatorEpoch"}),
        "run.restart": frozenset({"coordinatorEpoch"}),
        "interaction.submit": frozenset({"coordinatorEpoch"}),
        "interaction.update": frozenset({"coordinatorEpoch"}),
        "workflowMessage.reportBranch": frozenset({"coordinatorEpoch"}),
        "workflowTurn.report": frozenset({"coordinatorEpoch"}),
        "sessionCapture.record": frozenset({"coordinatorEpoch"}),
    }
)


def is_operation(name: str) -> bool:
    """Return True when ``name`` is an operation of ``piwf.client.v1``."""
    return name in _OPERATION_SET


def is_durable(operation: str) -> bool:
    """Return True for a state-changing operation; False for a read or an unknown name."""
    return operation in DURABLE_OPERATIONS


_OPERATION_SET: frozenset[str] = frozenset(OPERATIONS)
