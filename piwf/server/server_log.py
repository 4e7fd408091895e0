"""The server log: one private, size-bounded file whose repeated warnings are rate-limited.

``$PIWF_HOME/server/server.log`` is written through :class:`PrivateRotatingFileHandler`::

    server.log    the current file, at most MAX_LOG_BYTES (then renamed to server.log.1)
    server.log.1  the one backup; the previous backup is dropped at the next rotation

Both files are ``0600`` and never opened through a symlink. A record's text is cut to
:data:`MAX_RECORD_CHARS`, so no single record can fill the file either.

:class:`RateLimitFilter` is the one place that limits repetition. A flood (a client reconnecting
in a loop, accepts failing while descriptors are exhausted, a child spamming its pipe) must not
grow the log faster than a trickle, yet the first lines of every distinct problem must stay
visible::

    key = record.rate_key (given with extra={"rate_key": ...}) or (logger, level, template)
    per key and window of RATE_WINDOW_S seconds: the first RATE_BURST records pass, the rest
    are counted; the first record of the key in a later window ends "(N similar suppressed)"

Warnings and errors are always subject to it; records of lower levels only when they carry a
``rate_key`` (the hot informational lines of the client listener do).
"""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from piwf.config import FILE_MODE

#: Size of the current log file before it is rotated; one backup is kept.
MAX_LOG_BYTES: Final = 10 * 1024 * 1024
LOG_BACKUPS: Final = 1
#: Longest text of one record (message plus any traceback), in characters.
MAX_RECORD_CHARS: Final = 8 * 1024
RATE_WINDOW_S: Final = 10.0
RATE_BURST: Final = 5
#: At most this many keys are remembered; expired windows are dropped first.
MAX_RATE_KEYS: Final = 1024

_FORMAT: Final = "%(asctime)s %(levelname)s %(message)s"


@dataclass
class _Window:
    started: float
    passed: int
    suppressed: int


class RateLimitFilter(logging.Filter):
    """Let at most ``burst`` records per key through in each ``window_s``; count the rest.

    ``clock`` returns monotonic seconds. The filter keeps at most ``max_keys`` windows, so it
    is bounded however many keys appear. It never raises: a record it cannot key passes.
    """

    def __init__(
        self,
        window_s: float = RATE_WINDOW_S,
        burst: int = RATE_BURST,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_RATE_KEYS,
    ) -> None:
        super().__init__()
        if window_s <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("window_s must be positive, burst and max_keys at least 1")
        self.window_s = window_s
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = self._key(record)
        if key is None:
            return True
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window.started >= self.window_s:
            suppressed = window.suppressed if window is not None else 0
            self._remember(key, _Window(started=now, passed=1, suppressed=0), now)
            if suppressed:
                # Plain text without "%": the record's own arguments still format the message.
                record.msg = f"{record.msg} ({suppressed} similar suppressed)"
            return True
        if window.passed < self.burst:
            window.passed += 1
            return True
        window.suppressed += 1
        return False

    def suppressed(self, key: Hashable) -> int:
        """How many records of ``key`` the current window has held back so far."""
        window = self._windows.get(key)
        return window.suppressed if window is not None else 0

    @staticmethod
    def _key(record: logging.LogRecord) -> Hashable | None:
        explicit = getattr(record, "rate_key", None)
        if explicit is not None:
            return ("key", str(explicit))
        if record.levelno < logging.WARNING:
            return None
        return (record.name, record.levelno, str(record.msg))

    def _remember(self, key: Hashable, window: _Window, now: float) -> None:
        self._windows.pop(key, None)
        if len(self._windows) >= self.max_keys:
            expired = [k for k, w in self._windows.items() if now - w.started >= self.window_s]
            for stale in expired:
                del self._windows[stale]
            while len(self._windows) >= self.max_keys:
                del self._windows[next(iter(self._windows))]  # the oldest insertion
        self._windows[key] = window


class BoundedFormatter(logging.Formatter):
    """The server's line format, with each record's text cut to ``max_chars`` characters."""

    def __init__(self, max_chars: int = MAX_RECORD_CHARS) -> None:
        super().__init__(_FORMAT)
        self.max_chars = max_chars

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if len(text) <= self.max_chars:
            return text
        return text[: self.max_chars] + f" [cut: {len(text) - self.max_chars} more characters]"


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating file handler whose files are ``0600`` and never opened through a symlink."""

    def __init__(
        self, path: Path, *, max_bytes: int = MAX_LOG_BYTES, backups: int = LOG_BACKUPS
    ) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        """Drop a line that cannot be written (a full disk) instead of printing a traceback to
        stderr: losing one log line must not cost more than the line."""
        return

    def _open(self) -> io.TextIOWrapper:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        descriptor = os.open(self.baseFilename, flags, FILE_MODE)
        try:
            os.fchmod(descriptor, FILE_MODE)  # a file left by an older run may be wider
            return os.fdopen(descriptor, "a", encoding=self.encoding, buffering=1)
        except BaseException:
            os.close(descriptor)
            raise


def server_log_handler(
    path: Path, *, max_bytes: int = MAX_LOG_BYTES, rate_limit: RateLimitFilter | None = None
) -> logging.Handler:
    """Return the handler of the server log at ``path``: private, rotating, rate-limited.

    Raises :class:`OSError` when the file cannot be opened (for example a symlink at ``path``).
    """
    handler = PrivateRotatingFileHandler(path, max_bytes=max_bytes)
    handler.setFormatter(BoundedFormatter())
    handler.addFilter(rate_limit or RateLimitFilter())
    return handler
