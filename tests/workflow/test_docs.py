"""Every python block of docs/WORKFLOWS.md runs as written, from the repository root."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import REPO

DOC = REPO / "docs" / "WORKFLOWS.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_guide_has_examples() -> None:
    assert len(BLOCKS) >= 10


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PIWF_HOME", str(tmp_path))
    source = BLOCKS[index]
    path = tmp_path / f"example_{index}.py"
    path.write_text(source)
    namespace = {"__name__": f"docs_example_{index}", "__file__": str(path)}
    exec(compile(source, str(path), "exec", dont_inherit=True), namespace)
