"""What the server and its children share about processes: which children exist and how one
is entered, start identities (a pid plus its start time and the boot id, never a bare pid), and
the process trees of children, walked from such an identity.

A pid is reused by the kernel; ``pid:create_time:boot_id`` is not, so a registry keyed by it
never signals an unrelated process that inherited a dead child's pid. Used by the server's
supervisor and recovery and by the children's lifeline (:mod:`piwf.runner.lifeline`).

Children are started through ``multiprocessing`` (docs/EXECUTION.md, "How children start"). The
server must not import the child packages (DESIGN.md §2), so the target of every child's
``Process`` is :func:`enter_child` here: pickled by reference, it imports the child bootstrap
(:data:`CHILD_BOOTSTRAP`) only once it runs, in the child.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import time
from enum import Enum
from multiprocessing.connection import Connection
from pathlib import Path

import psutil

#: The module whose ``main`` performs a child's first act and runs its entry module.
CHILD_BOOTSTRAP = "piwf.runner.bootstrap"
#: The module that makes a fork server lead the session its children share (imported first).
CHILDREN_SESSION = "piwf.runner.children_session"
#: Set (to ``"1"``) in the environment a fork server starts with: it then leads a new session,
#: and removes the variable before it forks any child (:mod:`piwf.runner.children_session`).
CHILDREN_SESSION_VARIABLE = "PIWF_FORK_SERVER_SESSION"


class ChildKind(str, Enum):
    """The children the server may start; each value is the entry module it runs (the only
    modules a child may run, whatever the server asks)."""

    WORKFLOW_RUNNER = "piwf.runner.workflow_runner"
    RESOURCE_RUNNER = "piwf.runner.resource_runner"
    RESOLVER = "piwf.runner.resolver"
    VALIDATOR = "piwf.runner.validator"
    CHANNEL_ADAPTER = "piwf.runner.channel_adapter"


#: What a fork server imports once, so that no forked child pays for it: the bootstrap, every
#: entry module, and the modules those import only when they run.
FORKSERVER_PRELOAD: tuple[str, ...] = (
    CHILDREN_SESSION,
    CHILD_BOOTSTRAP,
    *(kind.value for kind in ChildKind),
    "piwf.workflow.commands",
    "piwf.workflow.engine",
    "piwf.workflow.memory",
    "piwf.workflow.validation",
    "piwf.workflow.sources",
    "piwf.runner.agent_command",
    "piwf.runner.resource_resolve",
    "piwf.resource.discovery",
    "setproctitle",
)


def enter_child(
    kind: str,
    channel: Connection,
    stdout: Connection,
    stderr: Connection,
    directory: str,
    environment: dict[str, str | None],
) -> None:
    """The ``Process`` target of every child: hand its arguments (plain values and
    connections, nothing else is pickled) to the child bootstrap, which never returns.

    ``kind`` is a :class:`ChildKind` value, ``channel`` the child's end of its duplex pipe,
    ``stdout``/``stderr`` the write ends of its capture pipes, ``directory`` its working
    directory and ``environment`` the variables to set (``None``: remove) before any child
    code runs.
    """
    bootstrap = importlib.import_module(CHILD_BOOTSTRAP)
    bootstrap.main(kind, channel, stdout, stderr, directory, environment)


_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """Return the kernel boot id (empty where the platform has none)."""
    try:
        return _BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        return ""


def start_identity(pid: int) -> str | None:
    """Return the start identity of a live process, or None when it does not exist."""
    try:
        created = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return f"{pid}:{created:.3f}:{boot_id()}"


def own_identity() -> str:
    """Return this process's start identity."""
    identity = start_identity(os.getpid())
    assert identity is not None
    return identity


def is_alive(identity: str) -> bool:
    """Whether the exact process recorded as ``identity`` still runs."""
    pid_text, _, _ = identity.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    current = start_identity(pid)
    if current is None:
        return False
    if current != identity:
        return False
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def has_file_open(identity: str, path: Path) -> bool:
    """Whether the exact process recorded as ``identity`` has the file at ``path`` open (the
    same file: device and inode, whatever name it was opened by). A process whose files cannot
    be listed (another user's) counts as having it open: only a proof of absence is False."""
    try:
        wanted = path.stat()
        process = process_of(identity)
        if process is None:
            return False
        opened = process.open_files()
    except psutil.AccessDenied:
        return True
    except (OSError, psutil.Error):
        return False
    for entry in opened:
        with contextlib.suppress(OSError):
            found = Path(entry.path).stat()
            if (found.st_dev, found.st_ino) == (wanted.st_dev, wanted.st_ino):
                return True
    return False


def kill_orphan_groups(pids: list[int], timeout_s: float = 2.0) -> None:
    """SIGKILL each process group, then wait (bounded, for all at once) until each is gone.

    An orphan of a dead server is no child of this one: only its new parent reaps it, so a
    zombie counts as gone (it can no longer act). Waiting one by one would cost a restart the
    reaping delay of every orphan in turn.
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    pending = set(pids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    pending.discard(pid)
            except psutil.NoSuchProcess:
                pending.discard(pid)
        if pending:
            time.sleep(0.01)  # a bounded poll of processes we cannot wait on


def kill_own_children(command: str, timeout_s: float) -> None:
    """SIGKILL every child of this process whose command line (its parts joined by spaces,
    as a title set with ``setproctitle`` reads back split at them) contains ``command`` and wait
    (bounded) until each is dead, without reaping it: its zombie is left to whoever started it
    (a standard-library helper is reaped by the module that launched it)."""
    killed = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if command in " ".join(child.cmdline()):
                    child.kill()
                    killed.append(child)
    deadline = time.monotonic() + timeout_s
    while killed and time.monotonic() < deadline:
        killed = [child for child in killed if not _dead(child)]
        if killed:
            time.sleep(0.01)  # a bounded poll of processes that must not be reaped here


def _dead(process: psutil.Process) -> bool:
    try:
        return bool(process.status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return True


# -- process trees ------------------------------------------------------------------------------
#
# A tree is walked from a root whose identity is proven, and every process in it is held as a
# psutil handle that remembers its create time: psutil refuses to signal a handle whose pid now
# names another process, so nothing here can reach a process that is not provably a descendant.

#: Rounds of "walk the tree again, stop what is new" before a tree counts as frozen.
_FREEZE_ROUNDS = 8


def process_of(identity: str | None) -> psutil.Process | None:
    """The live process recorded as ``identity`` (None when it is gone or was never known)."""
    if identity is None:
        return None
    pid_text, _, _ = identity.partition(":")
    try:
        process = psutil.Process(int(pid_text))
    except (ValueError, psutil.Error):
        return None
    if start_identity_of(process) != identity:
        return None
    return process


def start_identity_of(process: psutil.Process) -> str | None:
    """``pid:create_time:boot_id`` of a psutil handle (None when it is gone)."""
    try:
        return f"{process.pid}:{process.create_time():.3f}:{boot_id()}"
    except psutil.Error:
        return None


def descendants(root: psutil.Process) -> list[psutil.Process]:
    """Every live descendant of ``root`` now (empty when ``root`` is gone or its pid reused)."""
    try:
        return [p for p in root.children(recursive=True) if not is_gone(p)]
    except psutil.Error:
        return []


def is_gone(process: psutil.Process) -> bool:
    """Whether ``process`` can no longer act: ended, a zombie, or its pid names another."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def signal_processes(processes: list[psutil.Process], number: signal.Signals) -> None:
    """Send ``number`` to each process still running as itself (a reused pid is skipped)."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(number)


def freeze_tree(root: psutil.Process) -> list[psutil.Process]:
    """SIGSTOP every descendant of ``root``, walking again until no new one appears (bounded),
    and return them: a stopped process can start no other, so a SIGKILL that follows leaves
    none behind, even one that left ``root``'s process group."""
    frozen: dict[tuple[int, float], psutil.Process] = {}
    for _ in range(_FREEZE_ROUNDS):
        fresh = {key: p for p in descendants(root) if (key := _key(p)) not in frozen}
        if not fresh:
            break
        signal_processes(list(fresh.values()), signal.SIGSTOP)
        frozen.update(fresh)
    return list(frozen.values())


# -- agent command groups ---------------------------------------------------------------------
#
# A headless agent command runs in its own process group, led by the command itself (pgid =
# its pid). Its runner ends the group; the server ends it when the runner ended first. A group
# number is a pid: it names this group only while the leader is that exact process (even a
# zombie still holds its number) or while the group has members (the kernel never hands out a
# pid that is still some group's number). So a recorded group is killed only when its leader
# is provably itself, or when no process at all has that pid now; a pid reused by another
# process means the group is gone and nothing is signalled.


def is_direct_child(identity: str, parent_pid: int) -> bool:
    """Whether the process recorded as ``identity`` exists (a zombie counts: its parent has not
    reaped it) and is a direct child of ``parent_pid``."""
    process = process_of(identity)
    if process is None:
        return False
    try:
        return bool(process.ppid() == parent_pid)
    except psutil.Error:
        return False


def leads_own_group(identity: str) -> bool:
    """Whether the process recorded as ``identity`` leads its own process group."""
    process = process_of(identity)
    if process is None:
        return False
    try:
        return bool(os.getpgid(process.pid) == process.pid)
    except OSError:
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    """The processes of group ``pgid`` that can still act (zombies excluded)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == pgid and not is_gone(process):
                found.append(process)
    return found


def end_own_group(pgid: int, grace_s: float) -> None:
    """SIGTERM process group ``pgid``, wait up to ``grace_s`` for it to empty, then freeze and
    SIGKILL what is left. Only for a group whose leader is the caller's own unreaped child, so
    the number is provably that group's (see above)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)  # a bounded poll of processes that are not all the caller's children
    for number in (signal.SIGSTOP, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, number)


def kill_recorded_group(pid: int, identity: str, pgid: int) -> bool:
    """SIGKILL the recorded agent group (leader ``pid``/``identity``, group ``pgid``) of a
    runner that ended first, when that is provably still it; return whether it was signalled.

    The leader runs (or is a zombie) as exactly ``identity``: its descendants are frozen, then
    the group and every frozen descendant get SIGKILL. No process has ``pid`` any more: the
    group, if it still has members, is that group (its number cannot have been reused), and it
    gets SIGKILL. Another process has ``pid`` now: the pid was reused, so the group has no
    member left, and nothing is signalled.
    """
    leader = process_of(identity)
    if leader is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGSTOP)
        frozen = freeze_tree(leader)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        signal_processes([leader, *frozen], signal.SIGKILL)
        return True
    if psutil.pid_exists(pid):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _key(process: psutil.Process) -> tuple[int, float]:
    """A process handle's identity within this boot (psutil caches the create time)."""
    try:
        return process.pid, process.create_time()
    except psutil.Error:
        return process.pid, 0.0
