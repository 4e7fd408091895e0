"""Viewer tests: the Textual app driven by its test pilot against real servers
(tests/server/harness.py), and ``piwf view`` without Textual.

The pilot tests need Textual (the ``piwf[view]`` extra). Without it they skip and say so,
unless ``PIWF_REQUIRE_VIEW=1`` (set by ``tox -e view``), which turns a missing Textual into a
failure so that environment can never pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from tests.server.conftest import server, servers, short_home
from tests.tmux import TmuxTerminal

__all__ = ["require_textual", "server", "servers", "short_home"]

SKIP_REASON = "Textual is not installed: pip install 'piwf[view]' (tox -e view runs these tests)"


def require_textual() -> None:
    """Skip the calling test module without Textual, or fail it when Textual is required."""
    if importlib.util.find_spec("textual") is not None:
        return
    if os.environ.get("PIWF_REQUIRE_VIEW") == "1":
        pytest.fail(f"PIWF_REQUIRE_VIEW=1 but {SKIP_REASON}", pytrace=False)
    pytest.skip(SKIP_REASON, allow_module_level=True)


@pytest.fixture
def terminals() -> Iterator[list[TmuxTerminal]]:
    """Real terminals (tmux sessions) a test opens; each is closed after the test."""
    opened: list[TmuxTerminal] = []
    yield opened
    for terminal in opened:
        terminal.close()
