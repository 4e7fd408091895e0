"""MCP tests: a real server (tests/server/harness.py) and real ``piwf mcp`` subprocesses.

The tests that speak MCP need the SDK (the ``piwf[mcp]`` extra). Without it they skip and say
so, unless ``PIWF_REQUIRE_MCP=1`` (set by ``tox -e mcp``), which turns a missing SDK into a
failure so that environment can never pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.server.conftest import servers, short_home
from tests.server.test_execution import fast_server

__all__ = ["fast_server", "require_sdk", "servers", "short_home"]

SKIP_REASON = "the MCP SDK is not installed: pip install 'piwf[mcp]' (tox -e mcp runs these tests)"


def require_sdk() -> None:
    """Skip the calling test module without the SDK, or fail it when the SDK is required."""
    if importlib.util.find_spec("mcp") is not None:
        return
    if os.environ.get("PIWF_REQUIRE_MCP") == "1":
        pytest.fail(f"PIWF_REQUIRE_MCP=1 but {SKIP_REASON}", pytrace=False)
    pytest.skip(SKIP_REASON, allow_module_level=True)
