"""The ``run.logs`` read: a run's attempt logs, in bounded pages with an offset cursor.

::

    request  runId, {node?, cursor?: {log, offset}, maxBytes?}
    check    the run exists                                      ── else notFound runNotFound
             node (when given) is a node path of its workflow    ── else notFound nodeNotFound
             cursor (when given) names one of its attempt logs
             (of that node) and an offset within its file        ── else rejected logCursor
    answer   the attempts from the cursor on (≤ 100), in the order they started, each with its
             log bytes from the offset, ≤ maxBytes in all; the cursor after the last byte sent;
             more: whether more is readable now

The rows come from one read transaction; the bytes from the files under ``$PIWF_HOME/logs/``
(opened without following links, read with one bounded ``pread`` each), so the server loop
stays responsive while a client pages through a large log. An attempt that kept bytes but has
no file (removed by hand, or a restored backup: backups hold the database, not ``logs/``) is
listed with ``missing`` set and no bytes. A read changes nothing and stores
no receipt; log bytes never reach the server log.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

from piwf.canonical import JsonValue
from piwf.errors import LogCursorError, NodeNotInRunError
from piwf.protocol.client_v1 import Request
from piwf.protocol.log_payloads import (
    MAX_LOG_ATTEMPTS,
    AttemptLogInfo,
    LogCursor,
    RunLogsPayload,
    RunLogsReceipt,
)
from piwf.server.context import ServerContext
from piwf.server.loop import Reply
from piwf.server.replies import error_response, ok, payload_of, run_id_of, unknown_run
from piwf.state import blobs
from piwf.state.enums import AttemptStatus
from piwf.state.execution import attempt_logs
from piwf.state.execution import runs as run_store
from piwf.workflow.compiler import join_path

#: Node names a ``nodeNotFound`` message lists at most.
_LISTED_NODES = 20


class RunLogReads:
    """Serves ``run.logs`` from the attempt-log rows and their files."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context

    def run_logs(self, request: Request, reply: Reply) -> None:
        """Answer one page of the run's attempt logs (see the module docstring)."""
        payload = payload_of(request, RunLogsPayload)
        run_id = run_id_of(request)
        with self.context.db.read() as tx:
            run = run_store.load_run(tx, run_id)
            if run is None:
                message = unknown_run(run_id, self.context.home)
                reply(error_response(request, "notFound", "runNotFound", message))
                return
            if payload.node is not None:
                snapshot = blobs.read_json(tx, run.definition_digest)
                tree = snapshot.get("workflow") if isinstance(snapshot, dict) else None
                nodes = node_paths(tree)
                if payload.node not in nodes:
                    missing = _unknown_node(run_id, payload.node, nodes)
                    reply(error_response(request, "notFound", missing.code, str(missing)))
                    return
            cursor = payload.cursor or LogCursor(log=1, offset=0)
            if payload.cursor is not None and not attempt_logs.has_log(
                tx, run_id, cursor.log, path=payload.node
            ):
                bad = LogCursorError(
                    f"run {run_id} has no attempt log {cursor.log}"
                    f"{'' if payload.node is None else ' of that node'}; read without a cursor"
                )
                reply(error_response(request, "rejected", bad.code, str(bad)))
                return
            # One more than a page says whether another page exists.
            rows = attempt_logs.list_logs(
                tx, run_id, path=payload.node, first=cursor.log, limit=MAX_LOG_ATTEMPTS + 1
            )
            terminal, needs_action = run.terminal, run.needs_action
            status = run.status.value
            # An attempt still `running` while no runner executes its run lost its runner (a
            # crash, a park): it never goes on, the next runner reopens its visit as the next
            # attempt. Shown as what it is, `interrupted`.
            if not run.executing:
                rows = [_interrupted_if_running(row) for row in rows]
        try:
            receipt = self._page(run_id, status, terminal, rows, cursor, payload.max_bytes)
            receipt = receipt.model_copy(update={"needs_action": needs_action})
        except LogCursorError as error:
            reply(error_response(request, "rejected", error.code, str(error)))
            return
        reply(ok(request, receipt))

    def _page(
        self,
        run_id: str,
        status: str,
        terminal: bool,
        rows: list[attempt_logs.AttemptLogRow],
        cursor: LogCursor,
        budget: int,
    ) -> RunLogsReceipt:
        home = self.context.home
        listed: list[AttemptLogInfo] = []
        more = len(rows) > MAX_LOG_ATTEMPTS
        next_cursor: LogCursor | None = None
        for row in rows[:MAX_LOG_ATTEMPTS]:
            start = cursor.offset if row.log_number == cursor.log else 0
            with _opened(home / row.log_file) as descriptor:
                size = 0 if descriptor is None else os.fstat(descriptor).st_size
                if start > size:
                    raise LogCursorError(
                        f"offset {start} lies past the end of attempt log {row.log_number} "
                        f"({size} bytes); read without a cursor"
                    )
                length = min(size - start, budget)
                data = b""
                if descriptor is not None and length > 0:
                    data = os.pread(descriptor, length, start)
            budget -= len(data)
            listed.append(_info(row, size, start, data, missing=descriptor is None))
            next_cursor = LogCursor(log=row.log_number, offset=start + len(data))
            if start + len(data) < size:
                more = True
                break
            if budget <= 0:
                more = more or row is not rows[-1]
                break
        return RunLogsReceipt(
            run_id=run_id,
            run_status=status,
            terminal=terminal,
            attempts=listed,
            cursor=next_cursor,
            more=more,
        )


def node_paths(snapshot: JsonValue, prefix: str | None = None) -> list[str]:
    """Every full node path of a definition snapshot's workflow tree (its ``workflow``; mounted
    workflows' nodes included), in declaration order."""
    if not isinstance(snapshot, dict):
        return []
    paths: list[str] = []
    nodes = snapshot.get("nodes")
    if isinstance(nodes, dict):
        paths += [join_path(prefix, name) for name in nodes]
    includes = snapshot.get("includes")
    if isinstance(includes, dict):
        for name, mount in includes.items():
            if isinstance(mount, dict):
                paths += node_paths(mount.get("workflow"), join_path(prefix, name))
    return paths


def _interrupted_if_running(row: attempt_logs.AttemptLogRow) -> attempt_logs.AttemptLogRow:
    if row.status is not AttemptStatus.RUNNING:
        return row
    return dataclasses.replace(row, status=AttemptStatus.INTERRUPTED)


def _unknown_node(run_id: str, node: str, nodes: list[str]) -> NodeNotInRunError:
    # The node text came in the request: the message names the run's own nodes, not it.
    listed = ", ".join(nodes[:_LISTED_NODES]) + (", ..." if len(nodes) > _LISTED_NODES else "")
    return NodeNotInRunError(
        f"run {run_id} has no node of that name; its nodes: {listed or 'none'}"
    )


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[int | None]:
    """The log file opened read-only without following a link; None when it is missing (an
    attempt whose file could not be created, or removed by hand)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        yield None
        return
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def _info(
    row: attempt_logs.AttemptLogRow, size: int, offset: int, data: bytes, *, missing: bool
) -> AttemptLogInfo:
    """The wire description of one attempt's log; ``missing`` (no file) is reported only when
    the attempt kept bytes, so a file not created yet is not taken for a lost one."""
    counts = row.counts
    return AttemptLogInfo(
        log=row.log_number,
        attempt_id=row.attempt_id,
        node_path=row.path,
        visit=row.visit,
        attempt=row.attempt,
        status=row.status.value,
        streams=list(counts.streams),  # type: ignore[arg-type]
        stdout_bytes=counts.stdout,
        stderr_bytes=counts.stderr,
        kept_bytes=counts.kept,
        dropped_bytes=counts.dropped,
        size=size,
        offset=offset,
        data=base64.b64encode(data).decode("ascii"),
        missing=missing and counts.kept > 0,
    )
