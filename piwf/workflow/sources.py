"""Workflow files: loading, hashing, discovery and source identity.

A workflow file is a Python module that defines exactly one workflow at module level (any
variable name; ``workflow`` by convention). The loader hashes the file's bytes and executes
exactly those bytes as a module with a unique private name, so the hash always describes the
code that ran; it never changes ``sys.path``.

A reference names a workflow the same way for ``run start`` and for ``include()``
(:func:`reference_kind`):

- a path (anything ending in ``.py`` or containing a separator) names a file directly,
  relative to the project for ``run start`` and to the including file for ``include()``;
- ``builtin:NAME`` names the built-in ``piwf/workflow/builtins/NAME.py``;
- a bare name (the file stem) is discovered in this order: ``<project>/.piwf/workflows/``,
  then ``$PIWF_HOME/workflows/``, then the built-ins. Files whose name starts with ``_`` are
  never discovered.

Source identity (:class:`SourceIdentity`) = one :class:`MountSource` for the root (mount path
``""``) and one for every mount: how it was referenced and what that resolved to, a location
(an absolute path, or ``builtin:<name>``) with the SHA-256 of its bytes (and, for a built-in,
the piwf version that shipped it). A run records it in ``run_sources``. A runner calls
:func:`verify_sources` before loading anything, then :func:`load_recorded_workflow`, which
takes every include by name from the record instead of discovering it again, and compares the
loaded identity with the recorded one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import stat
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType

from piwf._version import __version__
from piwf.canonical import JsonValue
from piwf.config import state_home
from piwf.errors import WorkflowDefinitionError, WorkflowLoadError
from piwf.lifecycle import StrEnum
from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.definition import BUILTIN_PREFIX, WorkflowDefinition
from piwf.workflow.failure import WORKFLOW_MODULE_PREFIX, describe_error
from piwf.workflow.source_code import compile_workflow_source
from piwf.workflow.source_paths import (
    is_workflow_file,
    python_files_in,
    refused_path_error,
    workflow_file_mode,
)

BUILTIN_DIR = Path(__file__).resolve().parent / "builtins"
_MODULE_NUMBERS = itertools.count(1)

#: Finds the file of a bare workflow name, or raises :class:`WorkflowLoadError`.
NameFinder = Callable[[str], Path]


class WorkflowOrigin(str, Enum):
    """Where a discovered workflow file was found."""

    PROJECT = "project"
    HOME = "home"
    BUILTIN = "builtin"
    PATH = "path"


class ReferenceKind(StrEnum):
    """How a workflow was referenced (``run_sources.reference_kind``)."""

    PATH = "path"
    NAME = "name"
    BUILTIN = "builtin"
    #: A definition object given to ``include()``; its reference is the workflow's name.
    DEFINITION = "definition"


def reference_kind(reference: str) -> ReferenceKind:
    """Return how the text ``reference`` names a workflow (never ``DEFINITION``)."""
    if reference.startswith(BUILTIN_PREFIX):
        return ReferenceKind.BUILTIN
    if reference.endswith(".py") or "/" in reference or os.sep in reference:
        return ReferenceKind.PATH
    return ReferenceKind.NAME


@dataclass(frozen=True)
class SourceFile:
    """One source file: its location and the hex SHA-256 of its bytes."""

    location: str
    sha256: str


@dataclass(frozen=True)
class MountSource:
    """How one mount (``mount_path`` ``""``: the root) referenced its workflow, and the file
    that resolved to.

    ``piwf_version`` is set for a built-in: with ``sha256`` it is the built-in's revision.
    Comparisons leave it out: a run is pinned to the bytes that ran, so a piwf upgrade that
    ships the same built-in bytes changes nothing that runs, and one that changes them is a
    changed source like any other.
    """

    mount_path: str
    kind: ReferenceKind
    reference: str
    location: str
    sha256: str
    piwf_version: str | None = field(default=None, compare=False)

    @property
    def file(self) -> SourceFile:
        """The file this mount resolved to."""
        return SourceFile(self.location, self.sha256)

    @property
    def builtin(self) -> bool:
        """Whether the file is a built-in (``builtin:<name>``)."""
        return self.location.startswith(BUILTIN_PREFIX)

    def to_json(self) -> dict[str, JsonValue]:
        """Return ``{"mountPath", "referenceKind", "reference", "location", "sha256",
        "piwfVersion"}``."""
        return {
            "mountPath": self.mount_path,
            "referenceKind": self.kind.value,
            "reference": self.reference,
            "location": self.location,
            "sha256": self.sha256,
            "piwfVersion": self.piwf_version,
        }

    @classmethod
    def from_json(cls, value: JsonValue) -> MountSource:
        """Parse :meth:`to_json` output; raises ``ValueError`` for any other shape."""
        if not isinstance(value, Mapping) or set(value) != set(_MOUNT_KEYS):
            raise ValueError(f"a mount source must be {{{', '.join(_MOUNT_KEYS)}}}")
        texts = [value[key] for key in _MOUNT_KEYS[:5]]
        version = value["piwfVersion"]
        if not all(isinstance(text, str) for text in texts) or len(str(texts[4])) != 64:
            raise ValueError("a mount source needs text fields and a 64-digit sha256")
        if version is not None and not isinstance(version, str):
            raise ValueError("a mount source's piwfVersion must be text or null")
        mount_path, kind, reference, location, digest = (str(text) for text in texts)
        return cls(mount_path, ReferenceKind(kind), reference, location, digest, version)


_MOUNT_KEYS = ("mountPath", "referenceKind", "reference", "location", "sha256", "piwfVersion")


@dataclass(frozen=True)
class SourceIdentity:
    """The root's source (mount path ``""``) plus every mount's, sorted by mount path."""

    root: MountSource
    mounted: tuple[MountSource, ...]

    def entries(self) -> tuple[MountSource, ...]:
        """The root, then every mount."""
        return (self.root, *self.mounted)

    def files(self) -> tuple[SourceFile, ...]:
        """Every distinct file, root first (a file mounted twice is listed once)."""
        return tuple(dict.fromkeys(entry.file for entry in self.entries()))

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
        root = MountSource.from_json(value["root"])
        return cls.of([root, *(MountSource.from_json(item) for item in mounted)])

    @classmethod
    def of(cls, entries: Iterable[MountSource]) -> SourceIdentity:
        """Assemble recorded entries in any order; raises ``ValueError`` unless exactly one is
        the root and no mount path repeats."""
        by_path: dict[str, MountSource] = {}
        for entry in entries:
            if by_path.setdefault(entry.mount_path, entry) is not entry:
                raise ValueError(f"mount path {entry.mount_path!r} is recorded twice")
        root = by_path.pop("", None)
        if root is None:
            raise ValueError("source identity has no root (mount path '')")
        return cls(root, tuple(by_path[path] for path in sorted(by_path)))


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


def load_workflow(
    path: str | os.PathLike[str], *, project: Path | None = None, home: Path | None = None
) -> LoadedWorkflow:
    """Load, validate and compile the workflow file at ``path`` and every file it mounts.

    Includes by name are discovered as ``run start`` discovers a name, from ``project`` (not
    searched when None) and ``home`` (default ``$PIWF_HOME``). The root is recorded as
    referenced by its path. Raises :class:`WorkflowLoadError` naming the file and the
    problem: unreadable file, syntax error (with line), import failure, no definition, more
    than one definition, a broken graph or a broken include (missing file, unknown name,
    source cycle).
    """
    loader = _Loader(_discovering(project, home))
    return _load(loader, Path(path), ReferenceKind.PATH, os.fspath(path))


def resolve_workflow(
    reference: str, project: Path | None = None, home: Path | None = None
) -> LoadedWorkflow:
    """Find ``reference`` as ``run start`` does (:func:`find_workflow`) and load it, with
    includes by name discovered from the same ``project`` and ``home``; the root is recorded
    as ``reference``. Raises :class:`WorkflowLoadError` as :func:`load_workflow` does."""
    found = find_workflow(reference, project, home)
    loader = _Loader(_discovering(project, home))
    return _load(loader, found.path, reference_kind(reference), reference)


def load_recorded_workflow(identity: SourceIdentity) -> LoadedWorkflow:
    """Load the root file of a recorded ``identity``, taking every include by name from the
    record (nothing is discovered again).

    The caller checks the hashes first (:func:`verify_sources`) and compares the loaded
    sources with ``identity`` after. Raises :class:`WorkflowLoadError` as
    :func:`load_workflow` does, also for an include by a name the record does not hold.
    """
    root = identity.root
    loader = _Loader(_recorded(identity))
    return _load(loader, location_path(root.location), root.kind, root.reference)


@dataclass(frozen=True)
class SourceDrift:
    """How the files on disk differ from a run's recorded sources (locations, in record order).

    False when nothing differs. ``changed``: the file is there with other bytes; ``missing``:
    it cannot be read (deleted, moved, unreadable).
    """

    changed: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changed or self.missing)

    def describe(self) -> str:
        """``changed: A, B; missing: C``: the parts that apply, for messages and park details."""
        parts = [
            f"{label}: {', '.join(locations)}"
            for label, locations in (("changed", self.changed), ("missing", self.missing))
            if locations
        ]
        return "; ".join(parts)


def verify_sources(identity: SourceIdentity) -> SourceDrift:
    """Return how the recorded files differ from their current bytes (falsy: every file still
    matches); call this before loading a run's workflow."""
    changed: list[str] = []
    missing: list[str] = []
    for source in identity.files():
        try:
            data = location_path(source.location).read_bytes()
        except OSError:
            missing.append(source.location)
            continue
        if hashlib.sha256(data).hexdigest() != source.sha256:
            changed.append(source.location)
    return SourceDrift(tuple(changed), tuple(missing))


def names_still_resolve(identity: SourceIdentity, project: Path | None, home: Path | None) -> bool:
    """Whether every mount included by name still discovers its recorded file from
    ``project`` and ``home``; False once a new file shadows one or a recorded one is gone."""
    for entry in identity.mounted:
        if entry.kind is ReferenceKind.NAME:
            found = _discover_name(entry.reference, project, home)
            if found is None or source_location(found.path) != entry.location:
                return False
    return True


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
    """Return every discoverable workflow by name; an earlier directory hides a later one.
    Raises :class:`WorkflowLoadError` naming a directory this user may not list."""
    found: dict[str, DiscoveredWorkflow] = {}
    for origin, directory in workflow_directories(project, home):
        for path in python_files_in(directory):
            if path.name.startswith("_") or not is_workflow_file(path):
                continue
            found.setdefault(path.stem, DiscoveredWorkflow(path.stem, path.absolute(), origin))
    return tuple(found[name] for name in sorted(found))


def find_workflow(
    reference: str, project: Path | None = None, home: Path | None = None
) -> DiscoveredWorkflow:
    """Resolve a workflow path, ``builtin:NAME`` or name; raises :class:`WorkflowLoadError`
    naming the reference (and, for a name, the directories searched) when none matches.

    A relative path is taken from ``project`` (or the current directory).
    """
    kind = reference_kind(reference)
    if kind is ReferenceKind.BUILTIN:
        return _builtin(reference[len(BUILTIN_PREFIX) :])
    if kind is ReferenceKind.PATH:
        path = Path(reference).expanduser()
        if not path.is_absolute():
            path = (project or Path.cwd()) / path
        mode = workflow_file_mode(path)
        if mode is None or not stat.S_ISREG(mode):
            if mode is not None:  # a directory, a device, a FIFO: nothing to read a workflow from
                raise WorkflowLoadError(
                    f"{path}: is not a regular file; a workflow is a Python file"
                )
            raise WorkflowLoadError(
                f"{path}: no such workflow file; check the path, or start a workflow by its "
                "name (piwf workflows list shows the names run start finds)"
            )
        return DiscoveredWorkflow(path.stem, path.absolute(), WorkflowOrigin.PATH)
    found = _discover_name(reference, project, home)
    if found is None:
        searched = ", ".join(str(place) for _, place in workflow_directories(project, home))
        raise WorkflowLoadError(
            f"no workflow named {reference!r} (searched {searched}); give the workflow's file "
            f"path instead, or put {reference}.py in one of those directories (piwf workflows "
            "list shows the names found)"
        )
    return found


def _discover_name(name: str, project: Path | None, home: Path | None) -> DiscoveredWorkflow | None:
    """The first ``<directory>/<name>.py`` in discovery order, as :func:`discover_workflows`
    would list it under ``name``; None when there is none."""
    if not name or name.startswith("_"):
        return None
    for origin, directory in workflow_directories(project, home):
        path = directory / f"{name}.py"
        if is_workflow_file(path):
            return DiscoveredWorkflow(name, path.absolute(), origin)
    return None


def _builtin(name: str) -> DiscoveredWorkflow:
    path = BUILTIN_DIR / f"{name}.py"
    if name and "/" not in name and os.sep not in name and name[0] != "_" and path.is_file():
        return DiscoveredWorkflow(name, path, WorkflowOrigin.BUILTIN)
    known = sorted(p.stem for p in BUILTIN_DIR.glob("*.py") if not p.name.startswith("_"))
    raise WorkflowLoadError(f"no built-in workflow named {name!r} (built-ins: {', '.join(known)})")


def _discovering(project: Path | None, home: Path | None) -> NameFinder:
    def find(name: str) -> Path:
        return find_workflow(name, project, home).path

    return find


def _recorded(identity: SourceIdentity) -> NameFinder:
    files: dict[str, str] = {}
    for entry in identity.entries():
        if entry.kind is not ReferenceKind.NAME:
            continue
        if files.setdefault(entry.reference, entry.location) != entry.location:
            raise WorkflowLoadError(
                f"the recorded sources resolve the name {entry.reference!r} to two files"
            )

    def find(name: str) -> Path:
        if name not in files:
            raise WorkflowLoadError(f"the run's recorded sources hold no file for {name!r}")
        return location_path(files[name])

    return find


def _load(loader: _Loader, path: Path, kind: ReferenceKind, reference: str) -> LoadedWorkflow:
    root = path.absolute()
    definition = loader.load(root)
    try:
        compiled = compile_workflow(definition, resolve=loader.resolve)
    except WorkflowDefinitionError as error:
        raise WorkflowLoadError(f"{root}: {error}") from error
    mounted: list[MountSource] = []
    for mount_path, mount in sorted(compiled.mounts.items()):
        source_file = mount.workflow.source_file
        if source_file is None:  # built in memory, not loaded from a file: nothing to pin
            continue
        written = mount.include.workflow
        if isinstance(written, str):
            how, text = reference_kind(written), written
        else:
            how, text = ReferenceKind.DEFINITION, written.name
        mounted.append(_mount_source(mount_path, how, text, loader.source_of(Path(source_file))))
    identity = SourceIdentity(
        _mount_source("", kind, reference, loader.source_of(root)), tuple(mounted)
    )
    return LoadedWorkflow(root, definition, compiled, identity)


def _mount_source(
    mount_path: str, kind: ReferenceKind, reference: str, source: SourceFile
) -> MountSource:
    version = __version__ if source.location.startswith(BUILTIN_PREFIX) else None
    return MountSource(mount_path, kind, reference, source.location, source.sha256, version)


class _Loader:
    """Loads each file once per load call and resolves includes (path, built-in, name)."""

    def __init__(self, find_name: NameFinder) -> None:
        self.find_name = find_name
        self.loaded: dict[Path, tuple[WorkflowDefinition, SourceFile]] = {}
        self.hashed: dict[Path, SourceFile] = {}

    def load(self, path: Path) -> WorkflowDefinition:
        key = path.resolve()
        if key in self.loaded:
            return self.loaded[key][0]
        try:
            data = key.read_bytes()
        except OSError as error:
            raise refused_path_error(path, error, "read it") from None
        source = SourceFile(source_location(key), hashlib.sha256(data).hexdigest())
        module = self.execute(path, key, data, source.sha256)
        definition = self.single_definition(path, key, module)
        self.loaded[key] = (definition, source)
        return definition

    def execute(self, path: Path, key: Path, data: bytes, digest: str) -> ModuleType:
        code = compile_workflow_source(path, key, data)
        name = f"{WORKFLOW_MODULE_PREFIX}{digest[:16]}_{next(_MODULE_NUMBERS)}"
        spec = importlib.util.spec_from_file_location(name, key)
        if spec is None:
            raise WorkflowLoadError(
                f"{path}: a workflow file's name ends in .py; rename it to "
                f"{path.with_suffix('.py').name}"
            )
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
            line = line_in_file(error, key)
            where = "" if line is None else f" (line {line})"
            raise WorkflowLoadError(f"{path}: {error}{where}") from error
        except SystemExit as error:  # sys.exit() or exit() at import: a refusal, not an exit
            sys.modules.pop(name, None)
            raise WorkflowLoadError(
                f"{path}: {error!r} raised while importing it (a workflow file must not call "
                "sys.exit or exit when it is imported)"
            ) from error
        except KeyboardInterrupt:  # a person pressed Ctrl-C: not the file's failure
            sys.modules.pop(name, None)
            raise
        except BaseException as error:  # also asyncio.CancelledError and GeneratorExit
            sys.modules.pop(name, None)
            line = line_in_file(error, key)
            where = "" if line is None else f" at line {line}"
            raise WorkflowLoadError(
                f"{path}: import failed{where}: {describe_error(error)}"
            ) from error
        return module

    def single_definition(self, path: Path, key: Path, module: ModuleType) -> WorkflowDefinition:
        found: dict[int, tuple[WorkflowDefinition, list[str]]] = {}
        for variable, value in vars(module).items():
            if isinstance(value, CompiledWorkflow):  # compile_workflow(define_workflow(...))
                value = value.definition
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
        """The definition ``include(reference)`` in ``including`` mounts. The same file is the
        same definition, so a cycle through names or paths is found by the compiler."""
        if including.source_file is None:
            raise WorkflowLoadError(
                f"{including.describe()} mounts {reference!r} but was not loaded from a file"
            )
        kind = reference_kind(reference)
        if kind is ReferenceKind.PATH:
            target = Path(including.source_file).parent / reference
            if not is_workflow_file(target):
                raise WorkflowLoadError(
                    f"{including.source_file}: include {reference!r} does not exist ({target})"
                )
            return self.load(target)
        try:
            if kind is ReferenceKind.NAME:
                target = self.find_name(reference)
            else:
                target = find_workflow(reference).path
        except WorkflowLoadError as error:
            raise WorkflowLoadError(
                f"{including.source_file}: include {reference!r}: {error}"
            ) from None
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


def line_in_file(error: BaseException, file: Path) -> int | None:
    """The last line of ``file`` that ``error``'s traceback passed through (where the module's
    own code failed), or None when it passed through none."""
    line: int | None = None
    for frame, number in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_filename == str(file):
            line = number
    return line
