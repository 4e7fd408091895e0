"""A server's first fork server and resource tracker are forks of the server, not new
interpreters.

The standard library starts a fork server as a new interpreter (``python -c "from
multiprocessing.forkserver import main; main(...)"``) that imports the children's modules
(:data:`~piwf.processes.FORKSERVER_PRELOAD`) from nothing: about 0.3 s of CPU, most of it
pydantic and the protocol models the server has just imported itself. Within
:func:`fork_helpers_from_here`, that start forks the calling process instead, which
``piwf server run`` does once the server's imports are done and before it opens anything: no
instance lock, database, socket, log or thread exists yet, so the fork inherits nothing of the
server's but imported modules and the settings it read.

The forked copy then makes itself what the new interpreter would have been: it closes every
descriptor but the standard three and the two the fork server is handed, puts every Python
signal handler back to its default, takes the new interpreter's command line as its title
(``ps`` shows it, and the server finds its fork server by it:
:func:`~piwf.processes.kill_own_children`), drops the server's and the CLI's own modules
(and click) from ``sys.modules``, leads the children's session
(:mod:`piwf.runner.children_session`), imports what the server had not, moves every object it
holds out of the garbage collector's reach (``gc.freeze``: a child's collections then never
write to the pages it shares with the fork server), and runs the standard library's ``main``
with the same arguments (read from that command line as literals, never run as code). It ends
with ``os._exit``, never through the server's exit handlers. Everything else is the standard
library's: the fork server's address, its "alive" pipe, how it forks children and reports their
pids and exit statuses.

The resource tracker (``python -c "from multiprocessing.resource_tracker import main;
main(FD)"``, which ``forkserver.ensure_running`` starts first) is forked the same way within
the block: about 50 ms of CPU for a new interpreter that imports ``multiprocessing``, against
a fork. It closes the same descriptors, puts the same signal handlers back, takes its command
line as its title, and runs the standard library's tracker ``main`` with the descriptor read
from that command line as a literal, ending with ``os._exit``. It imports nothing more.

Only that first start forks. A fork server or a tracker started later (one that died or
stopped answering is replaced) is a new interpreter as before: by then the server holds its
database and its sockets. A process with more than one thread never forks here either.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import forkserver, resource_tracker, util
from pathlib import Path
from typing import Any

from piwf.processes import CHILDREN_SESSION, FORKSERVER_PRELOAD

#: The packages of the server's own modules, dropped from a forked fork server.
_SERVER_ONLY_PACKAGES = ("click", "piwf.server", "piwf.cli")
#: How the standard library's fork server command begins (``forkserver.ensure_running``).
FORK_SERVER_COMMAND = "from multiprocessing.forkserver import main"
#: How its resource tracker's command begins (``resource_tracker.ensure_running``).
RESOURCE_TRACKER_COMMAND = "from multiprocessing.resource_tracker import main"


@contextlib.contextmanager
def fork_helpers_from_here() -> Iterator[None]:
    """Within the block, a fork server or a resource tracker the standard library starts
    (``util.spawnv_passfds`` with its command) is a fork of this process (see the module
    docstring). Any other start, and every start while this process has more than one
    thread, goes to the standard library unchanged. Call it from the main thread only."""
    original = util.spawnv_passfds

    def start(path: bytes, args: Sequence[Any], passfds: Sequence[int]) -> int:
        if threading.active_count() == 1:
            server_arguments = _fork_server_arguments(args)
            if server_arguments is not None:
                return _fork(args, passfds, lambda: _become_fork_server(server_arguments))
            tracker_arguments = _helper_arguments(args, RESOURCE_TRACKER_COMMAND)
            if tracker_arguments is not None:
                return _fork(args, passfds, lambda: _become_tracker(tracker_arguments))
        return int(original(path, args, passfds))

    util.spawnv_passfds = start
    try:
        yield
    finally:
        util.spawnv_passfds = original


def _text(part: Any) -> str:
    """One argument as the command line shows it (the executable comes as bytes)."""
    return os.fsdecode(part) if isinstance(part, (bytes, str)) else str(part)


def is_fork_server(command_line: Sequence[str]) -> bool:
    """Whether a process with this command line (``psutil.Process.cmdline()``) runs a fork
    server, started either way: a title set by the fork reads back split at its spaces."""
    return FORK_SERVER_COMMAND in " ".join(command_line)


#: The arguments of the standard library's fork server ``main``: positional and keyword.
_MainArguments = tuple[list[Any], dict[str, Any]]


def _fork_server_arguments(args: Sequence[Any]) -> _MainArguments | None:
    """The arguments ``args`` (a new interpreter's ``-c`` program) would call the fork
    server's ``main`` with, read as literals (never run); None for any other program."""
    return _helper_arguments(args, FORK_SERVER_COMMAND)


def _helper_arguments(args: Sequence[Any], helper_command: str) -> _MainArguments | None:
    """The arguments ``args`` (a new interpreter's ``-c`` program beginning with
    ``helper_command``) would call that helper's ``main`` with, read as literals (never run);
    None for any other program."""
    try:
        command = args[list(args).index("-c") + 1]
    except (ValueError, IndexError):
        return None
    if not isinstance(command, str) or not command.startswith(helper_command):
        return None
    try:
        statements = ast.parse(command).body
        call = statements[-1].value if isinstance(statements[-1], ast.Expr) else None
        if not isinstance(call, ast.Call):
            return None
        positional = [ast.literal_eval(argument) for argument in call.args]
        keywords: dict[str, Any] = {}
        for keyword in call.keywords:
            value = ast.literal_eval(keyword.value)
            keywords.update(value if keyword.arg is None else {keyword.arg: value})
    except (SyntaxError, ValueError, TypeError, IndexError):
        return None
    return positional, keywords


def _fork(args: Sequence[Any], passfds: Sequence[int], become: Callable[[], None]) -> int:
    """Fork; in the parent return the child's pid. The child makes itself what a new
    interpreter running ``args`` with only ``passfds`` would start as (descriptors, signal
    handlers, title), runs ``become`` and never returns."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid != 0:
        return pid
    code = 1
    try:
        _close_descriptors(keep={0, 1, 2, *passfds})
        _default_signal_handlers()
        _take_title(" ".join(_text(part) for part in args))
        become()
        code = 0
    except SystemExit as stop:  # how the fork server ends, once no one holds its "alive" pipe
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _become_fork_server(arguments: _MainArguments) -> None:
    _forget_server_modules()
    children_session = importlib.import_module(CHILDREN_SESSION)
    children_session.lead_children_session()  # a no-op when its import just did it
    for name in FORKSERVER_PRELOAD:
        with contextlib.suppress(ImportError):  # as the standard library's main skips one
            importlib.import_module(name)
    gc.collect()
    gc.freeze()
    positional, keywords = arguments
    forkserver.main(*positional, **keywords)


def _become_tracker(arguments: _MainArguments) -> None:
    """Run the standard library's resource tracker until every holder of its pipe closed it."""
    positional, keywords = arguments
    resource_tracker.main(*positional, **keywords)


def _forget_server_modules() -> None:
    """Drop the modules only the server uses (the server's and the CLI's packages, click)
    from ``sys.modules``, so that a child sees the modules a new fork server would have had:
    a workflow's ``import click`` imports it (or the project's own module of that name) as
    before. No module a child uses refers to them (the import rules of DESIGN.md §2)."""
    for name in list(sys.modules):
        if any(
            name == package or name.startswith(f"{package}.") for package in _SERVER_ONLY_PACKAGES
        ):
            del sys.modules[name]
    piwf = sys.modules.get("piwf")
    for attribute in ("cli", "server"):
        with contextlib.suppress(AttributeError):
            delattr(piwf, attribute)


def _close_descriptors(keep: set[int]) -> None:
    """Close every open descriptor of this process not in ``keep``."""
    try:
        opened = [int(entry.name) for entry in Path("/proc/self/fd").iterdir()]
    except OSError:  # no /proc: every descriptor this process may have
        opened = list(range(os.sysconf("SC_OPEN_MAX")))
    for descriptor in opened:
        if descriptor not in keep:
            with contextlib.suppress(OSError):
                os.close(descriptor)


def _default_signal_handlers() -> None:
    """Every signal with a Python handler gets its default action back (ignored ones stay
    ignored, as across an ``exec``); the wake-up descriptor is dropped."""
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)


def _take_title(title: str) -> None:
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(title)
