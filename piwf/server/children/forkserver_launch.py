"""A fork-server launch that does not wait for the child's pid.

The standard library's ``popen_forkserver.Popen._launch`` asks the fork server for a child, writes
the pickled ``Process`` to it, then blocks in ``read_signed`` until the fork server has forked
and written the pid back. On a busy machine that wait is the fork server's turn for a CPU, and
a fresh child often runs first: milliseconds per start, spent inside the server's loop. Here
the launch ends once the request is written, and the pid is read when its descriptor (the
sentinel) first becomes readable. The fork server writes two numbers there, in this order::

    pid            once it has forked the child              (read first by poll)
    exit status    once it has reaped it                     (then end-of-file)
    end-of-file    instead, when the fork server died first  (no pid: the start failed, 255)

Until the pid comes, ``Process.pid`` is None and :meth:`PidLaterPopen.poll` reads a pending pid
before it looks for the exit status. Whoever starts children this way watches the sentinel, and
notices a pid that someone else's ``poll`` read (``Process.start`` polls every child it knows).

``_launch`` is the standard library's (identical in CPython 3.10 to 3.13) minus its final read.
"""

from __future__ import annotations

import io
import os
import time
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.connection import wait
from multiprocessing.context import ForkServerContext, ForkServerProcess, set_spawning_popen
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar, SupportsIndex

#: The exit code of a child whose fork server ended before it reported the child's pid, as the
#: standard library reports one whose fork server ended before its exit status.
NO_CHILD_EXIT_CODE = 255


class PidLaterPopen(popen_forkserver.Popen):
    """A fork-server ``Popen`` whose ``pid`` is None until the fork server has reported it."""

    pid: int | None  # type: ignore[assignment]  # the standard library's is known at once

    def _launch(self, process_obj: BaseProcess) -> None:
        self.pid = None
        prep_data = spawn.get_preparation_data(process_obj.name)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)

        self.sentinel, w = forkserver.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        # Keep a duplicate of the data pipe's write end as the parent sentinel the child
        # watches: it ends when this process closes the Process (or dies).
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(
            self,
            util.close_fds,  # type: ignore[attr-defined]
            (_parent_w, self.sentinel),
        )
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        # No read_signed here: the pid is read once it has come (poll).

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        """The exit code, or None while the child runs or has not been reported yet; reads a
        pending pid first (waits for it and then the exit unless ``flag`` is ``WNOHANG``)."""
        if self.returncode is None and self.pid is None and not self._read_pid(flag):
            return self.returncode
        return super().poll(flag)

    def wait(self, timeout: float | None = None) -> int | None:
        """Like the standard library's, with the pid's arrival counted in ``timeout``."""
        if timeout is None:
            return self.poll(0)
        deadline = time.monotonic() + timeout
        # Each readable turn consumes one number (the pid, then the exit status): bounded.
        while self.poll() is None:
            if not wait([self.sentinel], max(0.0, deadline - time.monotonic())):
                return None
        return self.returncode

    def abandon(self) -> None:
        """Give up a start whose pid has not come: report it ended (255), so the ``Process``
        can be closed and its descriptors with it (a child forked after all then sees its
        parent sentinel end)."""
        if self.pid is None and self.returncode is None:
            self.returncode = NO_CHILD_EXIT_CODE

    def _send_signal(self, sig: int) -> None:
        if self.pid is not None:  # no process to signal yet
            super()._send_signal(sig)  # type: ignore[misc]

    def _read_pid(self, flag: int) -> bool:
        """Read the pid if it has come (or wait for it unless ``flag`` is ``WNOHANG``); False
        when it has not, or never will (then ``returncode`` says so)."""
        if not wait([self.sentinel], 0 if flag == os.WNOHANG else None):
            return False
        try:
            self.pid = forkserver.read_signed(self.sentinel)
        except (OSError, EOFError):  # the fork server ended before it forked the child
            self.returncode = NO_CHILD_EXIT_CODE
            return False
        return True


class PidLaterProcess(ForkServerProcess):
    """A fork-server ``Process`` started through :class:`PidLaterPopen`.

    In the child it is a standard ``ForkServerProcess`` (see :meth:`__reduce_ex__`), so the
    child never imports this module.
    """

    #: The launch, once started.
    launch: PidLaterPopen | None = None

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> PidLaterPopen:  # noqa: N802  # the stdlib's name
        popen = PidLaterPopen(process_obj)
        if isinstance(process_obj, PidLaterProcess):
            process_obj.launch = popen  # after the pickling: the child never sees it
        return popen

    def abandon(self) -> None:
        """See :meth:`PidLaterPopen.abandon`; nothing before the start or once the pid came."""
        if self.launch is not None:
            self.launch.abandon()

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        # The standard reduction (its state, the instance's attributes) rebuilt as the base
        # class: the launch that pickles this is the only use of it.
        reduced = super().__reduce_ex__(protocol)
        assert isinstance(reduced, tuple)
        return (object.__new__, (ForkServerProcess,), *reduced[2:])


class PidLaterContext(ForkServerContext):
    """The ``forkserver`` context whose processes report their pid later."""

    Process: ClassVar[type[ForkServerProcess]] = PidLaterProcess
