"""Workflow files: one clear error per broken file, discovery order and source identity."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from piwf.errors import WorkflowLoadError
from piwf.workflow.sources import (
    BUILTIN_DIR,
    SourceDrift,
    SourceIdentity,
    WorkflowOrigin,
    discover_workflows,
    find_workflow,
    load_workflow,
    verify_sources,
)
from tests.server.harness import NOBODY_UID, as_uid

from .conftest import FIXTURES, load_fixture

GOOD = """
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="NAME", start_at="a", nodes={"a": compute(lambda ctx: 1)}, edges=[]
)
"""


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(WorkflowLoadError) as info:
        load_workflow(path)
    message = str(info.value)
    assert str(path) in message
    return message


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", "from piwf.workflow import compute\n\nx = (\n")
    message = load_error(path)
    assert "syntax error at line 3" in message


def test_file_whose_name_does_not_end_in_py_says_to_rename_it(tmp_path: Path) -> None:
    path = write(tmp_path, "flow.txt", GOOD.replace("NAME", "flow"))
    assert load_error(path) == (f"{path}: a workflow file's name ends in .py; rename it to flow.py")


def test_file_without_definition(tmp_path: Path) -> None:
    path = write(tmp_path, "empty.py", "VALUE = 1\n")
    assert "defines no workflow" in load_error(path)


def test_file_with_two_definitions(tmp_path: Path) -> None:
    text = GOOD.replace("NAME", "one") + GOOD.replace("NAME", "two").replace(
        "workflow =", "second ="
    )
    path = write(tmp_path, "two.py", text)
    message = load_error(path)
    assert "defines 2 workflows" in message
    assert "'one'" in message
    assert "'two'" in message


def test_one_definition_bound_to_two_names_counts_once(tmp_path: Path) -> None:
    path = write(tmp_path, "alias.py", GOOD.replace("NAME", "alias") + "alias = workflow\n")
    assert load_workflow(path).definition.name == "alias"


def test_bad_graph_names_file_and_rule(tmp_path: Path) -> None:
    text = GOOD.replace("edges=[]", 'edges=[{"from": "a", "to": "nowhere"}]').replace("NAME", "bad")
    path = write(tmp_path, "bad_graph.py", text)
    message = load_error(path)
    assert "workflow 'bad': edge from 'a' targets unknown node 'nowhere'" in message


def test_import_error_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "imports.py", "import piwf_module_that_does_not_exist\n")
    message = load_error(path)
    assert "import failed at line 1: ModuleNotFoundError" in message


def test_runtime_error_in_module_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "raises.py", "raise RuntimeError('module refuses')\n")
    assert "import failed at line 1: RuntimeError: module refuses" in load_error(path)


def test_a_base_exception_at_import_is_a_load_error_with_its_line(tmp_path: Path) -> None:
    # asyncio.run() at import whose task is cancelled raises CancelledError, a BaseException.
    text = "import asyncio\n\n\nasync def main():\n    raise asyncio.CancelledError()\n\n"
    path = write(tmp_path, "cancelled.py", text + "asyncio.run(main())\n")
    # Before 3.11 the loop raises a new CancelledError for the cancelled task: its traceback in
    # the file starts at the asyncio.run() call, not at the raise.
    line = 5 if sys.version_info >= (3, 11) else 7
    assert load_error(path) == f"{path}: import failed at line {line}: CancelledError"
    path = write(tmp_path, "generator.py", "\nraise GeneratorExit('closed')\n")
    assert load_error(path) == f"{path}: import failed at line 2: GeneratorExit: closed"


def test_an_exception_whose_str_fails_still_names_the_file_and_line(tmp_path: Path) -> None:
    text = "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError\n\n"
    path = write(tmp_path, "odd.py", text + "raise Odd()\n")
    assert load_error(path) == (
        f"{path}: import failed at line 5: Odd: <str() of the exception raised RuntimeError>"
    )


def test_ctrl_c_while_importing_is_not_taken_for_the_files_failure(tmp_path: Path) -> None:
    path = write(tmp_path, "interrupted.py", "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_workflow(path)


def test_import_failure_names_the_line_of_the_file_that_failed(tmp_path: Path) -> None:
    text = "VALUE = 1\n\n\ndef build():\n    return undefined_name\n\n\nbuild()\n"
    path = write(tmp_path, "nested.py", text)
    assert load_error(path) == (
        f"{path}: import failed at line 5: NameError: name 'undefined_name' is not defined"
    )


def test_bad_graph_names_the_line_that_defined_it(tmp_path: Path) -> None:
    text = GOOD.replace("edges=[]", 'edges=[{"from": "a", "to": "nowhere"}]').replace("NAME", "bad")
    path = write(tmp_path, "bad_graph.py", text)
    rows = text.splitlines()
    line = next(number for number, row in enumerate(rows, 1) if "define_workflow(" in row)
    assert load_error(path).endswith(f"targets unknown node 'nowhere' (line {line})")


def test_nul_byte_is_a_syntax_error_without_a_made_up_line(tmp_path: Path) -> None:
    path = tmp_path / "nul.py"
    path.write_bytes(b"VALUE = 1\x00\n")
    message = load_error(path)
    assert "syntax error" in message and "null bytes" in message
    assert "None" not in message


def test_bytes_python_would_not_import_are_refused_with_their_line(tmp_path: Path) -> None:
    # compile() lets a comment that is not UTF-8 pass; an import of the file would not.
    path = tmp_path / "latin.py"
    path.write_bytes(GOOD.replace("NAME", "latin").encode() + b"# caf\xe9\n")
    message = load_error(path)
    line = GOOD.count("\n") + 1
    assert f"syntax error at line {line}: the file is not valid utf-8 there" in message, message
    declared = tmp_path / "declared.py"
    declared.write_bytes(
        b"# -*- coding: latin-1 -*-\n" + GOOD.replace("NAME", "declared").encode() + b"# caf\xe9\n"
    )
    assert load_workflow(declared).definition.name == "declared", "a declared encoding loads"
    unknown = tmp_path / "unknown.py"
    unknown.write_bytes(b"# -*- coding: klingon -*-\n" + GOOD.replace("NAME", "x").encode())
    assert "syntax error: unknown encoding" in load_error(unknown)
    # Python's encoding detection refuses a first or second line that is not UTF-8 with
    # "invalid or missing encoding declaration", naming no line and no fix.
    first = tmp_path / "first.py"
    first.write_bytes(b'x = "\xff\xfe"\n' + GOOD.replace("NAME", "first").encode())
    message = load_error(first)
    assert "syntax error at line 1: the file is not valid utf-8 there; save it as UTF-8" in message


def test_missing_file(tmp_path: Path) -> None:
    assert "cannot read" in load_error(tmp_path / "absent.py")


def as_a_user_without_access(action: Callable[[], str]) -> str:
    """What ``action`` returned (or ``"error: Type: message"``) for a user the closed modes
    apply to: ``nobody`` when the test runs as root, whom they do not stop."""
    if os.geteuid() == 0:
        return as_uid(NOBODY_UID, action)
    try:
        return action()
    except Exception as error:
        return f"error: {type(error).__name__}: {error}"


def test_a_path_this_user_may_not_look_at_is_a_load_error_that_says_what_to_change() -> None:
    # Path.is_file raised a bare PermissionError for a file under a directory closed to this
    # user (the server answered "PermissionError: [Errno 13] ..."), and workflow.list's
    # discovery failed as a state-home I/O error.
    root = Path(tempfile.mkdtemp(prefix="piwf-closed-", dir="/tmp"))  # nobody reaches /tmp
    closed = root / "closed"
    listing = root / "project" / ".piwf" / "workflows"
    try:
        root.chmod(0o755)
        write(closed, "hidden.py", GOOD.replace("NAME", "hidden"))
        write(listing, "mine.py", GOOD.replace("NAME", "mine"))
        (root / "project").chmod(0o755)
        (root / "project" / ".piwf").chmod(0o755)
        closed.chmod(0o000)
        listing.chmod(0o000)
        project, home = root / "project", root / "home"
        advice = "Permission denied; let the user the server runs as read it"

        by_path = as_a_user_without_access(lambda: str(find_workflow(str(closed / "hidden.py"))))
        assert by_path == (
            f"error: WorkflowLoadError: {closed / 'hidden.py'}: cannot look at it: {advice}"
            " (and search every directory on its path)"
        ), by_path
        listed = as_a_user_without_access(lambda: str(discover_workflows(project, home)))
        assert listed.startswith(
            f"error: WorkflowLoadError: {listing}: cannot list workflows in it: {advice}"
        ), listed
        by_name = as_a_user_without_access(lambda: str(find_workflow("noop", project, home)))
        assert by_name.startswith(
            f"error: WorkflowLoadError: {listing / 'noop.py'}: cannot look at it: {advice}"
        ), by_name
    finally:
        closed.chmod(0o700)
        listing.chmod(0o700)
        shutil.rmtree(root)


def test_missing_include_names_including_file(tmp_path: Path) -> None:
    text = """
from piwf.workflow import compute, define_workflow, include

workflow = define_workflow(
    name="parent", start_at="child", includes={"child": include("./gone.py")},
    nodes={"end": compute(lambda ctx: 1)}, edges=[{"from": "child.out", "to": "end"}],
)
"""
    path = write(tmp_path, "parent.py", text)
    message = load_error(path)
    assert "include './gone.py' does not exist" in message


def test_source_cycle_is_rejected(tmp_path: Path) -> None:
    template = """
from piwf.workflow import compute, define_workflow, include

workflow = define_workflow(
    name="NAME", start_at="other", includes={"other": include("./OTHER.py")},
    nodes={"end": compute(lambda ctx: 1)}, edges=[{"from": "other.out", "to": "end"}],
    exits={"out": {"from": "end"}},
)
"""
    first = write(
        tmp_path, "first.py", template.replace("NAME", "first").replace("OTHER", "second")
    )
    write(tmp_path, "second.py", template.replace("NAME", "second").replace("OTHER", "first"))
    message = load_error(first)
    assert "include cycle" in message
    assert "workflow 'first'" in message
    assert "workflow 'second'" in message


def test_loader_does_not_touch_sys_path(tmp_path: Path) -> None:
    before = list(sys.path)
    load_workflow(write(tmp_path, "plain.py", GOOD.replace("NAME", "plain")))
    assert sys.path == before


def test_source_identity_records_root_and_every_mounted_file() -> None:
    loaded = load_fixture("composition")
    sources = loaded.sources
    root = FIXTURES / "composition.py"
    assert sources.root.location == str(root)
    assert sources.root.sha256 == hashlib.sha256(root.read_bytes()).hexdigest()
    # One entry per mount, by mount path; workspace.py is mounted twice, one file.
    assert [(item.mount_path, item.reference, item.location) for item in sources.mounted] == [
        ("docs", "./docs.py", str(FIXTURES / "docs.py")),
        ("docs/workspace", "./workspace.py", str(FIXTURES / "workspace.py")),
        ("workspace", "./workspace.py", str(FIXTURES / "workspace.py")),
    ]
    assert [item.location for item in sources.files()] == [
        str(root),
        str(FIXTURES / "docs.py"),
        str(FIXTURES / "workspace.py"),
    ]
    for item in sources.mounted:
        assert item.sha256 == hashlib.sha256(Path(item.location).read_bytes()).hexdigest()
    assert SourceIdentity.from_json(sources.to_json()) == sources
    assert verify_sources(sources) == SourceDrift()


def test_verify_sources_reports_a_changed_mounted_file(tmp_path: Path) -> None:
    for name in ("composition", "docs", "workspace"):
        write(tmp_path, f"{name}.py", (FIXTURES / f"{name}.py").read_text())
    loaded = load_workflow(tmp_path / "composition.py")
    assert verify_sources(loaded.sources) == SourceDrift()
    (tmp_path / "workspace.py").write_text((FIXTURES / "workspace.py").read_text() + "\n# edit\n")
    workspace = str((tmp_path / "workspace.py").resolve())
    assert verify_sources(loaded.sources) == SourceDrift(changed=(workspace,))
    (tmp_path / "docs.py").unlink()
    docs = str((tmp_path / "docs.py").resolve())
    drift = verify_sources(loaded.sources)
    assert drift == SourceDrift(changed=(workspace,), missing=(docs,)), "a deleted file is missing"
    assert drift.describe() == f"changed: {workspace}; missing: {docs}"
    write(tmp_path, "docs.py", (FIXTURES / "docs.py").read_text())
    reloaded = load_workflow(tmp_path / "composition.py")
    assert reloaded.sources != loaded.sources
    assert reloaded.compiled.digest == loaded.compiled.digest


def test_discovery_order_project_then_home_then_builtins(tmp_path: Path) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    write(project / ".piwf" / "workflows", "shared.py", GOOD.replace("NAME", "project_one"))
    write(project / ".piwf" / "workflows", "_private.py", GOOD.replace("NAME", "hidden"))
    write(home / "workflows", "shared.py", GOOD.replace("NAME", "home_one"))
    write(home / "workflows", "mine.py", GOOD.replace("NAME", "mine"))
    write(home / "workflows", "noop.py", GOOD.replace("NAME", "home_noop"))
    found = {item.name: item for item in discover_workflows(project, home)}
    assert found["shared"].origin is WorkflowOrigin.PROJECT
    assert found["mine"].origin is WorkflowOrigin.HOME
    assert found["noop"].origin is WorkflowOrigin.HOME
    assert "_private" not in found
    assert load_workflow(found["shared"].path).definition.name == "project_one"
    builtin = {item.name: item for item in discover_workflows(None, tmp_path / "nothing")}
    assert builtin["noop"].origin is WorkflowOrigin.BUILTIN


def test_find_workflow_by_name_or_path(tmp_path: Path) -> None:
    noop = find_workflow("noop", None, tmp_path)
    assert noop.path == BUILTIN_DIR / "noop.py"
    loaded = load_workflow(noop.path)
    assert loaded.sources.root.location == "builtin:noop"
    assert verify_sources(loaded.sources) == SourceDrift()
    path = write(tmp_path, "direct.py", GOOD.replace("NAME", "direct"))
    assert find_workflow(str(path)).origin is WorkflowOrigin.PATH
    assert find_workflow("direct.py", tmp_path).path == path
    with pytest.raises(WorkflowLoadError, match="no workflow named 'missing'") as missing:
        find_workflow("missing", tmp_path, tmp_path)
    # What to do next: a path, or the file where discovery looks.
    assert str(missing.value).endswith(
        "; give the workflow's file path instead, or put missing.py in one of those "
        "directories (piwf workflows list shows the names found)"
    )


def test_home_defaults_to_piwf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIWF_HOME", str(tmp_path))
    write(tmp_path / "workflows", "fromenv.py", GOOD.replace("NAME", "fromenv"))
    assert find_workflow("fromenv").origin is WorkflowOrigin.HOME
