"""Non-blocking framed I/O with one supervised child, driven by the server's selector.

Reads complete length-prefixed messages as they arrive and hands them over; writes without
blocking, keeping a large frame in the pipe's buffer and asking the selector for writability
only while output waits. A closed pipe or an oversized announced frame is reported once through
``on_broken`` (``"closed"`` or ``"overflow"``) and the pipe is no longer watched.
"""

from __future__ import annotations

import contextlib
import selectors
from collections.abc import Callable

from piwf.server.children.pipes import PipeClosedError, PipeOverflowError
from piwf.server.children.supervisor import ChildHandle
from piwf.server.loop import EventLoop


class ChildLink:
    """The server end of one child's pipe."""

    def __init__(
        self,
        loop: EventLoop,
        handle: ChildHandle,
        on_messages: Callable[[list[bytes]], None],
        on_broken: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.handle = handle
        self.on_messages = on_messages
        self.on_broken = on_broken
        self.watching = False

    def watch(self) -> None:
        """Start reading the child's messages."""
        self.loop.selector.register(self.handle.channel.fd, selectors.EVENT_READ, self._on_event)
        self.watching = True

    def send(self, data: bytes) -> None:
        """Queue one message and write what the pipe takes now; a dead child is ignored."""
        if self.handle.exited or not self.watching:
            return
        try:
            self.handle.channel.send(data)
        except (PipeClosedError, PipeOverflowError):
            self._unwatch()
            return
        self._update_interest()

    def _on_event(self, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            try:
                self.handle.channel.flush()
            except PipeClosedError:
                self._unwatch()
                return
            self._update_interest()
        if mask & selectors.EVENT_READ:
            self._read()

    def _read(self) -> None:
        try:
            messages = self.handle.channel.read_messages()
        except PipeClosedError:
            self._unwatch()
            self.on_broken("closed")
            return
        except PipeOverflowError:
            self._unwatch()
            self.on_broken("overflow")
            return
        if messages:
            self.on_messages(messages)

    def _update_interest(self) -> None:
        if not self.watching:
            return
        events = selectors.EVENT_READ
        if self.handle.channel.wants_write:
            events |= selectors.EVENT_WRITE
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.modify(self.handle.channel.fd, events, self._on_event)

    def _unwatch(self) -> None:
        self.watching = False
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(self.handle.channel.fd)
