"""A child's first act, before any workflow, manager or import-time user code, then its entry.

The server starts every child as a ``multiprocessing`` process (forked by the fork server, or
spawned) whose target is :func:`piwf.processes.enter_child`, which calls :func:`main` here. By
then the standard library has only unpickled the preparation data and the ``Process`` object
(plain values and connections) and imported this module. :func:`main` then, in this order::

    own process group            stop and kill reach every process it starts with one signal
                                 to the group; in the fork server's session, which all forked
                                 children share (:mod:`piwf.runner.children_session`), or, when
                                 spawned, in a session of its own
    stdout/stderr                onto the capture pipes the supervisor reads (descriptors 1, 2)
    inherited descriptors        a forked child closes every one it was not given on purpose
                                 (the fork server's "alive" pipe among them, so the fork server
                                 ends the moment the server does, not with its last child)
    environment                  the children's variables (fault injection: PIWF_CHILD_FAULTS
                                 becomes PIWF_FAULTS), faults re-armed, umask 0077
    lifeline                     watches multiprocessing.parent_process().sentinel: end-of-file
                                 when the server (not the fork server) is gone
    title, directory, argv       ``piwf runner (starting)`` …; the directory it was given (a
                                 workflow runner gets ``/`` and enters its run's project
                                 directory once its launch comes); ``sys.argv`` as
                                 ``[entry module file, "--fd", channel]``
    entry                        ``run_child(channel, lifeline)`` of the :class:`ChildKind`
                                 module, through :func:`~piwf.runner.entry.serve_channel`

The entry's exit code becomes the process's through ``os._exit`` once stdout and stderr are
flushed (:func:`end_process`; ``multiprocessing`` reports it as ``Process.exitcode``), so a
thread the workflow code left running cannot keep the child alive. Nothing here imports the
server or SQLite.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from multiprocessing import forkserver, resource_tracker
from multiprocessing.connection import Connection
from typing import NoReturn

from piwf import faults
from piwf.processes import ChildKind
from piwf.runner import lifeline
from piwf.runner.entry import enter_directory, name_process, serve_channel

#: The title and the error label of each kind of child (its module may refine the title).
_NAMES: dict[ChildKind, tuple[str, str]] = {
    # A workflow runner waits for its launch (it may be started as a spare, before its run is
    # known), then names its run in its title.
    ChildKind.WORKFLOW_RUNNER: ("piwf runner (starting)", "piwf runner"),
    ChildKind.RESOURCE_RUNNER: ("piwf reconcile", "piwf resource runner"),
    ChildKind.RESOLVER: ("piwf resolver", "piwf resolver"),
    ChildKind.VALIDATOR: ("piwf validator", "piwf validator"),
    ChildKind.CHANNEL_ADAPTER: ("piwf channel", "piwf channel adapter"),
}


def main(
    kind: str,
    channel: Connection,
    stdout: Connection,
    stderr: Connection,
    directory: str,
    environment: dict[str, str | None],
) -> NoReturn:
    """Become a supervised child of kind ``kind`` and run it; never returns.

    Ends the process with the entry's exit code (see :mod:`piwf.runner.entry`) through
    :func:`end_process`; an unknown ``kind`` is refused before anything of a child runs.
    """
    entry = ChildKind(kind)
    enter_own_group()
    _capture_output(stdout, stderr)
    parent = multiprocessing.parent_process()
    sentinel = parent.sentinel if parent is not None else None
    _close_inherited_descriptors({channel.fileno(), *([] if sentinel is None else [sentinel])})
    _apply_environment(environment)
    os.umask(0o077)
    life = lifeline.begin(sentinel, None)
    title, label = _NAMES[entry]
    name_process(title)
    enter_directory(directory)
    module = importlib.import_module(entry.value)
    sys.argv = [str(module.__file__), "--fd", str(channel.fileno())]
    code = serve_channel(channel, life, label=label, run_child=module.run_child)
    end_process(code)


def end_process(code: int) -> NoReturn:
    """End this child now with exit ``code``, once its output is flushed.

    Not through ``SystemExit``: ``multiprocessing`` would then join every non-daemon thread
    the workflow code started (at import, or in a node), and a thread that never ends would keep
    the child, and so a runner slot, taken after its run ended. Nothing of the child outlives
    its entry: :func:`~piwf.runner.entry.serve_channel` has already ended the processes it
    started.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed or broken capture pipe: nothing to save
            pass
    os._exit(code)


def enter_own_group() -> None:
    """Lead a new process group: in the session of the fork server that forked this child when
    that fork server leads one (the children's shared session), else in a new session."""
    if forkserver.get_inherited_fds() is not None and os.getsid(0) == os.getppid():
        os.setpgid(0, 0)
    else:
        os.setsid()


def _capture_output(stdout: Connection, stderr: Connection) -> None:
    """Put the capture pipes on descriptors 1 and 2 (inherited by what the child starts)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os.dup2(stdout.fileno(), 1)
    os.dup2(stderr.fileno(), 2)
    stdout.close()
    stderr.close()


def _close_inherited_descriptors(keep: set[int]) -> None:
    """In a child of the fork server, close every descriptor but 0-2, ``keep`` and the
    resource tracker's pipe.

    The fork server hands each child a copy of its "alive" pipe, whose end-of-file is how the
    fork server learns that its server is gone; a child holding it would keep the fork server
    running after the server's death until the child itself ended. A spawned child got from
    ``exec`` only what the standard library passed on purpose, among them the write end of the
    pipe that is the server's ``Process.sentinel``: it must stay open, so nothing is closed.
    """
    if forkserver.get_inherited_fds() is None:
        return
    tracker = resource_tracker.getfd()
    kept = sorted({0, 1, 2, *keep, *([] if tracker is None else [tracker])})
    for low, high in zip(kept, [*kept[1:], _descriptor_limit()], strict=True):
        if high > low + 1:
            os.closerange(low + 1, high)


def _apply_environment(environment: dict[str, str | None]) -> None:
    """Set (or, for ``None``, remove) each variable, then arm the fault points it names: a
    forked child inherited the fork server's environment and armed points."""
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    faults.arm(os.environ.get("PIWF_FAULTS", ""))


def _descriptor_limit() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536
