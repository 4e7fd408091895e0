"""Workflow files: loading, hashing, discovery and source identity.

A workflow file is a Python module that defines exactly one workflow at module level (any
variable name; ``workflow`` by convention). The loader hashes the file's bytes and executes
exactly those bytes as a module with a unique private name, so the hash always describes the
code that ran; it never changes ``sys.path``.

Discovery order for a name (the file stem): ``<project>/.piwf/workflows/*.py``, then
``$PIWF_HOME/workflows/*.py``, then the built-ins shipped in ``piwf/workflow/builtins/``. A
path (anything ending in ``.py`` or containing a separator) names a file directly. Files whose
name starts with ``_`` are never discovered.

Source identity = the root file's location and SHA-256 plus every mounted file's location and
SHA-256. Locations are absolute paths, or ``builtin:<name>`` for built-ins. A runner calls
:func:`verify_sources` before loading and compares :attr:`LoadedWorkflow.sources` after.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import ModuleType

from piwf.canonical import JsonValue
from piwf.config import state_home
from piwf.errors import WorkflowDefinitionError, WorkflowLoadError
from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.definition import WorkflowDefinition
from piwf.workflow.failure import WORKFLOW_MODULE_PREFIX

BUILTIN_DIR = Path(__file__).resolve().parent / "builtins"
BUILTIN_PREFIX = "builtin:"
_MODULE_NUMBERS = itertools.count(1)


class WorkflowOrigin(str, Enum):
    """Where a discovered workflow file was found."""

    PROJECT = "project"
    HOME = "home"
    BUILTIN = "builtin"
    PATH = "path"


@dataclass(frozen=True)
class SourceFile:
    """One source file: its location and the hex SHA-256 of its bytes."""

    location: str
    sha256: str

    def to_json(self) -> dict[str, JsonValue]:
        """Return ``{"location", "sha256"}``."""
        return {"location": self.location, "sha256": self.sha256}


@dataclass(frozen=True)
class SourceIdentity:
    """The root file plus every mounted file (sorted by location, root excluded)."""

    root: SourceFile
    mounted: tuple[SourceFile, ...]

    def to_json(self) -> dict[str, JsonValue]:
        """Return the launch-envelope form ``{"root": {...}, "mounted": [...]}``."""
        return {"root": self.root.to_json(), "mounted": [item.to_json() for item in self.mounted]}

    @classmethod
    def from_json(cls, value: JsonValue) -> SourceIdentity:
        """Parse :meth:`to_json` output; raises ``ValueError`` for any other shape."""
        if not isinstance(value, Mapping) or set(value) != {"root", "mounted"}:
            raise ValueError("source identity must be {'root', 'mounted'}")
        mounted = value["mounted"]
        if not isinstance(mounted, list):
            raise ValueError("source identity 'mounted' must be a list")
        return cls(_source_file(value["root"]), tuple(_source_file(item) for item in mounted))


@dataclass(frozen=True)
class DiscoveredWorkflow:
    """A workflow file found by discovery: its command ``name`` (file stem) and path."""

    name: str
    path: Path
    origin: WorkflowOrigin


@dataclass(frozen=True)
class LoadedWorkflow:
    """A loaded and compiled workflow file with its source identity."""

    path: Path
    definition: WorkflowDefinition
    compiled: CompiledWorkflow
    sources: SourceIdentity


def load_workflow(path: str | os.PathLike[str]) -> LoadedWorkflow:
    """Load, validate and compile the workflow file at ``path`` and every file it mounts.

    Raises :class:`WorkflowLoadError` naming the file and the problem: unreadable file, syntax
    error (with line), import failure, no definition, more than one definition, a broken graph
    or a broken include (missing file, source cycle).
    """
    loader = _Loader()
    root = Path(path).absolute()
    definition = loader.load(root)
    try:
        compiled = compile_workflow(definition, resolve=loader.resolve)
    except WorkflowDefinitionError as error:
        raise WorkflowLoadError(f"{root}: {error}") from error
    root_source = loader.source_of(root)
    mounted: dict[str, SourceFile] = {}
    for mounted_definition in compiled.definitions[1:]:
        if mounted_definition.source_file is None:
            continue
        source = loader.source_of(Path(mounted_definition.source_file))
        if source.location != root_source.location:
            mounted[source.location] = source
    identity = SourceIdentity(root_source, tuple(mounted[key] for key in sorted(mounted)))
    return LoadedWorkflow(root, definition, compiled, identity)


def verify_sources(identity: SourceIdentity) -> tuple[SourceFile, ...]:
    """Return the recorded files whose current bytes are missing or hash differently.

    An empty tuple means every file still matches; call this before loading a run's workflow.
    """
    changed: list[SourceFile] = []
    for source in (identity.root, *identity.mounted):
        try:
            data = location_path(source.location).read_bytes()
        except OSError:
            changed.append(source)
            continue
        if hashlib.sha256(data).hexdigest() != source.sha256:
            changed.append(source)
    return tuple(changed)


def source_location(path: Path) -> str:
    """Return the recorded location of ``path``: ``builtin:<stem>`` or the absolute path."""
    resolved = path.resolve()
    if resolved.parent == BUILTIN_DIR:
        return BUILTIN_PREFIX + resolved.stem
    return str(resolved)


def location_path(location: str) -> Path:
    """Return the file behind a recorded location."""
    if location.startswith(BUILTIN_PREFIX):
        return BUILTIN_DIR / f"{location[len(BUILTIN_PREFIX) :]}.py"
    return Path(location)


def workflow_directories(
    project: Path | None = None, home: Path | None = None
) -> tuple[tuple[WorkflowOrigin, Path], ...]:
    """Return the discovery directories in precedence order (missing ones included)."""
    directories: list[tuple[WorkflowOrigin, Path]] = []
    if project is not None:
        directories.append((WorkflowOrigin.PROJECT, project / ".piwf" / "workflows"))
    directories.append((WorkflowOrigin.HOME, (home or state_home()) / "workflows"))
    directories.append((WorkflowOrigin.BUILTIN, BUILTIN_DIR))
    return tuple(directories)


def discover_workflows(
    project: Path | None = None, home: Path | None = None
) -> tuple[DiscoveredWorkflow, ...]:
    """Return every discoverable workflow by name; an earlier directory hides a later one."""
    found: dict[str, DiscoveredWorkflow] = {}
    for origin, directory in workflow_directories(project, home):
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_") or not path.is_file():
                continue
            found.setdefault(path.stem, DiscoveredWorkflow(path.stem, path.absolute(), origin))
    return tuple(found[name] for name in sorted(found))


def find_workflow(
    reference: str, project: Path | None = None, home: Path | None = None
) -> DiscoveredWorkflow:
    """Resolve a workflow name or path; raises :class:`WorkflowLoadError` when none matches.

    A relative path is taken from ``project`` (or the current directory).
    """
    if reference.endswith(".py") or "/" in reference or os.sep in reference:
        path = Path(reference).expanduser()
        if not path.is_absolute():
            path = (project or Path.cwd()) / path
        if not path.is_file():
            raise WorkflowLoadError(f"{path}: no such workflow file")
        return DiscoveredWorkflow(path.stem, path.absolute(), WorkflowOrigin.PATH)
    for workflow in discover_workflows(project, home):
        if workflow.name == reference:
            return workflow
    searched = ", ".join(str(directory) for _, directory in workflow_directories(project, home))
    raise WorkflowLoadError(f"no workflow named {reference!r} (searched {searched})")


def _source_file(value: JsonValue) -> SourceFile:
    if not isinstance(value, Mapping) or set(value) != {"location", "sha256"}:
        raise ValueError("a source file must be {'location', 'sha256'}")
    location, digest = value["location"], value["sha256"]
    if not isinstance(location, str) or not isinstance(digest, str) or len(digest) != 64:
        raise ValueError("a source file needs a location and a 64-digit sha256")
    return SourceFile(location, digest)


class _Loader:
    """Loads each file once per :func:`load_workflow` call and resolves path includes."""

    def __init__(self) -> None:
        self.loaded: dict[Path, tuple[WorkflowDefinition, SourceFile]] = {}
        self.hashed: dict[Path, SourceFile] = {}

    def load(self, path: Path) -> WorkflowDefinition:
        key = path.resolve()
        if key in self.loaded:
            return self.loaded[key][0]
        try:
            data = key.read_bytes()
        except OSError as error:
            raise WorkflowLoadError(f"{path}: cannot read: {error.strerror or error}") from None
        source = SourceFile(source_location(key), hashlib.sha256(data).hexdigest())
        module = self.execute(path, key, data, source.sha256)
        definition = self.single_definition(path, key, module)
        self.loaded[key] = (definition, source)
        return definition

    def execute(self, path: Path, key: Path, data: bytes, digest: str) -> ModuleType:
        try:
            code = compile(data, str(key), "exec", dont_inherit=True)
        except SyntaxError as error:
            raise WorkflowLoadError(
                f"{path}: syntax error at line {error.lineno}: {error.msg}"
            ) from None
        except ValueError as error:
            raise WorkflowLoadError(f"{path}: cannot compile: {error}") from None
        name = f"{WORKFLOW_MODULE_PREFIX}{digest[:16]}_{next(_MODULE_NUMBERS)}"
        spec = importlib.util.spec_from_file_location(name, key)
        if spec is None:
            raise WorkflowLoadError(f"{path}: cannot create a module for this file")
        module = importlib.util.module_from_spec(spec)
        # Registered so dataclasses and pydantic models defined in the file can find their
        # module; the unique name keeps every load of every file separate.
        sys.modules[name] = module
        try:
            # The hashed bytes are executed, not re-read from disk, so the recorded hash is
            # the hash of the code that ran.
            exec(code, module.__dict__)  # noqa: S102
        except WorkflowDefinitionError as error:
            sys.modules.pop(name, None)
            raise WorkflowLoadError(f"{path}: {error}") from error
        except Exception as error:
            sys.modules.pop(name, None)
            raise WorkflowLoadError(
                f"{path}: import failed: {type(error).__name__}: {error}"
            ) from error
        return module

    def single_definition(self, path: Path, key: Path, module: ModuleType) -> WorkflowDefinition:
        found: dict[int, tuple[WorkflowDefinition, list[str]]] = {}
        for variable, value in vars(module).items():
            if isinstance(value, WorkflowDefinition) and value.source_file == str(key):
                found.setdefault(id(value), (value, []))[1].append(variable)
        if not found:
            raise WorkflowLoadError(
                f"{path}: defines no workflow; assign define_workflow(...) to a module-level "
                "variable such as `workflow`"
            )
        if len(found) > 1:
            names = ", ".join(
                f"{variables[0]} ({definition.name!r})" for definition, variables in found.values()
            )
            raise WorkflowLoadError(
                f"{path}: defines {len(found)} workflows ({names}); a workflow file must "
                "define exactly one"
            )
        return next(iter(found.values()))[0]

    def resolve(self, reference: str, including: WorkflowDefinition) -> WorkflowDefinition:
        if including.source_file is None:
            raise WorkflowLoadError(
                f"{including.describe()} mounts {reference!r} by path but was not loaded "
                "from a file"
            )
        target = Path(including.source_file).parent / reference
        if not target.is_file():
            raise WorkflowLoadError(
                f"{including.source_file}: include {reference!r} does not exist ({target})"
            )
        return self.load(target)

    def source_of(self, path: Path) -> SourceFile:
        key = path.resolve()
        if key in self.loaded:
            return self.loaded[key][1]
        if key not in self.hashed:
            try:
                data = key.read_bytes()
            except OSError as error:
                raise WorkflowLoadError(
                    f"{path}: cannot read mounted source: {error.strerror}"
                ) from None
            self.hashed[key] = SourceFile(source_location(key), hashlib.sha256(data).hexdigest())
        return self.hashed[key]
