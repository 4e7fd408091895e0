"""The MCP client configuration that starts ``piwf mcp`` for one agent request.

A headless agent command finds this document at ``PIWF_MCP_CONFIG``; MCP-capable agents take it
as it is (``claude -p --mcp-config "$PIWF_MCP_CONFIG"``)::

    {"mcpServers": {"piwf": {"command": "<this Python>",
                             "args": ["-m", "piwf", "mcp", "--request", "<request id>"],
                             "env": {"PIWF_HOME": "<state home>"}}}}

It names the interpreter piwf runs under (not a ``piwf`` script on ``PATH``, which may be
another install) and carries only the state home: nothing else of the run or the server. This
module imports neither the SDK nor the client, so any process may build the document.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: The server's name in the configuration; its tools reach the model as ``piwf`` tools.
SERVER_NAME = "piwf"


def request_config(request_id: str, *, home: Path, executable: str | None = None) -> dict[str, Any]:
    """Return the ``mcpServers`` document that runs ``piwf mcp --request request_id``."""
    return {
        "mcpServers": {
            SERVER_NAME: {
                "command": executable or sys.executable,
                "args": ["-m", "piwf", "mcp", "--request", request_id],
                "env": {"PIWF_HOME": str(home)},
            }
        }
    }
