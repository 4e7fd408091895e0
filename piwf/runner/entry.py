"""What every child entry point shares: its arguments, exit codes, the lifeline, the title.

A child is started as ``python -m <module> --fd N [--lifeline-fd L] [--parent-pid P]``: N is
its channel to the server, L the read end of the server's lifeline pipe (end-of-file when the
server dies), P the pid that started it (the server, or the zygote that forked it). Its
``main`` is :func:`serve_channel` around its own ``run_child(connection, lifeline)``: the
lifeline begins before anything else (:mod:`piwf.runner.lifeline`), the server's end of the
channel going away is an ordinary ending (nothing is left to report to), a
:class:`~piwf.errors.PiwfError` is reported on stderr (captured, bounded, never shown to
clients) and both end with :data:`EXIT_PROTOCOL`. However it ends, every process it started
is ended before it returns.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection

from piwf.errors import PiwfError
from piwf.runner import lifeline
from piwf.runner.lifeline import Lifeline

EXIT_OK = 0
EXIT_CLAIM_LOST = 3
EXIT_PROTOCOL = 4


def parse_child_arguments(argv: list[str] | None, *, prog: str) -> argparse.Namespace:
    """``--fd N`` (required), ``--lifeline-fd L`` and ``--parent-pid P`` (optional)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--lifeline-fd", type=int, default=None)
    parser.add_argument("--parent-pid", type=int, default=None)
    return parser.parse_args(argv)


def begin_child(arguments: argparse.Namespace) -> Lifeline:
    """The child's first act: tie its life, and its descendants', to the server's."""
    return lifeline.begin(arguments.lifeline_fd, arguments.parent_pid)


def serve_channel(
    argv: list[str] | None,
    *,
    prog: str,
    label: str,
    run_child: Callable[[Connection, Lifeline], int],
) -> int:
    """Parse the arguments, begin the lifeline, run ``run_child`` on the channel, end every
    remaining descendant and return the exit code."""
    arguments = parse_child_arguments(argv, prog=prog)
    life = begin_child(arguments)
    connection = Connection(arguments.fd)
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
