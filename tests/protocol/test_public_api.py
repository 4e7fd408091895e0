"""piwf.protocol exports a small, sorted, importable surface with no I/O in it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import piwf.protocol
from piwf.errors import PiwfError

PROTOCOL_DIR = Path(piwf.protocol.__file__).parent
IO_MODULES = {"socket", "selectors", "threading", "asyncio", "multiprocessing", "subprocess"}


def _ruff_order(name: str) -> tuple[int, str]:
    # ruff RUF022 ("isort-style"): SCREAMING_CASE, then CamelCase, then the rest.
    if name.isupper():
        return 0, name
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted_unique_and_importable() -> None:
    names = piwf.protocol.__all__
    assert names == sorted(names, key=_ruff_order)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(piwf.protocol, name), name


def test_exported_errors_belong_to_the_piwf_tree_with_distinct_codes() -> None:
    errors = [
        value
        for value in (getattr(piwf.protocol, name) for name in piwf.protocol.__all__)
        if isinstance(value, type) and issubclass(value, BaseException)
    ]
    assert errors
    assert all(issubclass(error, PiwfError) for error in errors)
    assert len({error.code for error in errors}) == len(errors)


def test_protocol_package_does_no_io() -> None:
    for module in PROTOCOL_DIR.glob("*.py"):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not imported & IO_MODULES, f"{module.name} imports {imported & IO_MODULES}"


def test_the_frame_codec_and_the_operations_load_without_the_message_models() -> None:
    # The package's names load on first use, so a quick reader of frames (run list's quick
    # path) imports no pydantic; asking for a model's name then loads it.
    probe = (
        "import sys\n"
        "from piwf.protocol.framing import FrameDecoder\n"
        "from piwf.protocol.operations import SCHEMA\n"
        "before = 'pydantic' in sys.modules\n"
        "from piwf.protocol import Hello\n"
        "print(before, 'pydantic' in sys.modules, Hello.__module__, SCHEMA)\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert finished.stdout.split() == ["False", "True", "piwf.protocol.client_v1", "piwf.client.v1"]
