"""What every child entry point shares: exit codes, the ``--fd N`` channel, the process title.

A child's ``main`` is :func:`serve_channel` around its own ``run_child(connection)``: the
server's end of the channel going away is an ordinary ending (nothing is left to report to), a
:class:`~piwf.errors.PiwfError` is reported on stderr (captured, bounded, never shown to clients)
and both end with :data:`EXIT_PROTOCOL`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection

from piwf.errors import PiwfError

EXIT_OK = 0
EXIT_CLAIM_LOST = 3
EXIT_PROTOCOL = 4


def serve_channel(
    argv: list[str] | None, *, prog: str, label: str, run_child: Callable[[Connection], int]
) -> int:
    """Parse ``--fd N``, run ``run_child`` on that channel and return the exit code."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--fd", type=int, required=True)
    arguments = parser.parse_args(argv)
    connection = Connection(arguments.fd)
    try:
        return run_child(connection)
    except (EOFError, OSError):
        return EXIT_PROTOCOL  # the server went away; nothing to report to
    except PiwfError as error:
        print(f"{label}: {error.code}: {error}", file=sys.stderr)
        return EXIT_PROTOCOL
    finally:
        connection.close()


def name_process(title: str) -> None:
    """Set the process title ``ps`` shows (best effort)."""
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # pragma: no cover - setproctitle is a dependency
        pass
