"""``piwf mcp`` without the MCP SDK: exit 1 with the install line, as text or as JSON.

The SDK is hidden from a child interpreter (``sys.modules['mcp'] = None`` makes every import of
it fail, as in an install without the extra), so this runs whether or not the extra is
installed here; where it really is missing, the installed script is checked as well.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

MESSAGE = "piwf mcp needs the MCP SDK: pip install 'piwf[mcp]'"
WITHOUT_SDK = "import sys; sys.modules['mcp'] = None; from piwf.cli import main; main(sys.argv[1:])"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL
    )


def test_without_the_sdk_piwf_mcp_exits_1_naming_the_extra(tmp_path: Path) -> None:
    plain = run(sys.executable, "-c", WITHOUT_SDK, "mcp")
    assert (plain.returncode, plain.stdout) == (1, "")
    assert plain.stderr == f"Error: {MESSAGE}\n"
    as_json = run(sys.executable, "-c", WITHOUT_SDK, "mcp", "--request", "request-1", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == {"error": {"code": "missingExtra", "message": MESSAGE}}


def test_a_malformed_request_id_is_a_usage_error() -> None:
    result = run(sys.executable, "-c", WITHOUT_SDK, "mcp", "--request", "has space")
    assert result.returncode == 2 and "a request id is 1 to 256 printable" in result.stderr


def test_an_id_of_another_kind_is_a_usage_error_before_anything_is_served() -> None:
    """A run id bound as the request would fail only at the model's first submit."""
    result = run(sys.executable, "-c", WITHOUT_SDK, "mcp", "--request", "run-0b9c", "--json")
    assert result.returncode == 2, result.stderr
    message = json.loads(result.stdout)["error"]["message"]
    assert "'run-0b9c' is not a request id: request ids start with request-" in message


@pytest.mark.skipif(importlib.util.find_spec("mcp") is not None, reason="the MCP SDK is installed")
def test_the_installed_script_without_the_extra() -> None:
    result = run(str(Path(sys.executable).parent / "piwf"), "mcp")
    assert result.returncode == 1 and MESSAGE in result.stderr
