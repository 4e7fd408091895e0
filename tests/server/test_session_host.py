"""The chat host of docs/SESSIONS.md, exactly as printed there, run against a real server: it
completes a workflow with two agent steps and a notification through one origin session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from piwf.client import Client
from tests.server.harness import ServerFactory

DOC = Path(__file__).resolve().parents[2] / "docs" / "SESSIONS.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
[HOST] = [block for block in BLOCKS if "A scripted chat host" in block]
[WORKFLOW] = [block for block in BLOCKS if 'name="chat"' in block]


def test_the_documented_chat_host_is_short_and_completes_the_workflow(
    servers: ServerFactory, tmp_path: Path
) -> None:
    assert len(HOST.splitlines()) < 100
    server = servers.start(env={"PIWF_IDLE_EXIT_S": "0"})
    (tmp_path / "chat_host.py").write_text(HOST)
    (tmp_path / "chat.py").write_text(WORKFLOW)
    done = subprocess.run(
        [sys.executable, "chat_host.py"],
        cwd=tmp_path,
        env={**os.environ, "PIWF_HOME": str(server.home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[step] Plan the launch in three steps.",
        "[notification] The plan is in; reviewing it next.",
        "[step] Review this plan: ['write', 'test', 'ship']",
        "[terminal] the run completed",
        "output: {'steps': ['write', 'test', 'ship'], 'verdict': 'looks complete'}",
        "captured plan: 2 entries",
        "captured review: 2 entries",
    ]
    with Client(server.home, autostart=False) as client:
        [session] = [s for s in client.list_sessions() if s.session_id == "chat-demo"]
        assert (session.runs, session.active_run_id, session.pending_messages) == (1, None, 0)
