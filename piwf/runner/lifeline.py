"""The lifeline: a child stops, with every process it started, within moments of its server.

:func:`begin` is a child's first act, before any workflow, manager or import-time user code::

    subreaper (Linux)          an orphaned descendant (a double-forked, setsid-ed daemon) is
                               reparented to this child, so it stays in this child's tree
    SIGTERM handling           the server's stop; the C-level handler writes to the wake pipe
                               (signal.set_wakeup_fd) and the Python one does too, so the
                               thread hears it even while the main thread is in a blocking call
    the lifeline thread        a daemon thread polling the watched descriptor and the wake pipe
    parent-death signal        SIGTERM when the parent (the server, or its fork server) ends
                               (Linux)

The *watched descriptor* is a parameter: anything that becomes readable at end-of-file (or
hangs up) when the server dies and never carries data. A child watches
``multiprocessing.parent_process().sentinel`` (:mod:`piwf.runner.bootstrap`): the read end of
the pipe its start data came through, whose write end only the server keeps, with ``spawn``
and with ``forkserver`` alike (the fork server never holds it), so it ends with the server and
not with the fork server.

When the lifeline fires (server gone, SIGTERM, parent gone) the child ends itself::

    descendants (psutil tree) and own process group ── SIGTERM ── up to 0.5 s ── SIGKILL
      ── walk the tree again until it is empty (bounded) ── SIGKILL own group, itself included

:meth:`Lifeline.end_descendants` does the first part without ending the child: at a node's
end and at the child's exit, so no process outlives the node or run that started it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from types import FrameType
from typing import NoReturn

import psutil

from piwf.processes import descendants, is_gone, signal_processes
from piwf.runner import prctl

#: How long descendants get between SIGTERM and SIGKILL (twice this bounds each phase).
END_GRACE_S = 0.5
#: Exit code of a child ended by its lifeline that does not lead its own process group.
EXIT_STOPPED = 128 + signal.SIGTERM
#: Passes of "walk the tree, kill what is there" before giving up on a forking descendant.
_KILL_ROUNDS = 4
#: What the Python-level SIGTERM handler writes to the wake pipe; the C-level handler writes
#: the signal number itself.
_TERMINATE = b"T"
_SIGTERM_BYTE = bytes([signal.SIGTERM])
#: How often a wait for descendants (not all of them this process's children) looks again.
_POLL_S = 0.01


class Lifeline:
    """Watches one descriptor for the server's death and ends this process tree when it
    comes, on SIGTERM, or when :meth:`trigger` is called."""

    def __init__(self, watch: int | None, *, grace_s: float = END_GRACE_S) -> None:
        self.watch = watch
        self.grace_s = grace_s
        self._watched = _file_identity(watch)
        self._stopping = threading.Event()
        self._pid = os.getpid()
        self._wake_reader, self._wake_writer = os.pipe()
        os.set_blocking(self._wake_reader, False)
        os.set_blocking(self._wake_writer, False)

    def start(self) -> None:
        """Install the SIGTERM handling and start the thread (from the main thread).

        A process that workflow code forks from this one (without exec) gets the default
        SIGTERM back and none of the wake pipe: its signals must neither reach this lifeline
        nor be swallowed by a handler meant for this process.
        """
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.set_wakeup_fd(self._wake_writer, warn_on_full_buffer=False)
        os.register_at_fork(after_in_child=self._forked_away)
        threading.Thread(target=self._watch_loop, name="piwf-lifeline", daemon=True).start()

    def trigger(self) -> None:
        """Have the thread end this process tree (safe from a signal handler)."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_writer, _TERMINATE)

    @property
    def stopping(self) -> bool:
        """Whether the lifeline is ending this process."""
        return self._stopping.is_set()

    def end_descendants(self) -> None:
        """End every descendant of this process (SIGTERM, bounded grace, SIGKILL) and collect
        its own zombie children; this process keeps running.

        Cheap when there is nothing to end: one ``waitid`` finds that this process has no
        child at all (as a subreaper it then has no descendant either). If the lifeline is
        already ending the process, wait for that instead of racing it.
        """
        if self._stopping.is_set():
            threading.Event().wait(4 * self.grace_s)  # the lifeline's _exit comes first
            return
        if not _may_have_children():
            return
        me = psutil.Process()
        for _ in range(_KILL_ROUNDS):
            tree = descendants(me)
            if not tree:
                break
            _end_processes(tree, self.grace_s)
        _collect_zombie_children(me)

    # -- the thread -------------------------------------------------------------------------

    def _on_sigterm(self, _number: int, _frame: FrameType | None) -> None:
        if os.getpid() == self._pid:
            self.trigger()

    def _forked_away(self) -> None:
        if os.getpid() == self._pid:
            return
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for descriptor in (self._wake_reader, self._wake_writer):
            with contextlib.suppress(OSError):
                os.close(descriptor)

    def _watch_loop(self) -> None:
        poller = select.poll()
        poller.register(self._wake_reader, select.POLLIN)
        if self.watch is not None:
            poller.register(self.watch, select.POLLIN)
        while True:
            for descriptor, mask in poller.poll():
                if descriptor == self._wake_reader:
                    if self._termination_requested():
                        self._end_process()
                elif mask & select.POLLNVAL or _file_identity(descriptor) != self._watched:
                    # Workflow code closed (or replaced) the descriptor: it can no longer tell
                    # anything; the parent-death signal and SIGTERM still can.
                    poller.unregister(descriptor)
                elif _server_gone(descriptor, mask):
                    self._end_process()

    def _termination_requested(self) -> bool:
        data = b""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self._wake_reader, 512):
                data += chunk
        # Other signals with a Python handler (SIGINT) also write their number: not ours.
        return _TERMINATE in data or _SIGTERM_BYTE in data

    def _end_process(self) -> NoReturn:
        """End every descendant and this process's group, this process last."""
        self._stopping.set()
        me = psutil.Process()
        group = os.getpgrp() if os.getpgrp() == os.getpid() else None
        tree = descendants(me)
        signal_processes(tree, signal.SIGTERM)
        if group is not None:
            # Members that left the tree (no subreaper on this platform); this process too,
            # whose handler only writes to the wake pipe again.
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGTERM)
        _wait_gone(tree, self.grace_s)
        for _ in range(_KILL_ROUNDS):
            rest = descendants(me)
            if not rest:
                break
            signal_processes(rest, signal.SIGKILL)
            _wait_gone(rest, self.grace_s)
        if group is not None:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        os._exit(EXIT_STOPPED)


def begin(watch: int | None, parent: int | None) -> Lifeline:
    """Make this process a child that dies with its server: subreaper, SIGTERM handling, the
    lifeline thread on ``watch`` and SIGTERM when ``parent`` (the pid that started it) ends.

    Call it first, from the main thread. A parent that is already gone fires the lifeline at
    once.
    """
    prctl.become_subreaper()
    lifeline = Lifeline(watch)
    lifeline.start()
    if not prctl.die_with_parent(signal.SIGTERM, parent):
        lifeline.trigger()
    return lifeline


def _wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` until every process is gone, reaping those that are this
    process's children; return the ones still running."""
    deadline = time.monotonic() + timeout_s
    pending = list(processes)
    while True:
        for process in pending:
            _reap_if_ours(process)
        pending = [process for process in pending if not is_gone(process)]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(_POLL_S)  # a bounded poll of processes that may not be our children


def _reap_if_ours(process: psutil.Process) -> None:
    """Collect ``process``'s zombie if it is this process's child (born so, or reparented to
    a subreaper); its pid is still its own while it is a zombie."""
    with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
        if process.is_running():
            os.waitpid(process.pid, os.WNOHANG)


def _end_processes(processes: list[psutil.Process], grace_s: float) -> None:
    """SIGTERM each process, SIGKILL those still running after ``grace_s``, and wait (bounded
    by ``grace_s`` again) until they are gone."""
    if not processes:
        return
    signal_processes(processes, signal.SIGTERM)
    survivors = _wait_gone(processes, grace_s)
    if survivors:
        signal_processes(survivors, signal.SIGKILL)
        _wait_gone(survivors, grace_s)


def _server_gone(descriptor: int, mask: int) -> bool:
    """Whether the watched descriptor says the server is gone: hung up, or at end-of-file."""
    if mask & (select.POLLHUP | select.POLLERR):
        return True
    try:
        return os.read(descriptor, 1) == b""  # readable and empty: every writer is gone
    except OSError:
        return False


def _file_identity(descriptor: int | None) -> tuple[int, int] | None:
    if descriptor is None:
        return None
    try:
        status = os.fstat(descriptor)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _may_have_children() -> bool:
    """False only when this process provably has no child, running or zombie."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return True
    try:
        waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _collect_zombie_children(me: psutil.Process) -> None:
    """Reap this process's children that already ended (daemons reparented here among them),
    so the next :func:`_may_have_children` can say no again."""
    with contextlib.suppress(psutil.Error):
        for child in me.children():
            with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
