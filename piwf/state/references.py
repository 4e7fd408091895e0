"""The live schema's foreign keys, and deleting the rows of a table that nothing references.

Retention (:mod:`piwf.state.retention`) finds what may reach a run tree, and which shared rows
(definitions, projects, blobs) a deletion left unused, from these keys at run time, so a table
added later is covered without a list kept by hand. Identifiers in the statements built here
come from the live schema and are quoted; values are always bound.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from piwf.errors import InvalidTransitionError
from piwf.state.database import Transaction

#: How many values one ``IN (?, ...)`` list binds at most.
CHUNK = 500

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


def foreign_keys(tx: Transaction) -> tuple[ForeignKey, ...]:
    """Every foreign key of the live schema (composite keys as one entry), in a fixed order."""
    grouped: dict[tuple[str, int], list[sqlite3.Row]] = {}
    for row in tx.all(_FOREIGN_KEYS):
        grouped.setdefault((str(row[0]), int(row[1])), []).append(row)
    keys = []
    for (table, _id), rows in grouped.items():
        parent = str(rows[0][3])
        targets = tuple(row[5] for row in rows)
        if any(target is None for target in targets):
            targets = (primary_key(tx, parent),)
        keys.append(
            ForeignKey(
                table=table,
                columns=tuple(str(row[4]) for row in rows),
                parent=parent,
                parent_columns=tuple(str(target) for target in targets),
                on_delete=str(rows[0][6]),
            )
        )
    return tuple(keys)


def delete_unreferenced(
    tx: Transaction, keys: Sequence[ForeignKey], table: str, values: Iterable[Any]
) -> list[Any]:
    """Delete the rows of ``table`` (single-column primary key) among ``values`` that no
    foreign key of the schema references any more; return the deleted keys.

    Each key that references ``table`` is read once per :data:`CHUNK` values, however many
    trees the values came from. Nothing is deleted when a composite key references ``table``
    (it cannot be checked value by value)."""
    values = list(dict.fromkeys(_hashable(value) for value in values))
    if not values:
        return []
    if any(key.parent == table and len(key.columns) != 1 for key in keys):
        return []
    column = primary_key(tx, table)
    referenced: set[Any] = set()
    for key in keys:
        if key.parent != table:
            continue
        source = quote(key.columns[0])
        for chunk in chunks(values):
            marks = ", ".join(["?"] * len(chunk))
            rows = tx.all(
                f"SELECT DISTINCT {source} FROM {quote(key.table)}"  # noqa: S608 - quoted names
                f" WHERE {source} IN ({marks})",
                chunk,
            )
            referenced.update(_hashable(row[0]) for row in rows)
    unused = [value for value in values if value not in referenced]
    for chunk in chunks(unused):
        marks = ", ".join(["?"] * len(chunk))
        tx.execute(
            f"DELETE FROM {quote(table)} WHERE {quote(column)} IN ({marks})",  # noqa: S608
            chunk,
        )
    return unused


def primary_key(tx: Transaction, table: str) -> str:
    """The one primary-key column of ``table``; raises when it has none or several."""
    rows = tx.all("SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", (table,))
    if len(rows) != 1:
        raise InvalidTransitionError(f"{table} has no single-column primary key")
    return str(rows[0][0])


def chunks(values: Sequence[Any]) -> Iterator[list[Any]]:
    """``values`` in lists of at most :data:`CHUNK`."""
    for start in range(0, len(values), CHUNK):
        yield list(values[start : start + CHUNK])


def quote(identifier: str) -> str:
    """An SQL identifier, quoted."""
    return '"' + identifier.replace('"', '""') + '"'


def columns(names: Iterable[str]) -> str:
    """Quoted column names, comma-separated."""
    return ", ".join(quote(name) for name in names)


def _hashable(value: Any) -> Any:
    return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else value
