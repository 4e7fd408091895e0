"""``include("name")`` and ``include("builtin:NAME")``: discovery order, errors, cycles, and
the recorded identity a runner loads back without discovering again."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

import piwf
from piwf.errors import WorkflowDefinitionError, WorkflowLoadError
from piwf.runner.verified_sources import SourcesChanged, load_verified_workflow
from piwf.workflow import include
from piwf.workflow.memory import run_in_memory
from piwf.workflow.sources import (
    BUILTIN_DIR,
    MountSource,
    ReferenceKind,
    SourceDrift,
    SourceIdentity,
    load_recorded_workflow,
    load_workflow,
    names_still_resolve,
    resolve_workflow,
    verify_sources,
)

#: A child that answers ``who`` through its exit ``done``.
CHILD = """
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="child", start_at="say", nodes={{"say": compute(lambda ctx: {who!r})}},
    edges=[], exits={{"done": {{"from": "say"}}}},
)
"""

#: A parent that mounts ``reference`` as ``part`` and returns what it said.
PARENT = """
from piwf.workflow import compute, define_workflow, include

workflow = define_workflow(
    name={name!r}, start_at="part", includes={{"part": include({reference!r})}},
    nodes={{"said": compute(lambda ctx: ctx.outputs["part"]["output"])}},
    edges=[{{"from": "part.done", "to": "said"}}], exits={{"done": {{"from": "said"}}}},
)
"""

#: A workflow whose last step is the mount ``echo`` of ``reference`` (noop has no exits).
USES_NOOP = """
from piwf.workflow import compute, define_workflow, include

workflow = define_workflow(
    name="uses_noop", start_at="first", includes={{"echo": include({reference!r})}},
    nodes={{"first": compute(lambda ctx: 1)}}, edges=[{{"from": "first", "to": "echo"}}],
)
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path.resolve()


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """An empty project and state home."""
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    return project, home


def project_file(project: Path, name: str) -> Path:
    return project / ".piwf" / "workflows" / f"{name}.py"


def home_file(home: Path, name: str) -> Path:
    return home / "workflows" / f"{name}.py"


def said(path: Path, project: Path | None, home: Path) -> object:
    loaded = load_workflow(path, project=project, home=home)
    result, _ = run_in_memory(loaded.compiled, None)
    return result.output


def test_a_name_is_found_in_the_project_the_home_or_the_built_ins(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    project, home = places
    parent = write(tmp_path / "parent.py", PARENT.format(name="parent", reference="child"))
    with pytest.raises(WorkflowLoadError, match="no workflow named 'child'"):
        load_workflow(parent, project=project, home=home)
    home_child = write(home_file(home, "child"), CHILD.format(who="home"))
    assert said(parent, project, home) == "home"
    project_child = write(project_file(project, "child"), CHILD.format(who="project"))
    assert said(parent, project, home) == "project", "the project hides the home"
    assert said(parent, None, home) == "home", "no project: its directory is not searched"
    (mount,) = load_workflow(parent, project=project, home=home).sources.mounted
    assert (mount.mount_path, mount.kind, mount.reference) == ("part", ReferenceKind.NAME, "child")
    assert mount.location == str(project_child)
    assert mount.sha256 == hashlib.sha256(project_child.read_bytes()).hexdigest()
    assert mount.piwf_version is None
    assert home_child.exists()

    uses_noop = write(
        tmp_path / "uses_noop.py",
        USES_NOOP.format(reference="noop"),
    )
    (builtin,) = load_workflow(uses_noop, project=project, home=home).sources.mounted
    assert (builtin.kind, builtin.location) == (ReferenceKind.NAME, "builtin:noop")
    assert builtin.piwf_version == piwf.__version__
    write(home_file(home, "noop"), CHILD.format(who="home noop"))
    (shadowed,) = load_workflow(uses_noop, project=project, home=home).sources.mounted
    assert shadowed.location == str(home_file(home, "noop").resolve()), "the home hides a built-in"


def test_builtin_prefix_names_a_built_in_whatever_the_home_holds(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    project, home = places
    write(home_file(home, "noop"), CHILD.format(who="home noop"))
    parent = write(
        tmp_path / "parent.py",
        """
        from piwf.workflow import compute, define_workflow, include

        workflow = define_workflow(
            name="parent", start_at="first",
            includes={"echo": include("builtin:noop", input=lambda ctx: ctx.outputs["first"])},
            nodes={"first": compute(lambda ctx: "hi")}, edges=[{"from": "first", "to": "echo"}],
        )
        """,
    )
    loaded = load_workflow(parent, project=project, home=home)
    (mount,) = loaded.sources.mounted
    assert (mount.kind, mount.reference, mount.location) == (
        ReferenceKind.BUILTIN,
        "builtin:noop",
        "builtin:noop",
    )
    assert mount.sha256 == hashlib.sha256((BUILTIN_DIR / "noop.py").read_bytes()).hexdigest()
    assert mount.piwf_version == piwf.__version__
    result, _ = run_in_memory(loaded.compiled, None)
    assert result.output == {"input": "hi"}

    missing = write(tmp_path / "missing.py", PARENT.format(name="m", reference="builtin:nope"))
    with pytest.raises(WorkflowLoadError) as refused:
        load_workflow(missing, project=project, home=home)
    assert str(missing) in str(refused.value)
    assert "no built-in workflow named 'nope' (built-ins: " in str(refused.value)
    assert "noop" in str(refused.value)


@pytest.mark.parametrize("reference", ["builtin:", "builtin:a b", "builtin:-x"])
def test_a_malformed_builtin_reference_is_refused_by_include(reference: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match="'builtin:NAME'"):
        include(reference)


def test_an_unknown_name_names_the_name_the_file_and_every_directory_searched(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    project, home = places
    parent = write(tmp_path / "parent.py", PARENT.format(name="parent", reference="ghost"))
    with pytest.raises(WorkflowLoadError) as refused:
        load_workflow(parent, project=project, home=home)
    message = str(refused.value)
    assert message.startswith(f"{parent}: include 'ghost': no workflow named 'ghost' (searched ")
    for directory in (project / ".piwf" / "workflows", home / "workflows", BUILTIN_DIR):
        assert str(directory) in message
    write(project_file(project, "_ghost"), CHILD.format(who="hidden"))
    hidden = write(tmp_path / "hidden.py", PARENT.format(name="hidden", reference="_ghost"))
    with pytest.raises(WorkflowLoadError, match="no workflow named '_ghost'"):
        load_workflow(hidden, project=project, home=home)


def test_a_cycle_through_names_is_refused_like_a_path_cycle(places: tuple[Path, Path]) -> None:
    project, home = places
    first = write(project_file(project, "first"), PARENT.format(name="first", reference="second"))
    write(home_file(home, "second"), PARENT.format(name="second", reference="first"))
    with pytest.raises(WorkflowLoadError) as refused:
        load_workflow(first, project=project, home=home)
    message = str(refused.value)
    assert "include cycle" in message
    assert "workflow 'first'" in message and "workflow 'second'" in message
    itself = write(
        project_file(project, "itself"), PARENT.format(name="itself", reference="itself")
    )
    with pytest.raises(WorkflowLoadError, match="include cycle"):
        resolve_workflow("itself", project, home)
    mixed = write(project_file(project, "mixed"), PARENT.format(name="mixed", reference="./m2.py"))
    write(project_file(project, "m2"), PARENT.format(name="m2", reference="mixed"))
    with pytest.raises(WorkflowLoadError, match="include cycle"):
        load_workflow(mixed, project=project, home=home)
    assert itself.exists()


def test_resolve_workflow_records_how_the_root_was_named(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    project, home = places
    root = write(project_file(project, "parent"), PARENT.format(name="parent", reference="child"))
    write(home_file(home, "child"), CHILD.format(who="home"))
    by_name = resolve_workflow("parent", project, home).sources.root
    assert (by_name.mount_path, by_name.kind, by_name.reference, by_name.location) == (
        "",
        ReferenceKind.NAME,
        "parent",
        str(root),
    )
    by_path = resolve_workflow(str(root), project, home).sources.root
    assert (by_path.kind, by_path.reference) == (ReferenceKind.PATH, str(root))
    builtin = resolve_workflow("builtin:noop", project, home).sources.root
    assert (builtin.kind, builtin.location, builtin.piwf_version) == (
        ReferenceKind.BUILTIN,
        "builtin:noop",
        piwf.__version__,
    )
    with pytest.raises(WorkflowLoadError, match="no built-in workflow named 'parent'"):
        resolve_workflow("builtin:parent", project, home)


def test_a_recorded_identity_loads_the_recorded_file_after_a_new_one_shadows_its_name(
    places: tuple[Path, Path],
) -> None:
    project, home = places
    write(project_file(project, "parent"), PARENT.format(name="parent", reference="child"))
    home_child = write(home_file(home, "child"), CHILD.format(who="home"))
    recorded = resolve_workflow("parent", project, home)
    assert names_still_resolve(recorded.sources, project, home)

    write(project_file(project, "child"), CHILD.format(who="project"))
    assert not names_still_resolve(recorded.sources, project, home)
    assert verify_sources(recorded.sources) == SourceDrift(), "no recorded file changed"
    again = load_recorded_workflow(recorded.sources)
    assert again.sources == recorded.sources
    assert again.sources.mounted[0].location == str(home_child)
    result, _ = run_in_memory(again.compiled, None)
    assert result.output == "home"
    # The runner's entry point agrees: the recorded code runs, nothing is "changed".
    identity_json = recorded.sources.to_json()
    loaded = load_verified_workflow(identity_json, recorded.compiled.digest)
    assert not isinstance(loaded, SourcesChanged)
    assert loaded.sources.mounted[0].location == str(home_child)
    assert resolve_workflow("parent", project, home).sources != recorded.sources

    home_child.write_text(home_child.read_text() + "# edited\n")
    changed = load_verified_workflow(identity_json, recorded.compiled.digest)
    assert changed == SourcesChanged(SourceDrift(changed=(str(home_child),)))


def test_a_record_without_the_name_is_refused_not_discovered(
    places: tuple[Path, Path],
) -> None:
    project, home = places
    write(project_file(project, "parent"), PARENT.format(name="parent", reference="child"))
    write(home_file(home, "child"), CHILD.format(who="home"))
    recorded = resolve_workflow("parent", project, home).sources
    (mount,) = recorded.mounted
    renamed = MountSource(
        mount.mount_path, ReferenceKind.NAME, "other", mount.location, mount.sha256
    )
    with pytest.raises(WorkflowLoadError, match="recorded sources hold no file for 'child'"):
        load_recorded_workflow(SourceIdentity(recorded.root, (renamed,)))


def test_the_identity_round_trips_through_json_and_refuses_other_shapes(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    project, home = places
    parent = write(
        tmp_path / "parent.py",
        USES_NOOP.format(reference="builtin:noop"),
    )
    identity = load_workflow(parent, project=project, home=home).sources
    document = identity.to_json()
    assert document["mounted"] == [
        {
            "mountPath": "echo",
            "referenceKind": "builtin",
            "reference": "builtin:noop",
            "location": "builtin:noop",
            "sha256": identity.mounted[0].sha256,
            "piwfVersion": piwf.__version__,
        }
    ]
    assert SourceIdentity.from_json(document) == identity
    other_version = MountSource(**{**vars(identity.mounted[0]), "piwf_version": "9.9.9"})
    assert other_version == identity.mounted[0], "the version is not compared"
    root = document["root"]
    assert isinstance(root, dict)
    for broken in (
        {"root": {**root, "mountPath": "x"}, "mounted": []},
        {"root": root, "mounted": [root]},
        {"root": {**root, "sha256": "short"}, "mounted": []},
        {"root": {**root, "referenceKind": "guess"}, "mounted": []},
        {"root": {"location": root["location"], "sha256": root["sha256"]}, "mounted": []},
    ):
        with pytest.raises(ValueError):
            SourceIdentity.from_json(broken)  # type: ignore[arg-type]
