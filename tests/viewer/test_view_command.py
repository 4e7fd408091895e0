"""``piwf view`` without Textual: exit 1 with the install line, as text or as JSON.

Textual is made unimportable in a child interpreter by a directory on ``PYTHONPATH`` holding a
``textual/__init__.py`` that raises ImportError (as a broken or missing install would), so this
runs whether or not the extra is installed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from piwf.cli.view import MISSING_TEXTUAL

HINT = "piwf view needs the view extra: pip install 'piwf[view]'"


def without_textual(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    shadow = tmp_path / "shadow" / "textual"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text("raise ImportError('textual is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": str(shadow.parent), "PIWF_HOME": str(tmp_path / "home")}
    return subprocess.run(
        [sys.executable, "-m", "piwf", "view", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def test_without_textual_piwf_view_prints_the_install_hint_and_exits_1(tmp_path: Path) -> None:
    assert MISSING_TEXTUAL.startswith(HINT) and "piwf run show RUN --follow" in MISSING_TEXTUAL
    plain = without_textual(tmp_path)
    assert (plain.returncode, plain.stdout) == (1, "")
    assert plain.stderr == f"Error: {MISSING_TEXTUAL}\n"
    as_json = without_textual(tmp_path, "run-1", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == {
        "error": {"code": "missingExtra", "message": MISSING_TEXTUAL}
    }
    assert not (tmp_path / "home").exists(), "nothing was started or written"
