"""Packaging and the public surface (the import rules are in ``test_import_rules.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import piwf

PACKAGE = Path(piwf.__file__).parent


def test_version_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "piwf", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"piwf {piwf.__version__}"


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "piwf"
    assert script.exists(), "install piwf (pip install .) so the `piwf` script exists"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"piwf {piwf.__version__}"


def test_public_api_is_sorted_and_importable() -> None:
    assert piwf.__all__ == sorted(piwf.__all__)
    for name in piwf.__all__:
        assert hasattr(piwf, name), name


def test_package_is_typed() -> None:
    assert (PACKAGE / "py.typed").exists()
