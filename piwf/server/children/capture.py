"""Bounded capture of what children (and the standard library's helper processes) print.

One :class:`OutputCapture` owns a ``0600`` log file, made by the first byte it captures (a
child that prints nothing leaves no file), and reads any number of pipe read ends from the
server's selector without blocking. Printing is never a reason to kill a child (an agent
command may well be chatty): every byte is read, so a writer never stalls on a full pipe, and
what does not fit is counted and dropped, so it cannot fill the disk either. The log file
keeps the first ``cap`` bytes, then one marker line (:func:`drop_marker`); the rest is counted
(``dropped``). A full disk costs the bytes that did not fit, nothing more.

**Pacing.** A stream whose read was dropped whole (its target is full) is not read again for
``DROP_PAUSE_S``: a writer that never stops is slowed by its full pipe to about one read per
pause, instead of keeping the server's loop busy copying bytes it drops. A drain still reads it.

**Targets.** What is read goes to the capture's own log file unless a :class:`LogTarget` is
set (:meth:`OutputCapture.switch`): a node attempt's own ``0600`` file, bounded on its own
(``ATTEMPT_LOG_CAP``: its first bytes as they come, then one marker line, then, once the attempt
ends, one line counting what was dropped and its last ``ATTEMPT_LOG_TAIL`` bytes, where a
failing node's last words are), counting the bytes of each stream. The file (and its
directories) is made when the attempt's first byte arrives: an attempt that prints nothing
costs no file. A file that cannot be made then
(:class:`AttemptLogUnavailableError`) sends that output, and the rest, to the capture's own log.
Whoever switches first calls :meth:`OutputCapture.drain`, which reads what the pipes hold
now, so output written before a switch goes to the target it was written for (the runner
flushes before it reports a node's start or end)::

    read ─▶ target set? ─yes─▶ the attempt's file (its cap; the rest counted and dropped)
                       └─no──▶ the capture's own log file (its cap; the rest counted and dropped)
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
from collections.abc import Callable
from pathlib import Path

from piwf.config import FILE_MODE
from piwf.server.failures import log_failure
from piwf.server.loop import EventLoop, Timer
from piwf.state.execution.attempt_logs import LogCounts
from piwf.state.failures import state_error_of_os

log = logging.getLogger("piwf.server")

READ_BYTES = 65536
#: Bytes of one attempt's output its log file keeps; the rest is counted and dropped.
ATTEMPT_LOG_CAP = 256 * 1024
#: Of those, the last bytes of its output (kept in memory until the attempt ends); the first
#: ``ATTEMPT_LOG_CAP - ATTEMPT_LOG_TAIL`` are written as they come.
ATTEMPT_LOG_TAIL = 64 * 1024
#: How far into the held tail a line may start for the tail to start with it.
TAIL_LINE_SEARCH = 1024
#: How long a stream whose last read was dropped whole waits before it is read again (at most
#: ``READ_BYTES`` per pause: about 6 MB/s of dropped output per stream).
DROP_PAUSE_S = 0.01
#: Reads of one stream a drain makes at most (a writer that never pauses cannot hold the loop).
_DRAIN_READS = 32


def drop_marker(cap: int, whose: str = "this attempt's") -> bytes:
    """The one line a log gets where ``whose`` output passed ``cap`` bytes."""
    return f"\n[piwf: {whose} output passed {cap} bytes; the rest was dropped]\n".encode()


def head_marker(head: int, tail: int) -> bytes:
    """The line an attempt's log gets where its output passed its first ``head`` bytes."""
    return (
        f"\n[piwf: this attempt's output passed {head} bytes; past them only its last {tail}"
        " bytes are kept, written when it ends]\n"
    ).encode()


def tail_marker(dropped: int, tail: int) -> bytes:
    """The line before the last ``tail`` bytes of an attempt's output (from the start of a
    line where one starts in their first ``TAIL_LINE_SEARCH``), ``dropped`` bytes having been
    dropped before them."""
    return f"[piwf: {dropped} bytes dropped; the last {tail} bytes follow]\n".encode()


class AttemptLogUnavailableError(Exception):
    """An attempt's log file could not be made; ``cause`` names why (its class, no bytes)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(type(cause).__name__)
        self.cause = cause


class LogTarget:
    """One node attempt's own log file: bytes per stream, its first ``cap - tail`` bytes
    written as they come, its last ``tail`` bytes held until :meth:`flush_tail`, the rest
    dropped.

    The file is made on the first :meth:`write` (after ``prepare``, which makes its
    directories), ``0600``, appended to when it exists (the same attempt again, whose file
    then grows by at most ``tail`` bytes more and two marker lines); a symlink in its place is
    refused. ``kept`` starts from what the row recorded (``counts``).
    """

    def __init__(
        self,
        path: Path,
        cap: int = ATTEMPT_LOG_CAP,
        *,
        label: str,
        counts: LogCounts | None = None,
        prepare: Callable[[], object] = lambda: None,
        tail: int = ATTEMPT_LOG_TAIL,
    ) -> None:
        self.path = path
        self.cap = cap
        self.head = cap - tail
        self.tail = tail
        self.label = label
        self.prepare = prepare
        start = counts or LogCounts()
        #: The counts last stored in the attempt's row (see :attr:`changed`).
        self.recorded = start
        self.stdout = start.stdout
        self.stderr = start.stderr
        #: Bytes written to the file (the held tail not among them) and bytes dropped.
        self.kept = start.kept
        self.dropped = start.dropped
        #: The last bytes past the head, written by :meth:`flush_tail`, and the bytes dropped
        #: before them since the last flush.
        self._held = bytearray()
        self._dropped_before_held = 0
        self._held_starts_line = False
        self._made = False

    @property
    def counts(self) -> LogCounts:
        """What this attempt wrote so far (the held tail counts as kept: it will be)."""
        kept = self.kept + len(self._held)
        return LogCounts(self.stdout, self.stderr, kept, self.dropped)

    @property
    def changed(self) -> bool:
        """Whether the attempt wrote anything since its counts were last stored."""
        return self.counts != self.recorded

    @property
    def past_head(self) -> bool:
        """Whether what is written now is held for the tail or dropped, not written."""
        return self.kept >= self.head

    def write(self, stream: str, data: bytes) -> None:
        """Count ``data`` for ``stream``; write what fits under the head, hold the rest as the
        tail (dropping what the tail no longer holds).

        Raises :class:`AttemptLogUnavailableError` (nothing counted) when the file cannot be
        made on this first write.
        """
        if not self._made and data:
            self._make_file()
        if stream == "stderr":
            self.stderr += len(data)
        else:
            self.stdout += len(data)
        room = max(self.head - self.kept, 0)
        written, rest = data[:room], data[room:]
        self.kept += len(written)
        if rest and self.dropped == 0 and not self._held:
            written += head_marker(self.head, self.tail)
        if written:
            _append(self.path, written, self.label)
        if rest:
            self._held += rest
            over = len(self._held) - self.tail
            if over > 0:
                self._held_starts_line = self._held[over - 1] == ord("\n")
                del self._held[:over]
                self.dropped += over
                self._dropped_before_held += over

    def flush_tail(self) -> None:
        """Write the held tail, after one line counting what was dropped before it (none when
        nothing was): called before the attempt's counts are stored."""
        if not self._held:
            return
        if self._dropped_before_held and not self._held_starts_line:
            # What was cut from before the held bytes, cut up to the next line too (when one
            # starts in their first TAIL_LINE_SEARCH bytes): the tail then starts with a whole
            # line. Output of longer lines (or none) keeps all its held bytes.
            cut = self._held.find(b"\n", 0, TAIL_LINE_SEARCH) + 1
            if 0 < cut < len(self._held):
                del self._held[:cut]
                self.dropped += cut
                self._dropped_before_held += cut
        data = bytes(self._held)
        if self._dropped_before_held:
            data = tail_marker(self._dropped_before_held, len(self._held)) + data
        self.kept += len(self._held)
        self._held.clear()
        self._dropped_before_held = 0
        _append(self.path, data, self.label)

    def _make_file(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            self.prepare()
            os.close(os.open(self.path, flags, FILE_MODE))
        except Exception as error:  # an OSError, or an unsafe directory (PiwfError)
            raise AttemptLogUnavailableError(error) from error
        self._made = True


class OutputCapture:
    """The captured output of one process (or group of processes) in one log file."""

    def __init__(
        self,
        loop: EventLoop,
        log_path: Path,
        cap: int,
        *,
        label: str,
        fresh: bool = False,
    ) -> None:
        """``cap``: bytes the capture's own log file keeps (see the module docstring);
        ``fresh``: start the log empty (else captured output is appended to it)."""
        self.loop = loop
        self.log_path = log_path
        self.cap = cap
        self.label = label
        #: Bytes read from every stream, whatever their target.
        self.captured = 0
        #: Bytes the capture's own log file kept, and the bytes meant for it that it dropped.
        self.kept = 0
        self.dropped = 0
        self.streams: list[int] = []
        #: Stream name of each descriptor (``stdout``, ``stderr``, or ``output``).
        self.stream_names: dict[int, str] = {}
        #: Where what is read goes now; None: the capture's own log file.
        self.target: LogTarget | None = None
        #: The streams paused after a dropped read, with the timer that reads them again.
        self._paused: dict[int, Timer] = {}
        if fresh:  # an earlier server's file of this name is emptied now
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
            os.close(os.open(log_path, flags, FILE_MODE))

    def watch(self, descriptor: int, stream: str = "output") -> None:
        """Read ``descriptor`` (a pipe's read end, owned by this capture from now on), whose
        bytes count as ``stream``'s."""
        os.set_blocking(descriptor, False)
        self.streams.append(descriptor)
        self.stream_names[descriptor] = stream
        self.loop.selector.register(descriptor, selectors.EVENT_READ, self._reader(descriptor))

    def switch(self, target: LogTarget | None) -> LogTarget | None:
        """Send what is read from now on to ``target`` (None: the capture's own log); return
        the previous target. Call :meth:`drain` first so nothing already written moves."""
        previous, self.target = self.target, target
        return previous

    def drain(self) -> None:
        """Read what every stream holds now (non-blocking, bounded) to the current target."""
        for descriptor in list(self.streams):
            for _ in range(_DRAIN_READS):
                if not self._read_once(descriptor):
                    break

    def close(self) -> None:
        """Read what the streams still hold (bounded), stop reading and close every stream."""
        self.drain()
        for timer in self._paused.values():
            timer.cancel()
        self._paused = {}
        for descriptor in self.streams:
            with contextlib.suppress(KeyError, ValueError):
                self.loop.selector.unregister(descriptor)
            with contextlib.suppress(OSError):
                os.close(descriptor)
        self.streams = []

    def _reader(self, descriptor: int) -> Callable[[int], None]:
        def read(_mask: int) -> None:
            if self._read_once(descriptor) and self._full():
                self._pause(descriptor)

        return read

    def _full(self) -> bool:
        """Whether what is read now is dropped whole (the current target keeps no more)."""
        if self.target is not None:
            return self.target.past_head
        return self.kept >= self.cap

    def _pause(self, descriptor: int) -> None:
        """Stop reading ``descriptor`` from the selector for ``DROP_PAUSE_S``."""
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(descriptor)
        self._paused[descriptor] = self.loop.call_later(
            DROP_PAUSE_S, lambda: self._unpause(descriptor)
        )

    def _unpause(self, descriptor: int) -> None:
        if self._paused.pop(descriptor, None) is not None and descriptor in self.streams:
            self.loop.selector.register(descriptor, selectors.EVENT_READ, self._reader(descriptor))

    def _read_once(self, descriptor: int) -> bool:
        """Read once from ``descriptor``; False when it held nothing now or has ended (then it
        is no longer watched)."""
        try:
            data = os.read(descriptor, READ_BYTES)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            self._capture(self.stream_names.get(descriptor, "output"), data)
            return True
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(descriptor)
        if descriptor in self.streams:
            # Ended: closed now, so a later drain does not read it again.
            paused = self._paused.pop(descriptor, None)
            if paused is not None:
                paused.cancel()
            self.streams.remove(descriptor)
            with contextlib.suppress(OSError):
                os.close(descriptor)
        return False

    def _capture(self, stream: str, data: bytes) -> None:
        self.captured += len(data)
        if self.target is not None:
            self._to_target(self.target, stream, data)
        else:
            self._to_own_log(data)

    def _to_own_log(self, data: bytes) -> None:
        """Keep what fits under the cap in the capture's own log; count the rest as dropped
        (the first drop adds the marker line and one server log line, no bytes of it)."""
        kept, first_drop = _within_cap(data, self.cap, self.kept, self.dropped)
        self.kept += len(kept)
        self.dropped += len(data) - len(kept)
        if first_drop:
            kept += drop_marker(self.cap, "the captured")
            log.info(
                "%s wrote more than %d bytes of output; the rest is dropped (%s keeps the first)",
                self.label,
                self.cap,
                self.log_path.name,
            )
        if kept:
            _append(self.log_path, kept, self.label)

    def _to_target(self, target: LogTarget, stream: str, data: bytes) -> None:
        try:
            target.write(stream, data)
        except AttemptLogUnavailableError as error:
            # That output, and what follows, stays in this capture's own log; the reason
            # names no byte of it.
            log.warning(
                "%s not opened (%s); its output goes to %s", target.label, error, self.label
            )
            self.target = None
            self._to_own_log(data)


def _within_cap(data: bytes, cap: int, kept: int, dropped: int) -> tuple[bytes, bool]:
    """The part of ``data`` a log that already kept ``kept`` bytes (and dropped ``dropped``)
    keeps under ``cap``, and whether this is its first drop (the one that adds the marker)."""
    room = max(cap - kept, 0)
    return data[:room], len(data) > room and dropped == 0


def _append(path: Path, data: bytes, label: str) -> None:
    """Append ``data`` to a capture file, made ``0600`` by its first byte (a symlink in its
    place is refused); a failure is one log line (no bytes of it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        descriptor = os.open(path, flags, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
        finally:
            os.close(descriptor)
    except OSError as error:
        log_failure(
            f"capturing the output of {label}", state_error_of_os(error, "writing captured output")
        )
