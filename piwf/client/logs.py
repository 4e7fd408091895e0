"""The log methods of :class:`piwf.client.Client`: a run's node attempt logs (``run.logs``).

Kept in their own module; ``Client`` inherits them. The server answers in pages of at most
256 KiB of log bytes (docs/PROTOCOL.md, "run.logs"); these methods page for the caller::

    run_logs_page(run, cursor=c)   one page, as the server sent it (bytes still base64)
    read_run_logs(run)             every attempt's complete log as it is now, in order
    follow_run_logs(run)           (attempt, new bytes) as they are written, and each status
                                   change of an attempt, until the run is terminal or needs
                                   an operator (paused, parked) and everything was read;
                                   polls every interval_s
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

from pydantic import BaseModel

from piwf.client.arguments import build_payload, timeout_argument
from piwf.client.calls import ClientCalls

if TYPE_CHECKING:
    from piwf.protocol.log_payloads import AttemptLogInfo, LogCursor, RunLogsReceipt

#: What readers show for an attempt whose log file is gone although it kept bytes.
MISSING_LOG_NOTE: Final = (
    "its log file is missing (backups hold the database, not the logs directory)"
)
#: How long :meth:`RunLogMethods.follow_run_logs` waits between reads that found nothing new.
FOLLOW_INTERVAL_S: Final = 0.5
#: Pages one :meth:`RunLogMethods.read_run_logs` reads at most (64 GiB of logs at 256 KiB):
#: a bound on the loop, never reached by a run's real logs.
_MAX_PAGES: Final = 262_144

_Receipt = TypeVar("_Receipt", bound=BaseModel)


@dataclass(frozen=True)
class AttemptLog:
    """One node attempt's log: its description (the last one read) and the bytes read."""

    info: AttemptLogInfo
    data: bytes

    @property
    def text(self) -> str:
        """The log as text (invalid UTF-8 replaced, as a terminal would show it)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class RunLogs:
    """A run's attempt logs as they were read: its status then, and each attempt in order."""

    run_id: str
    run_status: str
    terminal: bool
    attempts: list[AttemptLog]


class RunLogMethods(ClientCalls):
    """``Client`` methods that read a run's attempt logs."""

    def run_logs_page(
        self, run_id: str, *, node: str | None = None, cursor: LogCursor | None = None
    ) -> RunLogsReceipt:
        """Return one page of the run's attempt logs from ``cursor`` (None: the start);
        ``node`` keeps that node's attempts only.

        Raises :class:`~piwf.errors.NotFoundError` for an unknown run (code ``runNotFound``) or
        a node its workflow does not have (``nodeNotFound``, the message names its nodes), and
        :class:`~piwf.errors.RejectedError` (``logCursor``) for a cursor past its logs.
        """
        from piwf.protocol.log_payloads import RunLogsPayload, RunLogsReceipt

        payload = build_payload(RunLogsPayload, node=node, cursor=cursor)
        return self._call("run.logs", payload, RunLogsReceipt, run_id=run_id)

    def read_run_logs(self, run_id: str, *, node: str | None = None) -> RunLogs:
        """Return every attempt's complete log as it is now, in the order the attempts
        started (``node``: that node's attempts only), with the run's status at the first
        page; errors as :meth:`run_logs_page`."""
        logs: dict[int, AttemptLog] = {}
        cursor: LogCursor | None = None
        first: RunLogsReceipt | None = None
        for _ in range(_MAX_PAGES):
            page = self.run_logs_page(run_id, node=node, cursor=cursor)
            first = first or page
            for info, data in _chunks(page):
                earlier = logs.get(info.log)
                logs[info.log] = AttemptLog(info, (earlier.data if earlier else b"") + data)
            cursor = page.cursor or cursor
            if not page.more:
                break
        assert first is not None, "at least one page was read"
        attempts = [logs[number] for number in sorted(logs)]
        return RunLogs(first.run_id, first.run_status, first.terminal, attempts)

    def follow_run_logs(
        self, run_id: str, *, node: str | None = None, interval_s: float = FOLLOW_INTERVAL_S
    ) -> Iterator[tuple[AttemptLogInfo, bytes]]:
        """Yield ``(attempt, bytes)`` as the run's attempts write them, from the start, and
        return once everything was read and the run is terminal or needs an operator (paused,
        or parked until someone acts: ``needsAction``; nothing more is written until it is
        resumed, so following on would wait for a person, not for the run).

        Reads again at once while the server says more is there, else after ``interval_s``
        (no busy loop). An attempt is yielded with ``b""`` when it is first seen with nothing
        written yet, so a caller can show it started, and again whenever its status changed
        (it ended, however: completed, failed, interrupted when its runner was killed, ...),
        so a caller can show how it ended. Errors as :meth:`run_logs_page`.
        """
        interval_s = timeout_argument("interval_s", interval_s, zero_allowed=True)
        cursor: LogCursor | None = None
        statuses: dict[int, str] = {}
        while True:
            page = self.run_logs_page(run_id, node=node, cursor=cursor)
            for info, data in _chunks(page):
                if data or statuses.get(info.log) != info.status:
                    statuses[info.log] = info.status
                    yield info, data
            cursor = page.cursor or cursor
            if page.more:
                continue
            if page.terminal or page.needs_action:
                return
            time.sleep(max(interval_s, 0.05))


def _chunks(page: RunLogsReceipt) -> Iterator[tuple[AttemptLogInfo, bytes]]:
    for info in page.attempts:
        yield info, base64.b64decode(info.data, validate=True)
