"""The one DDL of the piwf state database and its digest.

Every table is ``STRICT``. Timestamps are INTEGER epoch milliseconds. ``*_hash`` columns hold
32-byte SHA-256 digests that reference :data:`blobs` rows. The DDL changes in place while piwf is
alpha: any change changes :data:`SCHEMA_DIGEST`, and a database built from another digest is
refused untouched (see :mod:`piwf.state.database`).

Lifecycle values are mirrored by the enums in :mod:`piwf.state.enums`; a test compares each
``CHECK (... IN (...))`` list with its enum.

The DDL lives with its aggregate and is assembled here, in this statement order (the order is
part of the digest, so it never changes without a reason)::

    core.RECORD_STATEMENTS       schema_meta, projects, blobs, resources, leases, events, effects
    execution.RUN_STATEMENTS     definitions, runs, sources, bindings, queue, attempts, steps,
                                 updates
    core.SERVER_STATEMENTS       server_state (the epoch), server_commands (receipts)
    execution.RUNNER_STATEMENTS  runners, runner messages, interactive requests, notifications
    decisions                    human decisions, their winner and every submission
    retention                    the retention sweep's row and index
    resources                    managed resources, finalizers, queue, runners, child workflows
    interactions                 agent submissions and their validation
    agents                       attempt active intervals, agent processes, agent turns
    logs                         attempt logs (each attempt's captured output file)
    sessions                     workflow messages (what an origin session's conversation shows),
                                 workflow turns
    session_capture              session capture: segments, entries, attempt entries, events
    settings                     live settings: scopes, their changes, each attempt's copy
    channels                     channels (adapter epochs), their update cursors, the messages
                                 that presented and settled decisions
"""

from __future__ import annotations

import hashlib

from piwf.state.schema.agents import AGENT_STATEMENTS
from piwf.state.schema.channels import CHANNEL_STATEMENTS
from piwf.state.schema.core import RECORD_STATEMENTS, SERVER_STATEMENTS
from piwf.state.schema.decisions import DECISION_STATEMENTS
from piwf.state.schema.execution import RUN_STATEMENTS, RUNNER_STATEMENTS
from piwf.state.schema.interactions import INTERACTION_STATEMENTS
from piwf.state.schema.logs import LOG_STATEMENTS
from piwf.state.schema.resources import RESOURCE_STATEMENTS
from piwf.state.schema.retention import RETENTION_STATEMENTS
from piwf.state.schema.session_capture import CAPTURE_STATEMENTS
from piwf.state.schema.sessions import SESSION_STATEMENTS
from piwf.state.schema.settings import SETTINGS_STATEMENTS

SCHEMA_NAME = "piwf-state"
SCHEMA_VERSION = 1
APPLICATION_ID = 0x50495746  # "PIWF"

#: Statements in execution order; each one is a single SQL statement.
STATEMENTS: tuple[str, ...] = tuple(
    statement.strip()
    for statement in (
        *RECORD_STATEMENTS,
        *RUN_STATEMENTS,
        *SERVER_STATEMENTS,
        *RUNNER_STATEMENTS,
        *DECISION_STATEMENTS,
        *RETENTION_STATEMENTS,
        *RESOURCE_STATEMENTS,
        *INTERACTION_STATEMENTS,
        *AGENT_STATEMENTS,
        *LOG_STATEMENTS,
        *SESSION_STATEMENTS,
        *CAPTURE_STATEMENTS,
        *SETTINGS_STATEMENTS,
        *CHANNEL_STATEMENTS,
    )
)

#: The full DDL text, the single source of truth for the schema.
SCHEMA_SQL = ";\n\n".join(STATEMENTS) + ";\n"

#: SHA-256 of :data:`SCHEMA_SQL`; stored in ``schema_meta`` and checked on every open.
SCHEMA_DIGEST = hashlib.sha256(SCHEMA_SQL.encode("utf-8")).digest()
