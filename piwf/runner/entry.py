"""What every entry module shares: exit codes, serving the channel, the process title and
working directory.

An entry module (:class:`~piwf.processes.ChildKind`) exposes ``run_child(connection, lifeline)
-> int``; :mod:`piwf.runner.bootstrap` performs the child's first act and then runs it through
:func:`serve_channel`: the server's end of the channel going away is an ordinary ending (nothing
is left to report to), a :class:`~piwf.errors.PiwfError` is reported on stderr (captured,
bounded, never shown to clients) and both end with :data:`EXIT_PROTOCOL`. However it ends,
every process it started is ended before it returns.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from multiprocessing import process as mp_process
from multiprocessing.connection import Connection
from pathlib import Path

from piwf.errors import PiwfError
from piwf.runner.lifeline import Lifeline

EXIT_OK = 0
EXIT_CLAIM_LOST = 3
EXIT_PROTOCOL = 4


def serve_channel(
    connection: Connection,
    life: Lifeline,
    *,
    label: str,
    run_child: Callable[[Connection, Lifeline], int],
) -> int:
    """Run ``run_child`` on the channel, end every remaining descendant, close the channel and
    return the exit code."""
    try:
        return run_child(connection, life)
    except (EOFError, OSError):
        return EXIT_PROTOCOL  # the server went away; nothing to report to
    except PiwfError as error:
        print(f"{label}: {error.code}: {error}", file=sys.stderr)
        return EXIT_PROTOCOL
    finally:
        life.end_descendants()
        connection.close()


def name_process(title: str) -> None:
    """Set the process title ``ps`` shows (best effort)."""
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # pragma: no cover - setproctitle is a dependency
        pass


#: The ``sys.path[0]`` the last :func:`enter_directory` set (None before the first).
_entered_path: str | None = None


def enter_directory(directory: str) -> None:
    """Change to ``directory`` (``/`` when it is not usable), as if the child had been
    started there.

    ``sys.path`` is the server's; its first entry is the directory the server was started in
    (``python -m``). That entry, or the one an earlier call put there, becomes the new working
    directory: a runner enters ``/`` when it starts and its run's project directory once its
    launch names it.
    """
    global _entered_path
    try:
        os.chdir(directory)
    except OSError:
        os.chdir("/")
    here = str(Path.cwd())
    if sys.path and sys.path[0] in (getattr(mp_process, "ORIGINAL_DIR", None), _entered_path):
        sys.path[0] = here
        _entered_path = here


def print_user_traceback(error: BaseException) -> bool:
    """Print the traceback of the user code behind ``error`` to stderr (the child's captured
    log under ``$PIWF_HOME/server/runners/``, private to the user, where the line that raised
    is found; messages sent to clients name only the line): ``error`` itself, or the
    exception it was raised ``from`` when it is a :class:`~piwf.errors.PiwfError` wrapping one.
    Return whether anything was printed."""
    import traceback

    failed = error.__cause__ if isinstance(error, PiwfError) else error
    if failed is None or isinstance(failed, PiwfError):
        return False
    traceback.print_exception(type(failed), failed, failed.__traceback__, file=sys.stderr)
    sys.stderr.flush()
    return True
