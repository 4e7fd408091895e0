"""Retention: which terminal run trees have expired, and deleting exactly one of them.

A *tree* is a root run (no parent, its own root) and every run whose ``root_run_id`` names it:
its restarts and theirs. The automatic sweep and ``piwf state prune`` share everything here::

    expired_roots(tx, cutoff)        roots whose every run is terminal and finished < cutoff
      -> judge_tree(tx, root, now, cutoff)   every protection below, by reason code;
                                             select_trees judges every expired root so,
                                             each check one statement per 500 trees
      -> delete_tree(tx, root, now, cutoff)  judge again, then in one savepoint delete the
                                             tree's resources (cascading to everything of the
                                             tree), its now unused definitions and projects,
                                             then the blobs nothing references any more
      or delete_trees(tx, roots, now, cutoff)   the same for each root in turn (judged again
                                             right before its savepoint), the unused
                                             definitions, projects and blobs of all of them
                                             deleted once at the end (``piwf state prune``)

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

import functools
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from piwf.canonical import encode
from piwf.errors import InvalidTransitionError
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.state.database import Transaction
from piwf.state.references import ForeignKey as ForeignKey
from piwf.state.references import chunks as _chunks
from piwf.state.references import columns as _columns
from piwf.state.references import delete_unreferenced
from piwf.state.references import foreign_keys as foreign_keys
from piwf.state.references import quote as _quote
from piwf.state.retention_status import RetentionStatus as RetentionStatus
from piwf.state.retention_status import read_status as read_status
from piwf.state.retention_status import record_sweep_completed as record_sweep_completed
from piwf.state.retention_status import record_sweep_failed as record_sweep_failed
from piwf.state.retention_status import record_sweep_started as record_sweep_started
from piwf.state.retention_status import record_trees_deleted as record_trees_deleted

DAY_MS = 86_400_000
DEFAULT_RETENTION_DAYS = 30

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

_TREES_RUNS = """
SELECT root_run_id, run_id, resource_id FROM runs
WHERE root_run_id IN (SELECT value FROM json_each(:roots)) ORDER BY restart_number, run_id
"""

#: Aggregates of a tree beyond its runs' (table, which of its rows: a clause over ``:runs`` and
#: ``:resources``): the effects of its aggregates, and theirs, its decisions and its settings.
_MORE_RESOURCES: tuple[tuple[str, str], ...] = (
    ("effects", "source_resource_id IN (SELECT value FROM json_each(:resources))"),
    ("human_decisions", _RUNS),
    ("workflow_settings", _RUNS),
)

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

#: The other half of ``lineage``: the root is a root (parameter :root, the tree's root id).
_NOT_A_ROOT = """
SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM runs WHERE run_id = :root
  AND parent_run_id IS NULL AND root_run_id = run_id)"""

#: A check over one tree (``:runs``, ``:resources``, ``:root``) made a check of every tree of
#: ``json_each(:trees)`` (``{root: [runs, resources]}``), bound from that row instead.
_TREE_PARAMETERS = re.compile(r":(runs|resources|root)\b")
_FROM_ROW = {
    "runs": "json_extract(judged.value, '$[0]')",
    "resources": "json_extract(judged.value, '$[1]')",
    "root": "judged.key",
}

#: The definitions and projects of the runs of every tree of ``json_each(:trees)``.
_TREES_SHARED = """
SELECT DISTINCT runs.definition_digest, runs.project_id FROM json_each(:trees) judged, runs
WHERE runs.run_id IN (SELECT value FROM json_each(json_extract(judged.value, '$[0]')))
"""

_DELETE_TREE_RESOURCES = """
DELETE FROM resources WHERE resource_id IN (SELECT value FROM json_each(:resources))
"""

_COUNT_TREE_RUNS = """
SELECT count(*) FROM runs WHERE run_id IN (SELECT value FROM json_each(:runs))
"""


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
    """One deleted tree: its runs, how many resources and blobs went with it (blobs 0 when
    :func:`delete_trees` deleted them for many trees at once)."""

    root_run_id: str
    run_ids: tuple[str, ...]
    resources: int
    blobs: int


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
    return load_trees(tx, [root_run_id]).get(root_run_id)


def load_trees(tx: Transaction, roots: Sequence[str]) -> dict[str, Tree]:
    """Return the tree of each of ``roots`` (at most 500) that is some run's root,
    in a fixed number of statements per round of the closure, whatever the number of trees."""
    runs: dict[str, list[str]] = {}
    resources: dict[str, set[str]] = {}
    for row in tx.all(_TREES_RUNS, {"roots": _json(roots)}):
        root = str(row["root_run_id"])
        runs.setdefault(root, []).append(str(row["run_id"]))
        resources.setdefault(root, set()).add(str(row["resource_id"]))
    for root, run_ids in runs.items():  # the root first, then restarts in their order
        run_ids.sort(key=root.__ne__)
    # Effects of the trees' aggregates, and their effects, and the runs' decisions and settings.
    growing = list(runs)
    while growing:
        trees = {
            root: Tree(root, tuple(runs[root]), tuple(sorted(resources[root]))) for root in growing
        }
        found: dict[str, set[str]] = {}
        for table, clause in _MORE_RESOURCES:
            sql = (
                f"SELECT judged.key, {table}.resource_id"  # noqa: S608 - constants above
                f" FROM json_each(:trees) judged, {table} WHERE {_for_each_tree(clause)}"
            )
            for row in tx.all(sql, {"trees": _trees_json(trees.values())}):
                found.setdefault(str(row[0]), set()).add(str(row[1]))
        growing = [root for root in growing if not found.get(root, set()) <= resources[root]]
        for root in growing:
            resources[root] |= found[root]
    return {root: Tree(root, tuple(runs[root]), tuple(sorted(resources[root]))) for root in runs}


def judge_tree(tx: Transaction, root_run_id: str, now: int, cutoff: int) -> TreeVerdict | None:
    """Return the verdict on one tree (every reason that protects it), or None when
    ``root_run_id`` is no run's root. Reads only."""
    verdicts = _judge(tx, [root_run_id], now, cutoff, foreign_keys(tx))
    return verdicts[0] if verdicts else None


def select_trees(tx: Transaction, now: int, cutoff: int) -> list[TreeVerdict]:
    """Judge every tree :func:`expired_roots` names, oldest first.

    Each check runs once for up to 500 trees (the same statement as for one tree,
    bound from each tree's row), so the statements grow with the chunks, not the trees."""
    keys = foreign_keys(tx)
    verdicts = []
    for roots in _chunks(expired_roots(tx, cutoff)):
        verdicts.extend(_judge(tx, roots, now, cutoff, keys))
    return verdicts


def _judge(
    tx: Transaction, roots: Sequence[str], now: int, cutoff: int, keys: Sequence[ForeignKey]
) -> list[TreeVerdict]:
    trees = load_trees(tx, roots)
    found = _reasons_of(tx, list(trees.values()), now, cutoff, keys)
    return [TreeVerdict(root, trees[root].run_ids, found[root]) for root in roots if root in trees]


def _reasons(
    tx: Transaction, tree: Tree, now: int, cutoff: int, keys: Sequence[ForeignKey]
) -> tuple[str, ...]:
    return _reasons_of(tx, [tree], now, cutoff, keys)[tree.root_run_id]


def _checks(keys: Sequence[ForeignKey]) -> Iterator[tuple[str, str]]:
    """Every (reason code, query that finds a row proving it for one tree), in report order."""
    yield from _PROTECTIONS.items()
    yield "lineage", _NOT_A_ROOT
    for key in keys:
        if key.parent not in TREE_ROWS or key.detaches:
            continue
        owned = key.table in TREE_ROWS
        # Identifiers come from the live schema (quoted), clauses from TREE_ROWS; values bind.
        sql = (
            f"SELECT 1 FROM {_quote(key.table)} WHERE ({_columns(key.columns)}) IN"  # noqa: S608
            f" (SELECT {_columns(key.parent_columns)} FROM {_quote(key.parent)}"
            f" WHERE {TREE_ROWS[key.parent]})"
        )
        if owned:
            sql += f" AND NOT ({TREE_ROWS[key.table]})"
        yield f"{'crossTree' if owned else 'reference'}:{key.table}", sql + " LIMIT 1"


def _reasons_of(
    tx: Transaction, trees: Sequence[Tree], now: int, cutoff: int, keys: Sequence[ForeignKey]
) -> dict[str, tuple[str, ...]]:
    """Every tree's reasons: each check runs once for all ``trees`` (at most 500)."""
    reasons: dict[str, list[str]] = {tree.root_run_id: [] for tree in trees}
    if not trees:
        return {}
    params = {"trees": _trees_json(trees), "now": now, "cutoff": cutoff}
    for code, sql in _check_statements(tuple(keys)):
        for row in tx.all(sql, params):
            reasons[str(row[0])].append(code)
    return {root: tuple(dict.fromkeys(codes)) for root, codes in reasons.items()}


@functools.lru_cache(maxsize=4)
def _check_statements(keys: tuple[ForeignKey, ...]) -> tuple[tuple[str, str], ...]:
    """:func:`_checks` as statements over ``json_each(:trees)``, built once per schema (a
    prune re-judges every tree with the same statements)."""
    return tuple(
        (
            code,
            "SELECT judged.key FROM json_each(:trees) judged"  # noqa: S608 - see _checks
            f" WHERE EXISTS ({_for_each_tree(check)})",
        )
        for code, check in _checks(keys)
    )


def _for_each_tree(sql: str) -> str:
    return _TREE_PARAMETERS.sub(lambda match: _FROM_ROW[match.group(1)], sql)


def _trees_json(trees: Iterable[Tree]) -> str:
    return _json(
        {tree.root_run_id: [list(tree.run_ids), list(tree.resource_ids)] for tree in trees}
    )


def _json(value: Any) -> str:
    return encode(value).decode()


# -- deleting -----------------------------------------------------------------------------------

Deleted = Applied[TreeDeletion] | Adopted[None] | TreeProtected


@dataclass(frozen=True)
class TreesDeletion:
    """What :func:`delete_trees` did: each root's result, in the order given, and how many
    blobs went with all of them."""

    results: tuple[tuple[str, Deleted], ...]
    blobs: int


def delete_tree(tx: Transaction, root_run_id: str, now: int, cutoff: int) -> Deleted:
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
    return _judge_and_delete(tx, root_run_id, now, cutoff, foreign_keys(tx), alone=True)


def delete_trees(tx: Transaction, roots: Sequence[str], now: int, cutoff: int) -> TreesDeletion:
    """:func:`delete_tree` for each of ``roots`` in order, except that the definitions,
    projects and blobs the deleted trees used are deleted once at the end, for all of them,
    where no row references them any more (each deletion's ``blobs`` is 0; the total is the
    result's). Each tree is still judged again right before its own savepoint, after the
    deletions before it. The schema's foreign keys are read once, and what the trees reference
    is read for 500 trees per statement before any of them is deleted (a tree that is then kept
    still references its part, so none of it goes). Expects a write transaction; never
    commits."""
    if not tx.writable:
        raise InvalidTransitionError("deleting a tree needs a write transaction")
    keys = foreign_keys(tx)
    leftovers = Leftovers()
    results: list[tuple[str, Deleted]] = []
    for chunk in _chunks(roots):
        leftovers.add(_leftovers_of(tx, list(load_trees(tx, chunk).values()), keys))
        for root in chunk:
            results.append((root, _judge_and_delete(tx, root, now, cutoff, keys, alone=False)))
    return TreesDeletion(tuple(results), _delete_leftovers(tx, keys, leftovers))


@dataclass
class Leftovers:
    """What trees referenced and did not own: the definitions, projects and blobs to delete
    once nothing references them."""

    definitions: set[bytes] = field(default_factory=set)
    projects: set[str] = field(default_factory=set)
    blobs: set[bytes] = field(default_factory=set)

    def add(self, other: Leftovers) -> None:
        """Take ``other``'s rows in too."""
        self.definitions |= other.definitions
        self.projects |= other.projects
        self.blobs |= other.blobs


def _judge_and_delete(
    tx: Transaction,
    root_run_id: str,
    now: int,
    cutoff: int,
    keys: Sequence[ForeignKey],
    *,
    alone: bool,
) -> Deleted:
    """Judge the tree again, then delete it in one savepoint; ``alone``: with its leftovers."""
    tree = load_tree(tx, root_run_id)
    if tree is None:
        return Adopted(None)
    reasons = _reasons(tx, tree, now, cutoff, keys)
    if reasons:
        return _protected(reasons)
    blobs = 0
    try:
        with tx.savepoint() as step:
            left = _leftovers_of(step, [tree], keys) if alone else None
            resources = int(step.execute(_DELETE_TREE_RESOURCES, tree.params()).rowcount)
            still = step.scalar(_COUNT_TREE_RUNS, tree.params())
            if still:  # pragma: no cover - runs cascade from their resource rows by the schema
                raise InvalidTransitionError(f"{still} run(s) of tree {root_run_id} survived")
            if left is not None:
                blobs = _delete_unused(step, keys, left)
    except sqlite3.IntegrityError:
        return _protected(("deleteRefused",))
    return Applied(TreeDeletion(tree.root_run_id, tree.run_ids, resources, blobs))


def _protected(reasons: tuple[str, ...]) -> TreeProtected:
    return TreeProtected("protected: " + ", ".join(reasons), reasons=reasons)


def _leftovers_of(tx: Transaction, trees: Sequence[Tree], keys: Sequence[ForeignKey]) -> Leftovers:
    """What ``trees`` (at most 500) reference without owning it: one statement per blob column
    of a table of :data:`TREE_ROWS`, one for the runs' definitions and projects."""
    left = Leftovers()
    if not trees:
        return left
    params = {"trees": _trees_json(trees)}
    for key in keys:
        if key.parent == "blobs" and key.table in TREE_ROWS and len(key.columns) == 1:
            table = _quote(key.table)
            column = f"{table}.{_quote(key.columns[0])}"
            sql = (
                f"SELECT DISTINCT {column} FROM json_each(:trees) judged, {table}"  # noqa: S608
                f" WHERE {_for_each_tree(TREE_ROWS[key.table])} AND {column} IS NOT NULL"
            )
            left.blobs.update(bytes(row[0]) for row in tx.all(sql, params))
    for row in tx.all(_TREES_SHARED, params):
        left.definitions.add(bytes(row[0]))
        if row[1] is not None:
            left.projects.add(str(row[1]))
    return left


def _delete_leftovers(tx: Transaction, keys: Sequence[ForeignKey], left: Leftovers) -> int:
    """:func:`_delete_unused` in its own savepoint: a constraint error keeps every one of them
    (unused rows cost only space; the deleted trees stay deleted)."""
    try:
        with tx.savepoint() as step:
            return _delete_unused(step, keys, left)
    except sqlite3.IntegrityError:
        return 0


def _delete_unused(tx: Transaction, keys: Sequence[ForeignKey], left: Leftovers) -> int:
    """Delete the definitions and projects among ``left`` that nothing references now, then the
    blobs among them and the deleted definitions'; return how many blobs went."""
    gone = delete_unreferenced(tx, keys, "workflow_definitions", sorted(left.definitions))
    delete_unreferenced(tx, keys, "projects", sorted(left.projects))
    blobs = left.blobs | {bytes(value) for value in gone}
    return len(delete_unreferenced(tx, keys, "blobs", sorted(blobs)))
