"""Where resource managers live and how a child loads one.

Discovery rule: the manager named ``N`` is the file ``N.py`` in the first of
``<project>/.piwf/resource_managers/`` and ``$PIWF_HOME/resource_managers/`` that has one, and
that file must define a manager whose name is ``N``. :func:`discovered_path` computes the file
without importing anything, so the server can re-check a resolver's answer (same file, same
SHA-256) before it commits an apply.

:func:`load_manager` imports the file; only child processes (the source resolver and the
resource runner) call it. Like workflow files, the hashed bytes are the bytes executed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

from piwf.config import state_home
from piwf.resource.definition import NAME_PATTERN, ResourceManagerDefinition
from piwf.resource.errors import ResourceManagerDefinitionError, ResourceManagerLoadError

_MODULE_NUMBERS = itertools.count(1)


@dataclass(frozen=True)
class LoadedManager:
    """A loaded manager file: its definition, path and the hex SHA-256 of the executed bytes."""

    path: Path
    sha256: str
    definition: ResourceManagerDefinition


def manager_directories(project: Path | None, home: Path | None = None) -> tuple[Path, ...]:
    """The discovery directories in precedence order (missing ones included)."""
    directories: list[Path] = []
    if project is not None:
        directories.append(project / ".piwf" / "resource_managers")
    directories.append((home or state_home()) / "resource_managers")
    return tuple(directories)


def discovered_path(name: str, project: Path | None, home: Path | None = None) -> Path:
    """The file that defines manager ``name`` under the discovery rule (absolute).

    Raises :class:`ResourceManagerLoadError` for a malformed name or when no directory has it.
    """
    if not NAME_PATTERN.fullmatch(name):
        raise ResourceManagerLoadError(
            f"{name!r} is not a resource manager name ([a-z][a-z0-9-]*, at most 64)"
        )
    directories = manager_directories(project, home)
    for directory in directories:
        candidate = directory / f"{name}.py"
        if candidate.is_file():
            return candidate.absolute()
    searched = ", ".join(str(directory) for directory in directories)
    raise ResourceManagerLoadError(f"no resource manager named {name!r} (searched {searched})")


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes; raises :class:`ResourceManagerLoadError`."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as error:
        raise ResourceManagerLoadError(f"{path}: cannot read: {error.strerror or error}") from None


def find_and_load(name: str, project: Path | None, home: Path | None = None) -> LoadedManager:
    """Discover and load manager ``name`` (child processes only)."""
    return load_manager(discovered_path(name, project, home), name)


def load_manager(path: Path, expected_name: str) -> LoadedManager:
    """Execute the manager file at ``path`` and return its one definition.

    Raises :class:`ResourceManagerLoadError` for an unreadable file, a syntax or import error
    (its message names the line of the file that failed; the exception that failed is its
    ``__cause__``), no definition, more than one, or a definition whose name is not
    ``expected_name``.
    """
    key = path.resolve()
    try:
        data = key.read_bytes()
    except OSError as error:
        raise ResourceManagerLoadError(f"{path}: cannot read: {error.strerror or error}") from None
    digest = hashlib.sha256(data).hexdigest()
    try:
        code = compile(data, str(key), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        raise ResourceManagerLoadError(f"{path}: cannot compile: {error}") from None
    module_name = f"_piwf_resource_manager_{digest[:16]}_{next(_MODULE_NUMBERS)}"
    spec = importlib.util.spec_from_file_location(module_name, key)
    if spec is None:
        raise ResourceManagerLoadError(f"{path}: cannot create a module for this file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - the point: load the user's manager (child only)
    except ResourceManagerDefinitionError as error:
        sys.modules.pop(module_name, None)
        raise ResourceManagerLoadError(f"{path}: {error}") from error
    except SystemExit as error:  # sys.exit() or exit() at import: a refusal, not an exit
        sys.modules.pop(module_name, None)
        raise ResourceManagerLoadError(
            f"{path}: {error!r} raised while importing it (a resource manager file must not "
            "call sys.exit or exit when it is imported)"
        ) from error
    except Exception as error:
        sys.modules.pop(module_name, None)
        from piwf.workflow.sources import line_in_file

        line = line_in_file(error, key)
        where = "" if line is None else f" at line {line}"
        raise ResourceManagerLoadError(
            f"{path}: import failed{where}: {type(error).__name__}: {error}"
        ) from error
    found = {
        id(value): value
        for value in vars(module).values()
        if isinstance(value, ResourceManagerDefinition) and value.source_file == str(key)
    }
    if len(found) != 1:
        raise ResourceManagerLoadError(
            f"{path}: defines {len(found)} resource managers; a manager file must define one"
        )
    definition = next(iter(found.values()))
    if definition.name != expected_name:
        raise ResourceManagerLoadError(
            f"{path}: defines manager {definition.name!r}, but the file is discovered as "
            f"{expected_name!r}; name the file after its manager"
        )
    return LoadedManager(key, digest, definition)
