"""How child processes start: one ``multiprocessing`` context, ``forkserver`` or ``spawn``.

``forkserver`` (the default where the platform has it, Linux) starts one fork server, which
imports :data:`~piwf.processes.FORKSERVER_PRELOAD` once, never opens SQLite and runs no thread,
and forks each child from it in a few milliseconds: spawn's guarantees (no descriptor, lock or
connection of the server is ever inherited) at a fork's cost. A server's first fork server is
a fork of the server made before it opens anything, sharing its imports, and so is its
resource tracker (:mod:`~piwf.server.children.forked_fork_server`); a replacement is a new
interpreter. ``spawn``
(``PIWF_START_METHOD=spawn``, and the default elsewhere) starts a fresh interpreter per child.
Either way the ``Process`` target is :func:`~piwf.processes.enter_child` with plain values and
connections as its arguments; nothing else is pickled. A child never re-runs the server's main
script (see :func:`spare_children_the_main_script`).

The standard library's helpers, the fork server and the resource tracker, are children of the
server. The resource tracker stays in the server's process group; the fork server leads a
session of its own, which every child it forks shares (:mod:`piwf.runner.children_session`:
with Linux's autogroup scheduling the busy children then take one share of the CPU, not one
each, and the server keeps its own). Both end with the server: the fork server at end-of-file
on its "alive" pipe, whose only other holders, the forked children, close their copies first thing
(:mod:`piwf.runner.bootstrap`); the resource tracker once the server, the fork server and the
children have all closed its pipe. Their standard output and error (and a child's, before its
first act moves its own) go to one descriptor the supervisor captures (``helpers.log``).

``Process.start()`` does not wait for the fork server to fork: with ``forkserver`` the launch
ends once the request is written, and the child's pid comes later on its sentinel
(:mod:`piwf.server.children.forkserver_launch`; the supervisor watches for it). The rest of
the start (connecting to the fork server, writing the request; a spawn's fork and exec) runs
under a deadline, and the supervisor gives the pid the same time to come: a fork server that
does not answer (stopped, wedged) costs one failed start, not the server's loop, and is
replaced. The deadline is :data:`START_TIMEOUT_S` once the fork server has forked a child,
:data:`FIRST_START_TIMEOUT_S` before that (a new fork server answers only once its imports are
done, slow on a loaded machine).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.machinery
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from multiprocessing import forkserver, resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from types import FrameType

from piwf.processes import (
    CHILDREN_SESSION_VARIABLE,
    FORKSERVER_PRELOAD,
    enter_child,
    kill_own_children,
)
from piwf.server.children.forked_fork_server import FORK_SERVER_COMMAND, fork_helpers_from_here
from piwf.server.children.forkserver_launch import PidLaterContext

#: The longest a start may take from a fork server that has forked before: far above a fork,
#: far below the leases a stalled loop would put at risk.
START_TIMEOUT_S = 5.0
#: The same for a fork server that has not forked yet: its imports come first.
FIRST_START_TIMEOUT_S = 30.0
#: How long a killed fork server may take to be dead.
_REPLACE_WAIT_S = 1.0
#: How long a fork server or a resource tracker may take to end once told (server shutdown).
_HELPER_STOP_WAIT_S = 2.0


class StartMethod(str, Enum):
    """How children start (``PIWF_START_METHOD``)."""

    FORKSERVER = "forkserver"
    SPAWN = "spawn"


def default_start_method() -> StartMethod:
    """``forkserver`` on Linux, where it has been tested and is cheapest; ``spawn`` elsewhere."""
    if sys.platform.startswith("linux") and "forkserver" in multiprocessing.get_all_start_methods():
        return StartMethod.FORKSERVER
    return StartMethod.SPAWN


def start_method_from(text: str) -> StartMethod:
    """The start method named by ``text``; raise ``ValueError`` saying what to set instead when
    it is unknown or this platform lacks it."""
    names = ", ".join(method.value for method in StartMethod)
    try:
        method = StartMethod(text)
    except ValueError:
        raise ValueError(f"PIWF_START_METHOD must be one of {names}, not {text!r}") from None
    if method.value not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"PIWF_START_METHOD={method.value} is not available on this platform;"
            f" set PIWF_START_METHOD={StartMethod.SPAWN.value}"
        )
    return method


@dataclass
class EarlyHelpers:
    """Start helpers started before the server's own imports (:func:`start_helpers_early`):
    the starter that started them and both ends of the pipe their output goes to, for the
    supervisor to adopt (it captures the pipe and keeps the starter)."""

    starter: ChildStarter
    output_reader: int
    output_writer: int


def start_helpers_early(method: StartMethod) -> EarlyHelpers | None:
    """Start the resource tracker and, with ``forkserver``, the fork server now, once the
    server has imported its modules and before it opens anything: the fork server is then a
    fork of the server (:mod:`~piwf.server.children.forked_fork_server`), which has imported
    most of what its children need already (a new interpreter would import it again: ~0.3 s
    of CPU), and the first child (a resolver, a recovered run's runner) does not wait for an
    import. Their output waits in a pipe until the supervisor adopts it
    (:meth:`~piwf.server.children.supervisor.Supervisor.prepare`). A server that then does
    not start leaves nothing: the helpers end with its process. None when they could not be
    started (the supervisor starts them itself, and says why)."""
    reader, writer = os.pipe()
    starter = ChildStarter(method, helpers_output=writer)
    try:
        starter.start_helpers(fork_from_here=True)
    except OSError:
        os.close(reader)
        os.close(writer)
        return None
    return EarlyHelpers(starter, reader, writer)


class ChildStartError(OSError):
    """A child could not be started; nothing of it runs (its descriptors are the caller's)."""


class ChildStarter:
    """Starts children through one ``multiprocessing`` context.

    ``helpers_output`` is the descriptor the standard library's helper processes get as their
    standard output and error (see the module docstring); None leaves them the server's.
    """

    def __init__(self, method: StartMethod, helpers_output: int | None = None) -> None:
        self.method = method
        self.context: PidLaterContext | SpawnContext = (
            PidLaterContext()
            if method is StartMethod.FORKSERVER
            else multiprocessing.get_context("spawn")
        )
        self.helpers_output = helpers_output
        #: Whether the current fork server has forked a child (its imports are done).
        self.proven = False
        spare_children_the_main_script()
        if method is StartMethod.FORKSERVER:
            forkserver.set_forkserver_preload(list(FORKSERVER_PRELOAD))

    def start_helpers(self, *, fork_from_here: bool = False) -> None:
        """Start the resource tracker and, with ``forkserver``, the fork server now, so the
        first child does not wait for their imports (they run while the server serves).
        ``fork_from_here``: the fork server and the resource tracker are forks of this
        process, which must have opened nothing they must not hold (see
        :mod:`~piwf.server.children.forked_fork_server`)."""
        forking = fork_helpers_from_here() if fork_from_here else contextlib.nullcontext()
        with self._helpers_streams(), self._helpers_environment(), forking:
            resource_tracker.ensure_running()
            if self.method is StartMethod.FORKSERVER:
                forkserver.ensure_running()

    def stop_helpers(self, timeout_s: float = _HELPER_STOP_WAIT_S) -> None:
        """End the fork server, then the resource tracker, and reap each: a stopped server's
        stop then returns with no process of its own left. Each is told as this process's exit
        would tell it, by closing this process's end of its pipe (the fork server's "alive"
        pipe, the tracker's, which the fork server held too); one still there after
        ``timeout_s`` (stopped, wedged, or its pipe held by a process that outlived its run)
        is killed. For the server's shutdown, once every child has ended."""
        if self.method is StartMethod.FORKSERVER:
            _end_helper(
                forkserver._forkserver, "_forkserver_alive_fd", "_forkserver_pid", timeout_s
            )
        _end_helper(resource_tracker._resource_tracker, "_fd", "_pid", timeout_s)

    @property
    def timeout_s(self) -> float:
        """How long a start may take now, until the child's pid is known (module docstring)."""
        return START_TIMEOUT_S if self.proven else FIRST_START_TIMEOUT_S

    def start(
        self,
        *,
        name: str,
        kind: str,
        directory: str,
        environment: dict[str, str | None],
        connections: tuple[Connection, Connection, Connection],
    ) -> BaseProcess:
        """Start one child: ``enter_child(kind, *connections, directory, environment)``.

        ``connections`` are the child's ends of its channel and of its stdout and stderr pipes
        (the child holds its own copies once this returns). With ``forkserver`` the returned
        process's ``pid`` is None until the fork server has reported it (see the module
        docstring). Raises :class:`ChildStartError`.
        """
        channel, stdout, stderr = connections
        process = self.context.Process(
            target=enter_child,
            args=(kind, channel, stdout, stderr, directory, environment),
            name=name,
        )
        timeout_s = self.timeout_s
        try:
            with self._helpers_streams(), self._helpers_environment(), _deadline(timeout_s):
                self._start_process(process)
        except _StartTimeoutError:
            self.replace_fork_server()
            raise ChildStartError(errno.ETIMEDOUT, timed_out(timeout_s)) from None
        except OSError as error:
            raise ChildStartError(error.errno or errno.EIO, error.strerror or "") from None
        except ValueError as error:  # too many descriptors to pass, a closed connection
            raise ChildStartError(errno.EINVAL, str(error)) from None
        return process

    def _start_process(self, process: BaseProcess) -> None:
        """``process.start()``, tried again (for a bounded while) when a dead fork server
        refuses it: one that died closes its socket before it can be reaped, and is taken for
        alive until then; the first try after that launches a new one."""
        deadline = time.monotonic() + _REPLACE_WAIT_S
        while True:
            try:
                process.start()
                return
            except ConnectionRefusedError:
                if self.method is not StartMethod.FORKSERVER or time.monotonic() >= deadline:
                    raise
                self.proven = False
                time.sleep(0.01)  # a bounded poll of a process that must not be reaped here

    def forked(self) -> None:
        """A child's pid came: the fork server's imports are done."""
        self.proven = True

    def lost_fork_server(self) -> None:
        """The fork server ended before it forked a child: the next one imports first."""
        self.proven = False

    def replace_fork_server(self) -> None:
        """Kill the fork server that did not answer; the next start launches a new one.

        It is left for ``forkserver.ensure_running`` to reap, which fails on a fork server
        someone else reaped.
        """
        self.proven = False
        if self.method is StartMethod.FORKSERVER:
            kill_own_children(FORK_SERVER_COMMAND, _REPLACE_WAIT_S)

    @contextlib.contextmanager
    def _helpers_environment(self) -> Iterator[None]:
        """Mark the environment a fork server started now begins with, so that it leads the
        children's session (:mod:`piwf.runner.children_session`). A forked child gets the fork
        server's environment, not this one, and the fork server removes the mark first; a
        spawned child must not get it, so spawn leaves the environment alone."""
        if self.method is not StartMethod.FORKSERVER:
            yield
            return
        os.environ[CHILDREN_SESSION_VARIABLE] = "1"
        try:
            yield
        finally:
            os.environ.pop(CHILDREN_SESSION_VARIABLE, None)

    @contextlib.contextmanager
    def _helpers_streams(self) -> Iterator[None]:
        """Point descriptors 1 and 2 at :attr:`helpers_output` while a helper may be started
        (the server's loop is its only thread, so nothing else writes there meanwhile)."""
        if self.helpers_output is None:
            yield
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved = [_dup_or_none(1), _dup_or_none(2)]
        try:
            os.dup2(self.helpers_output, 1)
            os.dup2(self.helpers_output, 2)
            yield
        finally:
            for target, copy in zip((1, 2), saved, strict=True):
                if copy is None:
                    with contextlib.suppress(OSError):
                        os.close(target)
                else:
                    os.dup2(copy, target)
                    os.close(copy)


def spare_children_the_main_script() -> None:
    """Name the server's main module as ``piwf.__main__`` when it is piwf's console script.

    Both start methods prepare a child by re-running the parent's main script (as
    ``__mp_main__``), so that objects defined there can be unpickled; a package's
    ``__main__`` module is never re-run. A server started as ``python -m piwf`` has that
    name already; one started by the ``piwf`` console script (``from piwf.cli import main``)
    would make every child import the CLI again, about 50 ms each. The two are the same program
    (``piwf/__main__.py``), and nothing a child unpickles is defined in either.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return
    if getattr(getattr(main, "main", None), "__module__", None) == "piwf.cli":
        main.__spec__ = importlib.machinery.ModuleSpec("piwf.__main__", None)


def timed_out(timeout_s: float) -> str:
    """What a start that overran its deadline reports."""
    return f"the child did not start in {timeout_s:g} s"


class _StartTimeoutError(Exception):
    """Raised by the deadline's SIGALRM handler inside a blocked ``Process.start()``."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`_StartTimeoutError` in the block once ``seconds`` have passed (the main
    thread only: elsewhere the block runs unbounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_number: int, _frame: FrameType | None) -> None:
        raise _StartTimeoutError

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


def _end_helper(helper: object, pipe_name: str, pid_name: str, timeout_s: float) -> None:
    """Close ``helper``'s pipe (its attribute ``pipe_name``, a descriptor) and reap its process
    (``pid_name``), killing it at the deadline; nothing when it was never started here. The
    standard library's own ``_stop`` does the same but waits without a bound."""
    pipe, pid = getattr(helper, pipe_name, None), getattr(helper, pid_name, None)
    if not isinstance(pipe, int) or not isinstance(pid, int):
        return
    setattr(helper, pipe_name, None)
    setattr(helper, pid_name, None)
    with contextlib.suppress(OSError):
        os.close(pipe)
    deadline = time.monotonic() + timeout_s
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.01)  # a bounded poll: the process is this one's child, reaped here
    except ChildProcessError:  # reaped already (a fork server that was replaced)
        pass


def _dup_or_none(descriptor: int) -> int | None:
    try:
        return os.dup(descriptor)
    except OSError:
        return None
