"""The zygote: a pre-imported fork server that starts piwf's children in a few milliseconds.

Started by the server's supervisor like any child (``python -m piwf.runner.zygote --fd N
--lifeline-fd L --parent-pid P``, in its own session, with the children's environment), it
imports every child entry module once
(the workflow runner, the resource runner, the resolver and what they load: engine, compiler,
pydantic models) but never opens SQLite and never starts a thread. Then it serves its control
socket, descriptor N. Every frame, both ways, is a 4-byte big-endian length and one canonical
JSON object of at most 1 MiB; nothing is pickled::

    zygote → server  {"kind": "ready", "pid": P}                      imports done
    server → zygote  {"kind": "fork", "id": n, "module": M, "cwd": D}
                     + 3 descriptors in the same sendmsg (SCM_RIGHTS): the child's end of its
                       channel, the write ends of its stdout and stderr pipes
    zygote → server  {"kind": "forked", "id": n, "pid": P, "identity": "pid:created:boot"|null}
                   | {"kind": "refused", "id": n, "error": str}
    zygote → server  {"kind": "exited", "pid": P, "exitCode": C} | {..., "signal": S}

``M`` must be one of :data:`ENTRY_MODULES`; anything else is refused. The forked child calls
``os.setsid()`` before the zygote answers (so its pid is its process group when the server
hears of it), resets the zygote's signal handling, puts its pipes on descriptors 1 and 2, its
channel on descriptor 3 and the server's lifeline pipe on descriptor 4, closes every other
descriptor it inherited (the control socket among them), changes to ``D``, sets ``sys.argv``
and its process title as ``python -m M --fd 3 --lifeline-fd 4 --parent-pid Z`` would (Z: the
zygote; its environment stays readable in ``/proc``), calls ``M.main`` with those arguments and
ends with ``os._exit`` after the interpreter's own exit duties (non-daemon threads, ``atexit``,
flushed streams): it never returns into the loop. ``M.main`` begins the child's lifeline
(:mod:`piwf.runner.lifeline`): it watches the server's pipe itself and is sent SIGTERM when
the zygote ends.

The zygote reaps its children (SIGCHLD wakes its ``select`` through a wake-up pipe;
``waitpid(-1, WNOHANG)``) and reports each exit. It exits when its control socket reaches
end-of-file or the lifeline pipe does, and the kernel kills it when the server ends (Linux
``PR_SET_PDEATHSIG``), so a server that dies, even by SIGKILL, leaves no zygote behind; a
malformed frame also ends it (the server falls back to spawning and starts a new one).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import importlib
import os
import select
import signal
import socket
import struct
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from piwf import canonical
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import PiwfError
from piwf.processes import start_identity
from piwf.runner import prctl
from piwf.runner.entry import name_process, parse_child_arguments

#: The only modules a fork request may name; each has ``main(argv) -> int`` reading ``--fd N``.
ENTRY_MODULES: frozenset[str] = frozenset(
    {
        "piwf.runner.workflow_runner",
        "piwf.runner.resource_runner",
        "piwf.runner.resolver",
    }
)
#: What the entry modules import lazily, loaded here once so no child pays for it.
_PRELOAD = (
    "piwf.workflow.commands",
    "piwf.workflow.engine",
    "piwf.workflow.sources",
    "piwf.runner.resource_resolve",
    "piwf.resource.discovery",
    "setproctitle",
)
#: The child's channel descriptor (``--fd 3``), after its stdout and stderr.
CHILD_CHANNEL_FD = 3
#: The child's copy of the server's lifeline pipe (``--lifeline-fd 4``), when there is one.
CHILD_LIFELINE_FD = 4
#: Where descriptors wait while the child's 1-4 are filled (above any of those).
_SCRATCH_FD = 10
DESCRIPTORS_PER_FORK = 3
EXIT_PROTOCOL = 2
EXIT_THREADS = 3

_HEADER = struct.Struct("!i")
_MAX_QUEUED_DESCRIPTORS = 3 * DESCRIPTORS_PER_FORK


class ZygoteProtocolError(Exception):
    """The server sent something this zygote cannot serve; it exits."""


class Zygote:
    """The fork server's loop: read requests, fork, answer, reap, report."""

    def __init__(self, control: socket.socket, lifeline: int | None = None) -> None:
        self.control = control
        #: The read end of the server's lifeline pipe: end-of-file when the server is gone.
        self.lifeline = lifeline
        self.pid = os.getpid()
        self.inbox = bytearray()
        #: Descriptors received and not yet claimed by a fork frame, in arrival order.
        self.descriptors: list[int] = []
        self.wake_reader, self.wake_writer = os.pipe()
        os.set_blocking(self.wake_reader, False)
        os.set_blocking(self.wake_writer, False)
        self.startup_directory = str(Path.cwd())

    def serve(self) -> int:
        """Serve until the control socket closes; return the exit code."""
        signal.set_wakeup_fd(self.wake_writer, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _ignore_signal)  # a handler, so the wake-up pipe fires
        self._send({"kind": "ready", "pid": os.getpid()})
        watched = [] if self.lifeline is None else [self.lifeline]
        while True:
            control = self.control.fileno()
            readable, _, _ = select.select([control, self.wake_reader, *watched], [], [])
            if watched and self.lifeline in readable:
                return 0  # nobody writes to it: readable is end-of-file, the server is gone
            if self.wake_reader in readable:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_reader, 512):
                        pass
            self._reap()
            if control in readable and not self._receive():
                return 0

    # -- requests ---------------------------------------------------------------------------

    def _receive(self) -> bool:
        """Take what the control socket has; False at end-of-file."""
        try:
            data, descriptors, flags, _ = socket.recv_fds(self.control, 65536, 8)
        except (ConnectionResetError, BrokenPipeError):
            return False
        self.descriptors.extend(descriptors)
        if flags & socket.MSG_CTRUNC or len(self.descriptors) > _MAX_QUEUED_DESCRIPTORS:
            raise ZygoteProtocolError("descriptors were lost or piled up")
        if not data and not descriptors:
            return False
        self.inbox += data
        while len(self.inbox) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self.inbox)
            if length < 0 or length > MAX_FRAME_BYTES:
                raise ZygoteProtocolError(f"a {length}-byte frame")
            end = _HEADER.size + length
            if len(self.inbox) < end:
                break
            frame = canonical.decode(bytes(self.inbox[_HEADER.size : end]))
            del self.inbox[:end]
            if not isinstance(frame, dict) or frame.get("kind") != "fork":
                raise ZygoteProtocolError("only fork requests are served")
            self._fork_request(frame)
        return True

    def _fork_request(self, frame: dict[str, Any]) -> None:
        request_id = frame.get("id")
        if not isinstance(request_id, int) or len(self.descriptors) < DESCRIPTORS_PER_FORK:
            raise ZygoteProtocolError("a fork request needs an id and three descriptors")
        descriptors = self.descriptors[:DESCRIPTORS_PER_FORK]
        del self.descriptors[:DESCRIPTORS_PER_FORK]
        module, directory = frame.get("module"), frame.get("cwd")
        try:
            if module not in ENTRY_MODULES or not isinstance(module, str):
                self._send({"kind": "refused", "id": request_id, "error": "not an entry module"})
                return
            try:
                pid, identity = self._fork(module, directory, descriptors)
            except OSError as error:
                self._send({"kind": "refused", "id": request_id, "error": str(error)[:200]})
                return
        finally:
            for descriptor in descriptors:
                os.close(descriptor)
        self._send({"kind": "forked", "id": request_id, "pid": pid, "identity": identity})

    def _fork(
        self, module: str, directory: object, descriptors: list[int]
    ) -> tuple[int, str | None]:
        """Fork a child for ``module``; return its pid and start identity once it leads its
        own session (the identity is None only if it already died)."""
        settled_reader, settled_writer = os.pipe()
        _flush_standard_streams()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.setsid()
                os.close(settled_writer)  # the zygote may answer now
                os.close(settled_reader)
                code = self._become_child(module, directory, descriptors)
            except SystemExit as exit_:
                code = _exit_code(exit_)
            except BaseException:  # the child reports and ends; it never returns into the loop
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
            finally:
                _flush_standard_streams()
                os._exit(code)
        os.close(settled_writer)
        try:
            os.read(settled_reader, 1)  # end-of-file: the child called setsid (or died)
        finally:
            os.close(settled_reader)
        # Not reaped before this answer is sent, so the pid cannot name another process yet.
        return pid, start_identity(pid)

    def _become_child(self, module: str, directory: object, descriptors: list[int]) -> int:
        """Turn the forked process into ``python -m module --fd 3`` and run it."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.control.close()
        os.close(self.wake_reader)
        os.close(self.wake_writer)
        channel, stdout, stderr = descriptors
        placed = {1: stdout, 2: stderr, CHILD_CHANNEL_FD: channel}
        if self.lifeline is not None:
            placed[CHILD_LIFELINE_FD] = self.lifeline
        _place_descriptors(placed)
        try:
            os.chdir(directory if isinstance(directory, str) else "/")
        except OSError:
            os.chdir("/")
        # `python -m` puts its start directory first on sys.path; the child's is its own.
        if sys.path and sys.path[0] == self.startup_directory:
            sys.path[0] = str(Path.cwd())
        importlib.invalidate_caches()
        entry = importlib.import_module(module)
        argv = ["--fd", str(CHILD_CHANNEL_FD)]
        if self.lifeline is not None:
            argv += ["--lifeline-fd", str(CHILD_LIFELINE_FD)]
        argv += ["--parent-pid", str(self.pid)]
        sys.argv = [str(entry.__file__), *argv]
        name_process(f"{Path(sys.executable).name} -m {module} {' '.join(argv)}")
        try:
            code = int(entry.main(argv))
        except SystemExit as exit_:
            code = _exit_code(exit_)
        except BaseException:  # as the interpreter does: report, then the exit duties
            traceback.print_exc()
            code = 1
        _interpreter_exit_duties()
        return code

    # -- reaping ----------------------------------------------------------------------------

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            report: dict[str, Any] = {"kind": "exited", "pid": pid}
            if code >= 0:
                report["exitCode"] = code
            else:
                report["signal"] = -code
            self._send(report)

    def _send(self, frame: dict[str, Any]) -> None:
        body = canonical.encode(frame)
        self.control.sendall(_HEADER.pack(len(body)) + body)


def preload() -> None:
    """Import every entry module and what they load lazily."""
    for name in (*sorted(ENTRY_MODULES), *_PRELOAD):
        importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m piwf.runner.zygote --fd N [--lifeline-fd L] [--parent-pid P]``."""
    arguments = parse_child_arguments(argv, prog="piwf-zygote")
    # Killed by the kernel when the server ends; a server already gone ends it here. Nothing
    # needs cleaning up first: each forked child has its own lifeline.
    if not prctl.die_with_parent(signal.SIGKILL, arguments.parent_pid):
        return 0
    # Retitled within its own command line only, so /proc/<pid>/environ stays readable for the
    # zygote and its children (tools find a home's processes by PIWF_HOME); the forks inherit
    # that, so a child's title is at most as long as the zygote's command line.
    previous = os.environ.get("SPT_NOENV")
    os.environ["SPT_NOENV"] = "1"
    name_process("piwf zygote")
    if previous is None:
        del os.environ["SPT_NOENV"]
    else:
        os.environ["SPT_NOENV"] = previous
    os.umask(0o077)
    control = socket.socket(fileno=arguments.fd)
    control.setblocking(True)
    preload()
    if threading.active_count() != 1:
        # fork() copies only the calling thread: a thread here would leave locks held.
        print("piwf zygote: an import started a thread; not serving", file=sys.stderr)
        return EXIT_THREADS
    gc.collect()
    gc.freeze()  # children share these pages instead of copying them when the collector runs
    try:
        return Zygote(control, arguments.lifeline_fd).serve()
    except (ZygoteProtocolError, PiwfError) as error:
        print(f"piwf zygote: protocol error: {error}", file=sys.stderr)
        return EXIT_PROTOCOL
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the server went away
    finally:
        control.close()


def _place_descriptors(placed: dict[int, int]) -> None:
    """Give this process exactly ``placed`` (target number: source descriptor) above its
    stdin and close every other descriptor; a source may sit on another's target number."""
    scratch = {
        target: fcntl.fcntl(source, fcntl.F_DUPFD, _SCRATCH_FD) for target, source in placed.items()
    }
    for target, copy in scratch.items():
        os.dup2(copy, target)
    os.closerange(max(placed) + 1, _max_descriptor())


def _interpreter_exit_duties() -> None:
    """What the interpreter does at exit before ``os._exit`` skips it: wait for non-daemon
    threads, run ``atexit`` functions, flush the standard streams."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):
            shutdown()
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    _flush_standard_streams()


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit_code(exit_: SystemExit) -> int:
    """The process exit code the interpreter would give ``exit_``."""
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    with contextlib.suppress(Exception):
        print(exit_.code, file=sys.stderr)
    return 1


def _max_descriptor() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def _ignore_signal(_number: int, _frame: object) -> None:
    return


if __name__ == "__main__":
    sys.exit(main())
