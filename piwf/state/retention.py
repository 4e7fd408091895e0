"""Retention: which terminal run trees have expired, and deleting exactly one of them.

A *tree* is a root run (no parent, its own root) and every run whose ``root_run_id`` names it:
its restarts and theirs. The automatic sweep and ``piwf state prune`` share everything here::

    expired_roots(tx, cutoff)        roots whose every run is terminal and finished < cutoff
      -> judge_tree(tx, root, now, cutoff)   every protection below, by reason code
      -> delete_tree(tx, root, now, cutoff)  judge again, then in one savepoint delete the
                                             tree's resources (cascading to everything of the
                                             tree), its now unused definitions and projects,
                                             then the blobs nothing references any more

A tree is deleted only when no reason holds (codes in reports and receipts):

==============  ===========================================================================
reason          what protects the tree
==============  ===========================================================================
notTerminal     a run is not completed, failed, timed_out or cancelled, or has no finish time
recent          a run finished at or after the cutoff
lineage         the root is not a root, or a run's parent is outside the tree
queue           a queue row is queued, starting, running or parked
attempt         a node attempt is pending, running or waiting
request         an interactive request is pending or answered but not consumed
message         a workflow message is still pending (its session has not shown it yet)
turn            a workflow turn is still open (its session has not reported its end)
submission      an agent submission is still ``validating`` (its child may report)
decision        a human decision has no resolution
lease           a lease of the tree (run, effect or decision) is held: owner set, unexpired
effect          an effect is pending, applying or ambiguous, or has an open attempt
runner          a runner row is starting, ready or running
crossTree:T     a row of table T that belongs to another tree references this one
reference:T     table T, which is not part of a run tree, references it (unknown ownership:
                a resource manager's child run, a table added later)
deleteRefused   deleting raised a constraint error (a foreign key the checks above did not
                foresee); the savepoint was rolled back
==============  ===========================================================================

What belongs to a tree is the one explicit map :data:`TREE_ROWS` (table -> which of its rows
are the tree's). Every other reference is found from the schema's foreign keys at run time, so
a table added later protects the trees it references until it is classified here. Blob
columns, too, are found from the schema (every foreign key to ``blobs``), never listed by hand.

A matching repeated deletion is :class:`Adopted` and changes nothing. The functions here never
commit; the caller's ``write()`` does. Files are not transactional: a deleted run's attempt log
files (``$PIWF_HOME/logs/<run>/``) are removed by the caller once the deletion committed
(:func:`piwf.state.execution.attempt_logs.remove_run_logs`, and
:func:`~piwf.state.execution.attempt_logs.remove_orphaned_logs` for what a crash left).
Giving the freed space back to the file system (checkpoint, ``VACUUM``) is
:mod:`piwf.state.compaction`, outside any transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from piwf.canonical import encode
from piwf.errors import InvalidTransitionError
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.state.database import Transaction

DAY_MS = 86_400_000
DEFAULT_RETENTION_DAYS = 30

#: How many values one ``IN (?, ...)`` list binds at most.
_CHUNK = 500

_RUNS = "run_id IN (SELECT value FROM json_each(:runs))"
_RESOURCES = "resource_id IN (SELECT value FROM json_each(:resources))"

#: Every table whose rows can belong to a run tree, and which of its rows do (a WHERE clause
#: over that table with the parameters ``:runs`` and ``:resources``, JSON arrays of the tree's
#: run ids and resource ids). Deleting the tree's resources removes exactly these rows, through
#: ``ON DELETE CASCADE``.
TREE_ROWS: Mapping[str, str] = MappingProxyType(
    {
        "resources": _RESOURCES,
        "leases": _RESOURCES,
        "events": _RESOURCES,
        "effects": _RESOURCES,
        "effect_attempts": """effect_id IN (SELECT effect_id FROM effects
            WHERE resource_id IN (SELECT value FROM json_each(:resources)))""",
        "runs": _RUNS,
        "run_sources": _RUNS,
        "run_bindings": _RUNS,
        "run_queue": _RUNS,
        "node_attempts": _RUNS,
        "run_steps": _RUNS,
        "workflow_updates": """attempt_id IN (SELECT attempt_id FROM node_attempts
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
        "run_runners": _RUNS,
        "runner_messages": """runner_epoch IN (SELECT runner_epoch FROM run_runners
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
        "interactive_requests": _RUNS,
        "interactive_submissions": """request_id IN (SELECT request_id FROM interactive_requests
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
        "run_notifications": _RUNS,
        "workflow_messages": _RUNS,
        "workflow_turns": _RUNS,
        "session_segments": _RUNS,
        "session_entries": _RUNS,
        "session_events": _RUNS,
        "attempt_entries": """attempt_id IN (SELECT attempt_id FROM node_attempts
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
        "human_decisions": _RUNS,
        "human_decision_resolutions": """decision_id IN (SELECT decision_id FROM human_decisions
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
        "human_decision_submissions": """decision_id IN (SELECT decision_id FROM human_decisions
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
        "attempt_active_intervals": """attempt_id IN (SELECT attempt_id FROM node_attempts
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
        "agent_processes": _RUNS,
        "agent_turns": _RUNS,
        "attempt_logs": _RUNS,
        "workflow_settings": _RUNS,
        "workflow_setting_changes": """scope_id IN (SELECT scope_id FROM workflow_settings
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
        "attempt_settings": """attempt_id IN (SELECT attempt_id FROM node_attempts
            WHERE run_id IN (SELECT value FROM json_each(:runs)))""",
    }
)

#: Shared rows a tree uses but does not own: deleted with the last tree that uses them.
_SHARED_PARENTS = ("workflow_definitions", "projects")

_EXPIRED_ROOTS = """
SELECT r.run_id FROM runs r
WHERE r.parent_run_id IS NULL AND r.root_run_id = r.run_id
  AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled') AND r.finished_at < :cutoff
  AND NOT EXISTS (
    SELECT 1 FROM runs m WHERE m.root_run_id = r.run_id
      AND (m.status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
           OR m.finished_at IS NULL OR m.finished_at >= :cutoff))
ORDER BY r.finished_at, r.run_id
"""

_TREE_RUNS = """
SELECT run_id, resource_id FROM runs WHERE root_run_id = ? ORDER BY restart_number, run_id
"""

_EFFECT_RESOURCES = """
SELECT resource_id FROM effects
WHERE source_resource_id IN (SELECT value FROM json_each(:resources))
"""

_DECISION_RESOURCES = """
SELECT resource_id FROM human_decisions WHERE run_id IN (SELECT value FROM json_each(:runs))
"""

_SETTINGS_RESOURCES = """
SELECT resource_id FROM workflow_settings WHERE run_id IN (SELECT value FROM json_each(:runs))
"""

#: Reason code -> a query that finds one row proving it (parameters :runs, :resources, :now,
#: :cutoff). ``reference``/``crossTree`` come from the schema's foreign keys instead.
_PROTECTIONS: Mapping[str, str] = MappingProxyType(
    {
        "notTerminal": """
            SELECT 1 FROM runs WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND (status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
                   OR finished_at IS NULL)""",
        "recent": """
            SELECT 1 FROM runs WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND finished_at >= :cutoff""",
        "lineage": """
            SELECT 1 FROM runs WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND parent_run_id IS NOT NULL
              AND parent_run_id NOT IN (SELECT value FROM json_each(:runs))""",
        "queue": """
            SELECT 1 FROM run_queue WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND status IN ('queued', 'starting', 'running', 'parked')""",
        "attempt": """
            SELECT 1 FROM node_attempts WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND status IN ('pending', 'running', 'waiting')""",
        "request": """
            SELECT 1 FROM interactive_requests WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND status IN ('pending', 'answered')""",
        "message": """
            SELECT 1 FROM workflow_messages WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND status = 'pending'""",
        "turn": """
            SELECT 1 FROM workflow_turns WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND state = 'started'""",
        "submission": """
            SELECT 1 FROM interactive_submissions s
              JOIN interactive_requests i ON i.request_id = s.request_id
            WHERE i.run_id IN (SELECT value FROM json_each(:runs))
              AND s.outcome = 'validating'""",
        "decision": """
            SELECT 1 FROM human_decisions d WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r
                              WHERE r.decision_id = d.decision_id)""",
        "lease": """
            SELECT 1 FROM leases WHERE resource_id IN (SELECT value FROM json_each(:resources))
              AND owner_id IS NOT NULL AND expires_at > :now""",
        "effect": """
            SELECT 1 FROM effects e WHERE resource_id IN (SELECT value FROM json_each(:resources))
              AND (status IN ('pending', 'applying', 'ambiguous')
                   OR EXISTS (SELECT 1 FROM effect_attempts a
                              WHERE a.effect_id = e.effect_id AND a.finished_at IS NULL))""",
        "runner": """
            SELECT 1 FROM run_runners WHERE run_id IN (SELECT value FROM json_each(:runs))
              AND status IN ('starting', 'ready', 'running')""",
    }
)

_TREE_DEFINITIONS = """
SELECT DISTINCT definition_digest FROM runs
WHERE run_id IN (SELECT value FROM json_each(:runs))
"""

_TREE_PROJECTS = """
SELECT DISTINCT project_id FROM runs
WHERE run_id IN (SELECT value FROM json_each(:runs)) AND project_id IS NOT NULL
"""

_DELETE_TREE_RESOURCES = """
DELETE FROM resources WHERE resource_id IN (SELECT value FROM json_each(:resources))
"""

_COUNT_TREE_RUNS = """
SELECT count(*) FROM runs WHERE run_id IN (SELECT value FROM json_each(:runs))
"""

_FOREIGN_KEYS = """
SELECT m.name, f.id, f.seq, f."table", f."from", f."to", f.on_delete
FROM sqlite_schema m, pragma_foreign_key_list(m.name) f
WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'
ORDER BY m.name, f.id, f.seq
"""


@dataclass(frozen=True)
class ForeignKey:
    """One foreign key of the live schema: ``table(columns) -> parent(parent_columns)``."""

    table: str
    columns: tuple[str, ...]
    parent: str
    parent_columns: tuple[str, ...]
    on_delete: str

    @property
    def detaches(self) -> bool:
        """Whether deleting the parent only detaches the referencing row (SET NULL/DEFAULT)."""
        return self.on_delete.upper() in ("SET NULL", "SET DEFAULT")


@dataclass(frozen=True)
class Tree:
    """One root run tree: its runs (root first) and every resource id that belongs to it."""

    root_run_id: str
    run_ids: tuple[str, ...]
    resource_ids: tuple[str, ...]

    def params(self, **extra: Any) -> dict[str, Any]:
        """The ``:runs`` / ``:resources`` parameters of the :data:`TREE_ROWS` clauses."""
        return {
            "runs": encode(list(self.run_ids)).decode(),
            "resources": encode(list(self.resource_ids)).decode(),
            **extra,
        }


@dataclass(frozen=True)
class TreeVerdict:
    """What the selector decided about one tree; no ``reasons`` means it may be deleted."""

    root_run_id: str
    run_ids: tuple[str, ...]
    reasons: tuple[str, ...]

    @property
    def expired(self) -> bool:
        """True when nothing protects the tree."""
        return not self.reasons


@dataclass(frozen=True)
class TreeProtected(Conflict):
    """The :class:`Conflict` of a protected tree, with its reason codes."""

    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class TreeDeletion:
    """One deleted tree: its runs, how many resources and blobs went with it."""

    root_run_id: str
    run_ids: tuple[str, ...]
    resources: int
    blobs: int


@dataclass(frozen=True)
class RetentionStatus:
    """The stored bookkeeping of the automatic sweep (no payloads)."""

    last_started_at: int | None
    last_completed_at: int | None
    last_trees_deleted: int
    last_runs_deleted: int
    last_trees_protected: int
    total_trees_deleted: int
    last_failure_at: int | None
    last_failure: str | None


def cutoff_for(now_ms: int, days: int = DEFAULT_RETENTION_DAYS) -> int:
    """Return the cutoff that keeps ``days`` days of finished runs before ``now_ms``."""
    if days < 1:
        raise ValueError(f"retention keeps at least one day, not {days}")
    return now_ms - days * DAY_MS


# -- selecting ----------------------------------------------------------------------------------


def expired_roots(tx: Transaction, cutoff: int) -> list[str]:
    """Return the roots of trees whose every run is terminal and finished before ``cutoff``,
    oldest first. Protections are not judged here (see :func:`judge_tree`)."""
    return [str(row[0]) for row in tx.all(_EXPIRED_ROOTS, {"cutoff": cutoff})]


def load_tree(tx: Transaction, root_run_id: str) -> Tree | None:
    """Return the tree of ``root_run_id``, or None when no run has that root."""
    rows = tx.all(_TREE_RUNS, (root_run_id,))
    if not rows:
        return None
    run_ids = [str(row["run_id"]) for row in rows]
    run_ids.sort(key=lambda run_id: run_id != root_run_id)
    resources = {str(row["resource_id"]) for row in rows}
    # Effects of the tree's aggregates, and their effects, and the runs' decisions.
    while True:
        tree = Tree(root_run_id, tuple(run_ids), tuple(sorted(resources)))
        found = {str(row[0]) for row in tx.all(_EFFECT_RESOURCES, tree.params())}
        found |= {str(row[0]) for row in tx.all(_DECISION_RESOURCES, tree.params())}
        found |= {str(row[0]) for row in tx.all(_SETTINGS_RESOURCES, tree.params())}
        if found <= resources:
            return tree
        resources |= found


def judge_tree(tx: Transaction, root_run_id: str, now: int, cutoff: int) -> TreeVerdict | None:
    """Return the verdict on one tree (every reason that protects it), or None when
    ``root_run_id`` is no run's root. Reads only."""
    return _judge(tx, root_run_id, now, cutoff, foreign_keys(tx))


def _judge(
    tx: Transaction, root_run_id: str, now: int, cutoff: int, keys: Sequence[ForeignKey]
) -> TreeVerdict | None:
    tree = load_tree(tx, root_run_id)
    if tree is None:
        return None
    return TreeVerdict(root_run_id, tree.run_ids, _reasons(tx, tree, now, cutoff, keys))


def select_trees(tx: Transaction, now: int, cutoff: int) -> list[TreeVerdict]:
    """Judge every tree :func:`expired_roots` names, oldest first."""
    keys = foreign_keys(tx)
    verdicts = []
    for root in expired_roots(tx, cutoff):
        verdict = _judge(tx, root, now, cutoff, keys)
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


def _reasons(
    tx: Transaction, tree: Tree, now: int, cutoff: int, keys: Sequence[ForeignKey]
) -> tuple[str, ...]:
    params = tree.params(now=now, cutoff=cutoff)
    reasons = [code for code, sql in _PROTECTIONS.items() if tx.one(sql, params) is not None]
    root = tx.one(
        "SELECT parent_run_id, root_run_id FROM runs WHERE run_id = ?", (tree.root_run_id,)
    )
    if root is None or root[0] is not None or root[1] != tree.root_run_id:
        reasons.append("lineage")
    for key in keys:
        if key.parent not in TREE_ROWS or key.detaches:
            continue
        owned = key.table in TREE_ROWS
        code = f"{'crossTree' if owned else 'reference'}:{key.table}"
        if code in reasons:
            continue
        # Identifiers come from the live schema (quoted), clauses from TREE_ROWS; values bind.
        sql = (
            f"SELECT 1 FROM {_quote(key.table)} WHERE ({_columns(key.columns)}) IN"  # noqa: S608
            f" (SELECT {_columns(key.parent_columns)} FROM {_quote(key.parent)}"
            f" WHERE {TREE_ROWS[key.parent]})"
        )
        if owned:
            sql += f" AND NOT ({TREE_ROWS[key.table]})"
        if tx.one(sql + " LIMIT 1", params) is not None:
            reasons.append(code)
    return tuple(dict.fromkeys(reasons))


# -- deleting -----------------------------------------------------------------------------------


def delete_tree(
    tx: Transaction, root_run_id: str, now: int, cutoff: int
) -> Applied[TreeDeletion] | Adopted[None] | TreeProtected:
    """Judge the tree of ``root_run_id`` again and delete exactly it, in one savepoint.

    Deleted: the runs' resources, their effects' and decisions' resources (cascading to the
    runs and every row :data:`TREE_ROWS` names), then the definitions and projects no run
    uses any more, then the blobs those rows referenced that no row references now.

    Returns :class:`Applied` with what was deleted; :class:`Adopted` (nothing written) when no
    tree has that root, as after an earlier deletion; :class:`TreeProtected` (a
    :class:`Conflict`) with the reason codes when anything protects the tree or deleting it
    failed a constraint (the savepoint is rolled back, nothing changed). Expects a write
    transaction; never commits.
    """
    if not tx.writable:
        raise InvalidTransitionError("deleting a tree needs a write transaction")
    tree = load_tree(tx, root_run_id)
    if tree is None:
        return Adopted(None)
    keys = foreign_keys(tx)
    reasons = _reasons(tx, tree, now, cutoff, keys)
    if reasons:
        return _protected(reasons)
    try:
        with tx.savepoint() as step:
            return Applied(_delete(step, tree, keys))
    except sqlite3.IntegrityError:
        return _protected(("deleteRefused",))


def _protected(reasons: tuple[str, ...]) -> TreeProtected:
    return TreeProtected("protected: " + ", ".join(reasons), reasons=reasons)


def _delete(tx: Transaction, tree: Tree, keys: Sequence[ForeignKey]) -> TreeDeletion:
    params = tree.params()
    candidates: set[bytes] = set()
    for key in keys:
        if key.parent == "blobs" and key.table in TREE_ROWS and len(key.columns) == 1:
            column = _quote(key.columns[0])
            rows = tx.all(
                f"SELECT DISTINCT {column} FROM {_quote(key.table)}"  # noqa: S608 - see _reasons
                f" WHERE {TREE_ROWS[key.table]} AND {column} IS NOT NULL",
                params,
            )
            candidates.update(bytes(row[0]) for row in rows)
    shared = {
        "workflow_definitions": [row[0] for row in tx.all(_TREE_DEFINITIONS, params)],
        "projects": [row[0] for row in tx.all(_TREE_PROJECTS, params)],
    }
    resources = tx.execute(_DELETE_TREE_RESOURCES, params).rowcount
    left = tx.scalar(_COUNT_TREE_RUNS, params)
    if left:  # pragma: no cover - runs cascade from their resource rows by the schema
        raise InvalidTransitionError(f"{left} run(s) of tree {tree.root_run_id} survived")
    for table in _SHARED_PARENTS:
        gone = _delete_unreferenced(tx, keys, table, shared[table])
        if table == "workflow_definitions":
            candidates.update(bytes(value) for value in gone)
    blob_count = len(_delete_unreferenced(tx, keys, "blobs", list(candidates)))
    return TreeDeletion(tree.root_run_id, tree.run_ids, resources, blob_count)


def _delete_unreferenced(
    tx: Transaction, keys: Sequence[ForeignKey], table: str, values: Sequence[Any]
) -> list[Any]:
    """Delete the rows of ``table`` (single-column primary key) among ``values`` that no
    foreign key of the schema references any more; return the deleted keys."""
    if not values:
        return []
    if any(key.parent == table and len(key.columns) != 1 for key in keys):
        return []  # a composite reference cannot be checked value by value: keep every row
    column = _primary_key(tx, table)
    referenced: set[Any] = set()
    for key in keys:
        if key.parent != table or len(key.columns) != 1:
            continue
        source = _quote(key.columns[0])
        for chunk in _chunks(values):
            marks = ", ".join(["?"] * len(chunk))
            rows = tx.all(
                f"SELECT DISTINCT {source} FROM {_quote(key.table)}"  # noqa: S608 - see _reasons
                f" WHERE {source} IN ({marks})",
                chunk,
            )
            referenced.update(_hashable(row[0]) for row in rows)
    unused = [value for value in values if _hashable(value) not in referenced]
    for chunk in _chunks(unused):
        marks = ", ".join(["?"] * len(chunk))
        tx.execute(
            f"DELETE FROM {_quote(table)} WHERE {_quote(column)} IN ({marks})",  # noqa: S608
            chunk,
        )
    return unused


def foreign_keys(tx: Transaction) -> list[ForeignKey]:
    """Every foreign key of the live schema (composite keys as one entry)."""
    grouped: dict[tuple[str, int], list[sqlite3.Row]] = {}
    for row in tx.all(_FOREIGN_KEYS):
        grouped.setdefault((str(row[0]), int(row[1])), []).append(row)
    keys = []
    for (table, _id), rows in grouped.items():
        parent = str(rows[0][3])
        targets = tuple(row[5] for row in rows)
        if any(target is None for target in targets):
            targets = (_primary_key(tx, parent),)
        keys.append(
            ForeignKey(
                table=table,
                columns=tuple(str(row[4]) for row in rows),
                parent=parent,
                parent_columns=tuple(str(target) for target in targets),
                on_delete=str(rows[0][6]),
            )
        )
    return keys


def _primary_key(tx: Transaction, table: str) -> str:
    rows = tx.all("SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", (table,))
    if len(rows) != 1:
        raise InvalidTransitionError(f"{table} has no single-column primary key")
    return str(rows[0][0])


def _hashable(value: Any) -> Any:
    return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else value


def _chunks(values: Sequence[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(values), _CHUNK):
        yield list(values[start : start + _CHUNK])


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _columns(columns: Iterable[str]) -> str:
    return ", ".join(_quote(column) for column in columns)


# -- bookkeeping of the automatic sweep ---------------------------------------------------------


def read_status(tx: Transaction) -> RetentionStatus:
    """Return the stored sweep bookkeeping (the row is created with the schema)."""
    row = tx.one(
        "SELECT last_started_at, last_completed_at, last_trees_deleted, last_runs_deleted,"
        " last_trees_protected, total_trees_deleted, last_failure_at, last_failure"
        " FROM retention_state WHERE id = 1"
    )
    assert row is not None, "retention_state has its row from the schema"
    return RetentionStatus(*tuple(row))


def record_sweep_started(tx: Transaction) -> None:
    """Note that an automatic sweep began now (``tx.now``)."""
    tx.execute("UPDATE retention_state SET last_started_at = ? WHERE id = 1", (tx.now,))


def record_trees_deleted(tx: Transaction, count: int) -> None:
    """Count ``count`` deleted trees in the running total (in their deletion's transaction)."""
    tx.execute(
        "UPDATE retention_state SET total_trees_deleted = total_trees_deleted + ? WHERE id = 1",
        (count,),
    )


def record_sweep_completed(tx: Transaction, *, trees: int, runs: int, protected: int) -> None:
    """Note a completed sweep and what it deleted; a completed sweep clears the last failure."""
    tx.execute(
        "UPDATE retention_state SET last_completed_at = ?, last_trees_deleted = ?,"
        " last_runs_deleted = ?, last_trees_protected = ?,"
        " last_failure_at = NULL, last_failure = NULL WHERE id = 1",
        (tx.now, trees, runs, protected),
    )


def record_sweep_failed(tx: Transaction, diagnostic: str) -> None:
    """Keep one bounded diagnostic of the last failure (the caller passes no payloads)."""
    text = diagnostic.strip()[:512] or "failed"
    tx.execute(
        "UPDATE retention_state SET last_failure_at = ?, last_failure = ? WHERE id = 1",
        (tx.now, text),
    )
