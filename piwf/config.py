"""Where piwf keeps its state, and the limits every component shares.

``PIWF_HOME`` selects the state home (default ``~/.piwf``). The home is created ``0700`` and must
stay that way: piwf refuses a home that is a symlink, belongs to another user or is readable by
group or others, because the socket and database inside it are protected by the directory first.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from piwf.canonical import MAX_SAFE_INTEGER
from piwf.errors import UnsafeStateHomeError

STATE_FILE_NAME = "state.sqlite"
#: The channel profiles (docs/CHANNELS.md), a JSON document in the state home.
CHANNELS_FILE_NAME = "channels.json"
HOME_MODE = 0o700
FILE_MODE = 0o600
#: What every request id (a checkpoint, a decision, an agent step) starts with
#: (:func:`piwf.workflow.identity.request_id` makes them; a command checks the form by it).
REQUEST_ID_PREFIX = "request-"

#: Largest frame on the client socket or a runner pipe, newline included.
MAX_FRAME_BYTES = 1024 * 1024
#: Largest part of a content reference read back over a runner pipe.
CONTENT_PART_BYTES = 512 * 1024
#: The largest value one content reference may carry (a runner call's payload included).
MAX_CONTENT_BYTES = 256 * 1024 * 1024
#: The largest value workflow code may hand to the engine (a node output, an effect request):
#: one MiB under :data:`MAX_CONTENT_BYTES`, the room the runner call around it needs.
MAX_VALUE_BYTES = MAX_CONTENT_BYTES - 1024 * 1024
#: The largest value a numeric ``PIWF_*`` variable takes: counts and byte sizes must stay exact
#: in the protocol (``server status`` reports them) and in SQLite's 64-bit integers.
MAX_SETTING_INTEGER = MAX_SAFE_INTEGER
#: The largest duration in seconds (about 31 years; in milliseconds for the leases): longer
#: turns into deadlines and integers that no clock, protocol field or SQLite column holds.
MAX_SETTING_SECONDS = 1_000_000_000
MAX_SETTING_MILLISECONDS = MAX_SETTING_SECONDS * 1000
#: The most days ``PIWF_RETENTION_DAYS`` keeps (about 2,700 years).
MAX_RETENTION_DAYS = 1_000_000
#: Linux ``sun_path`` holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
#: An agent command (``--agent-command``, ``agent(command=...)``, ``PIWF_AGENT_COMMAND``) is an
#: argv list of at most this many parts, each 1..MAX_AGENT_COMMAND_PART_CHARS characters.
MAX_AGENT_COMMAND_PARTS = 256
MAX_AGENT_COMMAND_PART_CHARS = 4096
#: Why ``run.start`` refuses a session together with an agent command.
SESSION_OR_AGENT_COMMAND = (
    "a run takes a session or an agent command, not both: an interactive run's agent steps go "
    "to its session's coordinator, a headless run's to its agent command"
)
#: How long a client waits for a server it starts to report ready: long enough for startup
#: recovery of a large backlog (it runs before the server listens); a server that has not
#: reported by then is stopped rather than left half-started (:mod:`piwf.client.launcher`).
DEFAULT_START_TIMEOUT_S = 60.0


def agent_command_problem(command: object) -> str | None:
    """Why ``command`` is not an agent command (an argv list of non-empty strings without
    NUL, within the limits above), or None when it is one."""
    if isinstance(command, str) or not isinstance(command, (list, tuple)):
        return "an agent command is a list of strings such as ['claude', '-p']"
    if not 1 <= len(command) <= MAX_AGENT_COMMAND_PARTS:
        return f"an agent command has 1..{MAX_AGENT_COMMAND_PARTS} parts, not {len(command)}"
    for part in command:
        if not isinstance(part, str) or not 1 <= len(part) <= MAX_AGENT_COMMAND_PART_CHARS:
            return (
                "every part of an agent command is a string of "
                f"1..{MAX_AGENT_COMMAND_PART_CHARS} characters"
            )
        if "\x00" in part:
            return "an agent command part contains a NUL character"
    return None


#: The ``PIWF_*`` variables a client or an agent command reads itself; every other one set is
#: a setting the server reads only when it starts.
CLIENT_VARIABLES = frozenset({"PIWF_HOME", "PIWF_REQUEST_ID", "PIWF_MCP_CONFIG"})


def server_setting_variables(environ: Mapping[str, str]) -> list[str]:
    """The names of the ``PIWF_*`` server settings set (non-empty) in ``environ``, sorted:
    what a server started from it would read, and a server already running never does."""
    return sorted(
        name
        for name, value in environ.items()
        if name.startswith("PIWF_") and name not in CLIENT_VARIABLES and value.strip()
    )


def plain_number(text: str) -> bool:
    """Whether ``text`` is written in plain ASCII without digit separators, as every numeric
    ``PIWF_*`` variable and CLI option must be: Python's ``int`` and ``float`` also take
    ``1_000`` and non-ASCII digits such as ``\u0663``, which no other tool reads as the same
    number. Whether the rest is a number is for ``int`` or ``float`` to say."""
    return text.isascii() and "_" not in text


def split_agent_command(text: str) -> list[str]:
    """Split ``'CMD ARGS'`` the way a POSIX shell would (no expansion, nothing runs).

    Raises ``ValueError`` saying what is wrong: unbalanced quotes, nothing to run, or a
    command :func:`agent_command_problem` refuses.
    """
    try:
        parts = shlex.split(text)
    except ValueError as error:
        raise ValueError(f"the agent command cannot be split: {error}") from None
    if not parts:
        raise ValueError("the agent command is empty; give the program to run and its arguments")
    shell_syntax = _shell_syntax_problem(parts)
    if shell_syntax is not None:
        raise ValueError(shell_syntax)
    problem = agent_command_problem(parts)
    if problem is not None:
        raise ValueError(problem)
    return parts


#: The variables an agent command's arguments may name: piwf replaces them itself (they are the
#: ones an agent command reads, so the same names as a client's).
AGENT_COMMAND_VARIABLES = CLIENT_VARIABLES
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*)|\()")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_OPERATOR = re.compile(r"(?:\|\|?|&&?|;|\|&|&>>?)|\d*(?:>>?|<).*", re.DOTALL)
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "busybox"})
_NO_SHELL = "no shell runs the agent command"


def _shell_syntax_problem(parts: list[str]) -> str | None:
    """What a shell would have done with ``parts`` that piwf, which runs no shell, would
    silently pass on as literal text (a pipe, a redirect, ``NAME=value``, ``~``, ``$HOME``),
    said with the fix; None when there is none. A ``$`` in the arguments of a shell the
    command runs explicitly (``sh -c '...'``) is that shell's to expand."""
    program = parts[0]
    if _ASSIGNMENT.match(program):
        name = program.split("=", 1)[0]
        return (
            f"{_NO_SHELL}, so it cannot start with a variable assignment ({name}=...): set it"
            f" with env, as in 'env {name}=VALUE PROGRAM ARGS'"
        )
    if program.startswith("~"):
        return f"{_NO_SHELL}, so '~' is not expanded: write the program's full path"
    for part in parts:
        if _OPERATOR.fullmatch(part):
            shown = part if len(part) <= 20 else part[:20] + "..."
            return (
                f"{_NO_SHELL}, so {shown!r} would reach the program as an argument, not"
                " pipe or redirect anything: run a shell for it explicitly, as in"
                " sh -c 'PROGRAM ARGS | OTHER'; the command's output is kept anyway"
                " (piwf run logs RUN)"
            )
    if any(Path(part).name in _SHELLS for part in parts):
        return None
    for part in parts:
        for match in _VARIABLE.finditer(part):
            name = match[1] or match[2]
            if name in AGENT_COMMAND_VARIABLES:
                continue
            what = f"${name}" if name else "$(...)"
            return (
                f"{_NO_SHELL}, so {what} would reach the program as it is written: write its"
                " value out, or run a shell for it explicitly, as in sh -c 'PROGRAM ARGS'"
                " (piwf replaces only $PIWF_REQUEST_ID, $PIWF_MCP_CONFIG and $PIWF_HOME)"
            )
    return None


def state_home() -> Path:
    """Return the configured state home without creating it."""
    configured = os.environ.get("PIWF_HOME")
    if configured:
        return Path(configured).expanduser().absolute()
    return Path.home() / ".piwf"


def state_path(home: Path | None = None) -> Path:
    """Return the path of the state database inside ``home`` (default: :func:`state_home`)."""
    return (home or state_home()) / STATE_FILE_NAME


def socket_path_problem(path: Path) -> str | None:
    """Why no server can listen at ``path`` (longer than ``sun_path`` holds), or None."""
    length = len(os.fsencode(path))
    if length <= MAX_SOCKET_PATH_BYTES:
        return None
    return (
        f"the socket path {path} is {length} bytes, over the OS limit of"
        f" {MAX_SOCKET_PATH_BYTES}; set PIWF_HOME to a shorter directory"
    )


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` with mode ``0700`` if missing, then verify it is safe to use.

    Raises :class:`UnsafeStateHomeError` when the directory is a symlink, is not a directory,
    belongs to another user, or grants any access to group or others. An existing directory is
    never chmod-ed behind the user's back: the error says what to fix.
    """
    try:
        path.mkdir(mode=HOME_MODE, parents=False)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(mode=HOME_MODE, parents=True, exist_ok=True)
        path.mkdir(mode=HOME_MODE, exist_ok=True)
    verify_private_dir(path)
    return path


def verify_private_dir(path: Path) -> None:
    """Raise :class:`UnsafeStateHomeError` unless ``path`` is a 0700 directory we own."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeStateHomeError(
            f"{path} is a symlink; piwf needs a real directory: point PIWF_HOME at the real one"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeStateHomeError(
            f"{path} is not a directory; move it away, or set PIWF_HOME to another directory"
            " (piwf creates it)"
        )
    if info.st_uid != os.geteuid():
        raise UnsafeStateHomeError(
            f"{path} belongs to another user (uid {info.st_uid}); set PIWF_HOME to a directory"
            " of your own"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise UnsafeStateHomeError(
            f"{path} has mode {stat.S_IMODE(info.st_mode):04o}; run `chmod 700 {path}`"
        )


@dataclass(frozen=True)
class ServerPaths:
    """Where one state home keeps its server files."""

    home: Path

    @property
    def server_dir(self) -> Path:
        """``$PIWF_HOME/server`` (mode 0700)."""
        return self.home / "server"

    @property
    def socket(self) -> Path:
        """The client socket (mode 0600)."""
        return self.server_dir / "server.sock"

    @property
    def lock(self) -> Path:
        """The single-instance lock file, held with ``flock`` for the server's lifetime."""
        return self.server_dir / "server.lock"

    @property
    def log(self) -> Path:
        """The server log (safe messages only: no payloads, tokens or environment)."""
        return self.server_dir / "server.log"

    @property
    def runners_dir(self) -> Path:
        """Where the children's captured output is kept (``runner-*``, ``resolver-*`` and
        reconcile logs)."""
        return self.server_dir / "runners"

    @property
    def database(self) -> Path:
        """The state database."""
        return self.home / "state.sqlite"
