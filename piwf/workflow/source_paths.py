"""Looking at workflow paths before reading them: a regular file, nothing, or something else.

``Path.is_file`` answers False for a missing file but raises ``PermissionError`` when a
directory on the way may not be searched (and, on other Pythons, answers False for it). A
lookup this user may not make is neither "no such file" nor a server failure: it is one
:class:`~piwf.errors.WorkflowLoadError` that names the path and says what to change.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from piwf.errors import WorkflowLoadError

#: Errors of a lookup that mean "nothing is there" rather than "may not look".
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR})


def refused_path_error(path: Path, error: OSError, doing: str) -> WorkflowLoadError:
    """The :class:`WorkflowLoadError` for ``error`` met while trying to ``doing`` ``path``
    ("read it"), with the fix when it is a permission this user lacks."""
    reason = error.strerror or str(error)
    advice = (
        "; let the user the server runs as read it (and search every directory on its path)"
        if error.errno in (errno.EACCES, errno.EPERM)
        else ""
    )
    return WorkflowLoadError(f"{path}: cannot {doing}: {reason}{advice}")


def workflow_file_mode(path: Path) -> int | None:
    """The mode of what ``path`` names (symlinks followed), or None when nothing is there;
    raise :class:`WorkflowLoadError` naming ``path`` when it may not be looked at (a
    directory on the way closed to this user, a symlink loop)."""
    try:
        return path.stat().st_mode
    except OSError as error:
        if error.errno in _ABSENT:
            return None
        raise refused_path_error(path, error, "look at it") from None


def is_workflow_file(path: Path) -> bool:
    """True when ``path`` is a regular file, False when nothing or something else is there;
    raise :class:`WorkflowLoadError` when it may not be looked at."""
    mode = workflow_file_mode(path)
    return mode is not None and stat.S_ISREG(mode)


def python_files_in(directory: Path) -> list[Path]:
    """The ``*.py`` entries of ``directory`` in name order, an empty list when it does not
    exist; raise :class:`WorkflowLoadError` naming it when it may not be listed (which a
    glob would hide as an empty directory)."""
    try:
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries if entry.name.endswith(".py"))
    except OSError as error:
        if error.errno in _ABSENT:
            return []
        raise refused_path_error(directory, error, "list workflows in it") from None
    return [directory / name for name in names]
