"""The ``piwf`` command line: parse, call the library, render; nothing else lives here.

Exit codes are a protocol: 0 success, 1 runtime error, 2 usage error. Every command accepts
``--json`` and then prints exactly one JSON document on standard output.
"""

from __future__ import annotations

import sys

import click

from piwf._version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="piwf", message="%(prog)s %(version)s")
def cli() -> None:
    """piwf: a local, crash-safe workflow server for Python.

    State lives in $PIWF_HOME (default ~/.piwf).
    """


def main() -> None:
    """Entry point of the ``piwf`` console script."""
    try:
        cli.main(prog_name="piwf", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)
