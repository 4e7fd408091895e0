"""Large state databases for figures 5 and 6, seeded in seconds from real template runs.

A database of 100,000 runs cannot be filled through the server in a benchmark's time, and rows
written by hand would drift from what the server writes. So the rows are the server's own::

    1. template: a real server in a scratch home runs one two-node run to completion and starts
       one run of a held workflow; once that run's runner is inside its second node, the server
       and the runner are SIGKILLed. The file now holds one terminal run and one run that a
       dead server left mid-flight (claimed, runner row live, visit open): a resumable run.
    2. clone: every row that belongs to a template run (a TEXT column names one of its ids: run
       id, attempt ids, runner epochs, receipt request ids and idempotency keys) is copied with
       fresh ids of the same shape (attempt ids are recomputed from the new run id exactly as
       the store derives them) and its ``*_at`` times shifted into the past (terminal clones by
       10 ms each, resumable ones by 1 ms so their claims stay live); a blob whose
       content names a template id is rewritten and re-hashed for its clone, every other blob is
       shared (blobs are content-addressed). Everything is inserted in one transaction with
       direct SQL on the schema's own tables, then ``PRAGMA foreign_key_check`` must be empty.

The figures run ``state.verify`` (integrity, foreign keys and piwf's domain invariants) on every
seeded database through the server before they measure anything.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from piwf.state import StateDatabase
from piwf.state.execution.attempts import attempt_id_for
from tests.bench.common import BenchError, poll
from tests.bench.piwf_side import (
    PiwfServer,
    held_workflow,
    markers_of,
    two_node_workflow,
)

#: Clones are spread this far apart in time (ms), older than their template.
CLONE_SPACING_MS = 10
_CHUNK = 20_000
_TRAILING_HEX = re.compile(r"^(.*?)([0-9a-f]{8,})$")


@dataclass(frozen=True)
class Template:
    """A template database and the directory of the workflows its runs point at."""

    database: Path
    workdir: Path
    gate: Path
    terminal_run: str
    resumable_run: str


def build_template(workdir: Path) -> Template:
    """Run the two template runs through a real server in ``workdir`` and return the file."""
    markers = workdir / "markers"
    markers.mkdir()
    gate = workdir / "gate"
    two = two_node_workflow(workdir)
    held = held_workflow(workdir, markers, gate, spin=False)
    home = workdir / "th"
    server = PiwfServer(home)
    try:
        server.start()
        with server.client() as client:
            done = client.start_run(two, input={"v": 1})
            final = client.wait_run(done.run_id, timeout_s=120)
            if final.run.status != "completed":
                raise BenchError(f"template run ended {final.run.status}")
            # A terminal run is settled once its runner's exit is recorded too.
            poll(lambda: not _live_runners(home, done.run_id), 60, "the template runner's exit")
            held_run = client.start_run(held, input={"v": 1})
            poll(lambda: held_run.run_id in markers_of(markers), 120, "the held template run")
        server.kill9()
    finally:
        server.cleanup()
    database = workdir / "template.sqlite"
    _copy_live_database(home / "state.sqlite", database)
    return Template(database, workdir, gate, done.run_id, held_run.run_id)


def _live_runners(home: Path, run_id: str) -> int:
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        return int(
            tx.scalar(
                "SELECT count(*) FROM run_runners WHERE run_id = ?"
                " AND status IN ('starting', 'ready', 'running')",
                (run_id,),
            )
        )


def _copy_live_database(source: Path, target: Path) -> None:
    """Copy a database left by a killed server (main file + WAL) and fold the WAL in."""
    shutil.copyfile(source, target)
    wal = source.with_name(source.name + "-wal")
    if wal.exists():
        shutil.copyfile(wal, target.with_name(target.name + "-wal"))
    with sqlite3.connect(target) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()


@dataclass
class _Table:
    name: str
    columns: list[str]
    text_columns: list[int]
    time_columns: list[int]
    blob_ref_columns: list[int]
    omitted: set[int] = field(default_factory=set)

    def insert_sql(self) -> str:
        kept = [c for i, c in enumerate(self.columns) if i not in self.omitted]
        return f"INSERT INTO {self.name} ({', '.join(kept)}) VALUES ({', '.join('?' * len(kept))})"


@dataclass
class _RunRows:
    """The rows of one template run, the ids they use and the blobs that name those ids."""

    run_id: str
    ids: dict[str, str]  # id -> kind: run | attempt | token
    rows: dict[str, list[tuple[Any, ...]]]
    attempts: dict[str, tuple[str, int, int]]
    named_blobs: dict[bytes, tuple[str, bytes]]  # hash -> (media type, content)


@dataclass(frozen=True)
class SeedReport:
    terminal_runs: int
    resumable_runs: int
    seconds: float
    database_bytes: int


def seed_database(template: Template, target: Path, *, terminal: int, resumable: int) -> SeedReport:
    """Write a database at ``target`` with ``terminal`` completed and ``resumable`` runs.

    ``target``'s directory becomes a state home (0700, database 0600). The template runs
    count: ``terminal - 1`` and ``resumable - 1`` clones are added.
    """
    if terminal < 1 or resumable < 0:
        raise ValueError("at least one terminal run")
    began = time.perf_counter()
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    target.parent.chmod(0o700)
    shutil.copyfile(template.database, target)
    target.chmod(0o600)
    connection = sqlite3.connect(target, isolation_level=None)
    try:
        tables = _tables(connection)
        runs = {
            run_id: _run_rows(connection, tables, run_id)
            for run_id in (template.terminal_run, template.resumable_run)
        }
        if resumable == 0:
            _delete_run(connection, template.resumable_run)
        connection.execute("PRAGMA foreign_keys = OFF")
        connection.execute("BEGIN IMMEDIATE")
        _insert_clones(
            connection, tables, runs[template.terminal_run], terminal - 1, CLONE_SPACING_MS
        )
        # Resumable clones stay within a millisecond each of their template, so their claims
        # look like those of a server that has just died (live until the lease runs out).
        _insert_clones(connection, tables, runs[template.resumable_run], max(resumable - 1, 0), 1)
        connection.execute("COMMIT")
        problems = connection.execute("PRAGMA foreign_key_check").fetchall()
        if problems:
            raise BenchError(f"seeded database has dangling references: {problems[:5]}")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    return SeedReport(terminal, resumable, time.perf_counter() - began, target.stat().st_size)


def _tables(connection: sqlite3.Connection) -> dict[str, _Table]:
    tables: dict[str, _Table] = {}
    names = [
        row[0]
        for row in connection.execute(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        )
    ]
    for name in names:
        sql = connection.execute(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()[0]
        info = connection.execute(f"PRAGMA table_info({name})").fetchall()
        columns = [row[1] for row in info]
        blob_refs = {
            row[3]
            for row in connection.execute(f"PRAGMA foreign_key_list({name})").fetchall()
            if row[2] == "blobs"
        }
        table = _Table(
            name,
            columns,
            text_columns=[i for i, row in enumerate(info) if row[2].upper() == "TEXT"],
            time_columns=[
                i
                for i, row in enumerate(info)
                if row[2].upper() == "INTEGER" and row[1].endswith("_at")
            ],
            blob_ref_columns=[i for i, c in enumerate(columns) if c in blob_refs],
        )
        if "AUTOINCREMENT" in sql.upper():
            table.omitted = {i for i, row in enumerate(info) if row[5]}
        tables[name] = table
    return tables


def _run_rows(connection: sqlite3.Connection, tables: dict[str, _Table], run_id: str) -> _RunRows:
    ids: dict[str, str] = {run_id: "run"}
    attempts: dict[str, tuple[str, int, int]] = {}
    for attempt_id, path, visit, number in connection.execute(
        "SELECT attempt_id, node_path, visit, attempt_number FROM node_attempts WHERE run_id = ?",
        (run_id,),
    ):
        ids[attempt_id] = "attempt"
        attempts[attempt_id] = (path, visit, number)
    for (epoch,) in connection.execute(
        "SELECT runner_epoch FROM run_runners WHERE run_id = ?", (run_id,)
    ):
        ids[epoch] = "token"
    for request_id, key in connection.execute(
        "SELECT request_id, idempotency_key FROM server_commands WHERE run_id = ?", (run_id,)
    ):
        ids[request_id] = "token"
        ids[key] = "token"
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for table in tables.values():
        if table.name == "blobs" or not table.text_columns:
            continue
        found = []
        for row in connection.execute(f"SELECT * FROM {table.name}"):
            if any(
                isinstance(row[i], str) and any(known in row[i] for known in ids)
                for i in table.text_columns
            ):
                found.append(tuple(row))
        if found:
            rows[table.name] = found
    named: dict[bytes, tuple[str, bytes]] = {}
    for name, found in rows.items():
        table = tables[name]
        for row in found:
            for i in table.blob_ref_columns:
                digest = row[i]
                if digest is None or digest in named:
                    continue
                media, content = connection.execute(
                    "SELECT media_type, content FROM blobs WHERE blob_hash = ?", (digest,)
                ).fetchone()
                text = bytes(content).decode("utf-8", errors="ignore")
                if any(known in text for known in ids):
                    named[bytes(digest)] = (media, bytes(content))
    return _RunRows(run_id, ids, rows, attempts, named)


def _fresh_ids(run: _RunRows) -> list[tuple[str, str]]:
    """Replacement pairs (old, new) for one clone, longest first."""
    new_run = f"run-{secrets.token_hex(10)}"
    pairs: list[tuple[str, str]] = []
    for old, kind in run.ids.items():
        if kind == "run":
            pairs.append((old, new_run))
        elif kind == "attempt":
            path, visit, number = run.attempts[old]
            pairs.append((old, attempt_id_for(new_run, path, visit, number)))
        else:
            match = _TRAILING_HEX.match(old)
            if match is None:
                raise BenchError(f"cannot derive a fresh id from {old!r}")
            prefix, digits = match.groups()
            pairs.append((old, prefix + secrets.token_hex(len(digits) // 2 + 1)[: len(digits)]))
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def _replace(value: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        if old in value:
            value = value.replace(old, new)
    return value


def _insert_clones(
    connection: sqlite3.Connection,
    tables: dict[str, _Table],
    run: _RunRows,
    count: int,
    spacing_ms: int,
) -> None:
    pending: dict[str, list[tuple[Any, ...]]] = {name: [] for name in run.rows}
    pending_blobs: list[tuple[Any, ...]] = []

    def flush() -> None:
        for name, batch in pending.items():
            if batch:
                connection.executemany(tables[name].insert_sql(), batch)
                batch.clear()
        if pending_blobs:
            connection.executemany(
                "INSERT OR IGNORE INTO blobs (blob_hash, media_type, byte_length, content,"
                " created_at) VALUES (?, ?, ?, ?, ?)",
                pending_blobs,
            )
            pending_blobs.clear()

    for index in range(count):
        pairs = _fresh_ids(run)
        shift = (index + 1) * spacing_ms
        blob_map: dict[bytes, bytes] = {}
        for digest, (media, content) in run.named_blobs.items():
            rewritten = _replace(content.decode("utf-8"), pairs).encode("utf-8")
            new_digest = hashlib.sha256(rewritten).digest()
            blob_map[digest] = new_digest
            pending_blobs.append((new_digest, media, len(rewritten), rewritten, 0))
        for name, rows in run.rows.items():
            table = tables[name]
            for row in rows:
                values = list(row)
                for i in table.text_columns:
                    if isinstance(values[i], str):
                        values[i] = _replace(values[i], pairs)
                for i in table.time_columns:
                    if values[i] is not None:
                        values[i] -= shift
                for i in table.blob_ref_columns:
                    if values[i] is not None:
                        values[i] = blob_map.get(bytes(values[i]), values[i])
                pending[name].append(
                    tuple(v for i, v in enumerate(values) if i not in table.omitted)
                )
        if (index + 1) % _CHUNK == 0:
            flush()
    flush()


def _delete_run(connection: sqlite3.Connection, run_id: str) -> None:
    """Remove a template run: its receipts, then its aggregate (the rest cascades)."""
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute("BEGIN IMMEDIATE")
    connection.execute("DELETE FROM server_commands WHERE run_id = ?", (run_id,))
    connection.execute(
        "DELETE FROM resources WHERE resource_id IN"
        " (SELECT resource_id FROM runs WHERE run_id = ?)",
        (run_id,),
    )
    connection.execute("COMMIT")
