"""Packaging and the public surface (the import rules are in ``test_import_rules.py``)."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
import typing
from pathlib import Path

import piwf
from piwf import errors

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


def test_every_error_a_client_call_names_is_importable_from_piwf() -> None:
    # A user catches what Client documents it raises with `from piwf import ...`; the package
    # docstring calls everything else internal. InvalidArgumentError, the commonest client-side
    # error, was missing.

    named = {
        name
        for source in (PACKAGE / "client").glob("*.py")
        for name in re.findall(r"piwf\.errors\.([A-Z]\w+Error)\b", source.read_text())
    }
    raised = {
        name
        for source in (PACKAGE / "client").glob("*.py")
        for name in re.findall(r"raise ([A-Z]\w+Error)\(", source.read_text())
        if hasattr(errors, name)
    }
    assert named and raised
    assert sorted((named | raised) - set(piwf.__all__)) == []


def test_every_error_class_is_exported_from_piwf_errors_under_that_module_name() -> None:
    # A failure records its error's ``module.qualname`` and a retry policy's snapshot names the
    # classes it retries on that way, so the branch module a class is declared in (piwf/errors/)
    # must never show: each is re-exported from piwf.errors and named there.
    declared = {
        value
        for info in pkgutil.iter_modules(errors.__path__, "piwf.errors.")
        for value in vars(importlib.import_module(info.name)).values()
        if isinstance(value, type) and issubclass(value, errors.PiwfError)
    }
    assert len(declared) > 70
    assert {getattr(errors, name) for name in errors.__all__} >= declared
    assert sorted(error.__name__ for error in declared if error.__module__ != "piwf.errors") == []
    for error in declared:  # annotations resolve where the class says it lives
        assert typing.get_type_hints(error)["code"] == typing.ClassVar[str]
    assert errors.__all__ == sorted(errors.__all__, key=lambda name: (not name.isupper(), name))
