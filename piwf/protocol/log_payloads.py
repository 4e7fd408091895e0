"""Payload and receipt of ``run.logs``: a run's attempt logs, in pages, shared by server and
client; split from :mod:`piwf.protocol.payloads` so each stays one readable module::

    run.logs   {node?, cursor?: {log, offset}, maxBytes?}  (runId in the envelope)
           ->  {runId, runStatus, terminal, attempts: [AttemptLogInfo], cursor?, more}

Attempts come in the order they started (``log`` numbers 1, 2, ...), each with the bytes of
its log file from ``offset`` (the cursor's offset for the cursor's attempt, 0 for the later
ones), base64 in ``data``. One answer carries at most ``maxBytes`` (≤ 256 KiB) of log bytes
and :data:`MAX_LOG_ATTEMPTS` attempts, so it always fits in a frame. ``cursor`` is where the
next read starts; ``more`` says whether more is readable now. A run that is not terminal may
grow: asking again from ``cursor`` later returns what was written since (docs/PROTOCOL.md,
"run.logs").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from piwf.canonical import MAX_SAFE_INTEGER
from piwf.protocol.payloads import WireModel

#: Log bytes one ``run.logs`` answer carries at most (base64 makes them 4/3 as long).
MAX_LOG_CHUNK_BYTES = 256 * 1024
#: Attempts one ``run.logs`` answer lists at most.
MAX_LOG_ATTEMPTS = 100

LogStream = Literal["stdout", "stderr"]


class LogCursor(WireModel):
    """A position in a run's logs: attempt log number ``log``, byte ``offset`` in its file."""

    log: int = Field(ge=1, le=MAX_SAFE_INTEGER)
    offset: int = Field(ge=0, le=MAX_SAFE_INTEGER)


class RunLogsPayload(WireModel):
    """Read a run's attempt logs from ``cursor`` (absent: from the start); ``node`` keeps only
    the attempts of that node path."""

    node: str | None = Field(default=None, min_length=1, max_length=1024)
    cursor: LogCursor | None = None
    max_bytes: int = Field(default=MAX_LOG_CHUNK_BYTES, ge=1, le=MAX_LOG_CHUNK_BYTES)


class AttemptLogInfo(WireModel):
    """One node attempt's log: identity, status, what each stream wrote, what the file kept
    and dropped (final once the attempt ended; 0 while it runs), the file's ``size`` now and
    ``data``: base64 of its bytes from ``offset``. ``missing``: the attempt kept bytes but its
    file is gone (removed by hand, or the state was restored from a backup, which holds the
    database and not the ``logs/`` directory); ``size`` is then 0."""

    log: int
    attempt_id: str
    node_path: str
    visit: int
    attempt: int
    status: str
    streams: list[LogStream]
    stdout_bytes: int
    stderr_bytes: int
    kept_bytes: int
    dropped_bytes: int
    size: int
    offset: int
    data: str
    missing: bool = False


class RunLogsReceipt(WireModel):
    """One page of a run's attempt logs (see the module docstring). ``needs_action``: the run
    is paused or parked until someone acts (``run.needsAction``), so nothing more is written
    until it is resumed (an older server leaves it out: false)."""

    run_id: str
    run_status: str
    terminal: bool
    attempts: list[AttemptLogInfo]
    cursor: LogCursor | None = None
    more: bool = False
    needs_action: bool = False
