"""Running the subprocess of a ``shell`` node: no shell, bounded output, bounded time.

The child gets its own session (process group), stdin from ``/dev/null`` and pipes for stdout
and stderr. Reader threads keep at most ``max_output_chars`` characters of each stream and
drain the rest, so a chatty child can neither block nor exhaust memory. The stderr reader also
keeps the stream's last :data:`~piwf.workflow.failure.MAX_STDERR_BYTES` bytes, so a failed
command's error can show how it ended, not how it began. On the deadline or on cancellation the
whole group gets SIGTERM, then SIGKILL after a short grace.

The command's end is its own exit, not the end of its output: a process it leaves behind (a
daemon in a session of its own) may hold stdout or stderr open for ever, so once the command
has exited the readers take what arrives within :data:`DRAIN_S` and then stop. Ending such
leftovers is the runner's duty (``Lifeline.end_descendants`` at the node's end).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal as signals
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from piwf.canonical import JsonValue
from piwf.workflow.context import CancellationSignal, NodeContext, Outcome
from piwf.workflow.failure import MAX_STDERR_BYTES, tail_lines
from piwf.workflow.nodes import ShellNode

#: How often the waiting loop looks at the cancellation signal.
_POLL_S = 0.05
#: How long a group gets between SIGTERM and SIGKILL (the server's backstop for an overdue
#: node, ``piwf.server.runs.session.DEADLINE_GRACE_S``, waits longer than this).
KILL_GRACE_S = 2.0
#: How long the readers wait for the end of stdout and stderr after the command exited.
DRAIN_S = 1.0
_CHUNK = 65536


@dataclass(frozen=True)
class ShellInvocation:
    """One resolved command: executable, arguments, working directory, deadline, env."""

    command: str
    args: tuple[str, ...]
    cwd: str | None
    timeout_ms: int | None
    env: Mapping[str, str] | None


@dataclass(frozen=True)
class ShellRun:
    """How a command ended: ``stopped`` is set when it was killed on deadline or cancel.

    ``stderr_tail`` is the end of stderr (:func:`piwf.workflow.failure.tail_lines`);
    ``stderr_cut`` says that earlier stderr output is not in it.
    """

    result: dict[str, JsonValue]
    stopped: Outcome | None
    stderr_tail: str = ""
    stderr_cut: bool = False


def resolve_invocation(node: ShellNode, ctx: NodeContext) -> ShellInvocation:
    """Return the invocation of ``node``; raises ``ValueError`` for a malformed spec."""
    spec: Any = node.command(ctx) if callable(node.command) else list(node.command)
    if isinstance(spec, (list, tuple)):
        spec = {"command": spec[0] if spec else "", "args": list(spec[1:])}
    if not isinstance(spec, Mapping) or not set(spec) <= {
        "command",
        "args",
        "cwd",
        "timeout_ms",
        "env",
    }:
        raise ValueError(
            "shell command must be an argv list or {'command', 'args', 'cwd', 'timeout_ms', 'env'}"
        )
    command, args = spec.get("command"), spec.get("args", [])
    if not isinstance(command, str) or not command:
        raise ValueError("shell command needs a non-empty 'command' string")
    if not isinstance(args, (list, tuple)) or not all(isinstance(arg, str) for arg in args):
        raise ValueError("shell 'args' must be a list of strings")
    cwd = spec.get("cwd", node.cwd)
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError("shell 'cwd' must be a string")
    timeout = spec.get("timeout_ms")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0
    ):
        raise ValueError("shell 'timeout_ms' must be a positive integer")
    env = spec.get("env")
    if env is not None and (
        not isinstance(env, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise ValueError("shell 'env' must map strings to strings")
    return ShellInvocation(command, tuple(args), cwd, timeout, env)


def run_shell(
    invocation: ShellInvocation,
    *,
    node_timeout_ms: int | None,
    max_output_chars: int,
    signal: CancellationSignal,
) -> ShellRun:
    """Run the command to completion, deadline or cancellation.

    The deadline is the smaller of the invocation's and the node's. Raises ``OSError`` when the
    command cannot be started (nothing ran).
    """
    limits = [t for t in (invocation.timeout_ms, node_timeout_ms) if t is not None]
    deadline = time.monotonic() + min(limits) / 1000 if limits else None
    started = time.monotonic()
    process = subprocess.Popen(
        [invocation.command, *invocation.args],
        cwd=invocation.cwd,
        env=dict(invocation.env) if invocation.env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    byte_cap = max_output_chars * 4
    stdout = _Capture(process.stdout, byte_cap)
    stderr = _Capture(process.stderr, byte_cap, tail_bytes=MAX_STDERR_BYTES)
    stopped = _wait(process, deadline, signal)
    drained_by = time.monotonic() + DRAIN_S
    stdout.finish(drained_by)
    stderr.finish(drained_by)
    code = process.returncode
    out_text, out_cut = stdout.text(max_output_chars)
    err_text, err_cut = stderr.text(max_output_chars)
    result: dict[str, JsonValue] = {
        "command": invocation.command,
        "args": list(invocation.args),
        "cwd": invocation.cwd,
        "stdout": out_text,
        "stderr": err_text,
        "exit_code": code if code >= 0 else None,
        "signal": signals.Signals(-code).name if code < 0 else None,
        "duration_ms": int((time.monotonic() - started) * 1000),
        "stdout_truncated": out_cut,
        "stderr_truncated": err_cut,
    }
    tail, tail_cut = stderr.tail()
    return ShellRun(result, stopped, tail, tail_cut)


def _wait(
    process: subprocess.Popen[bytes], deadline: float | None, signal: CancellationSignal
) -> Outcome | None:
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            _stop_group(process)
            return Outcome.TIMED_OUT
        if signal.cancelled:
            _stop_group(process)
            return Outcome.CANCELLED
        step = _POLL_S if remaining is None else min(_POLL_S, remaining)
        try:
            process.wait(timeout=step)
            return None
        except subprocess.TimeoutExpired:
            continue


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signals.SIGTERM, KILL_GRACE_S), (signals.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


class _Capture:
    """Reads one stream to its end (or until :meth:`finish` gives up on it), keeping its first
    ``cap`` bytes and its last ``tail_bytes`` bytes."""

    def __init__(self, stream: IO[bytes], cap: int, *, tail_bytes: int = 0) -> None:
        self._stream = stream
        self._cap = cap
        self._parts: list[bytes] = []
        self._kept = 0
        self._dropped = False
        self._tail_bytes = tail_bytes
        self._tail = b""
        self._total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="piwf-shell-capture", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        descriptor = self._stream.fileno()
        with self._stream, selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not selector.select(_POLL_S):
                    continue
                chunk = os.read(descriptor, _CHUNK)
                if not chunk:
                    return
                self._keep(chunk)

    def _keep(self, chunk: bytes) -> None:
        self._total += len(chunk)
        if self._tail_bytes:
            self._tail = (self._tail + chunk)[-self._tail_bytes :]
        room = self._cap - self._kept
        if room > 0:
            self._parts.append(chunk[:room])
            self._kept += min(room, len(chunk))
        if len(chunk) > room:
            self._dropped = True

    def finish(self, by: float) -> None:
        """Wait for the end of the stream until the monotonic instant ``by``; then stop
        reading it (a process the command left behind still holds it open)."""
        self._thread.join(max(0.0, by - time.monotonic()))
        self._stop.set()
        self._thread.join()

    def tail(self) -> tuple[str, bool]:
        """The last lines of the stream and whether earlier output is not in them."""
        return tail_lines(self._tail, earlier_dropped=self._total > len(self._tail))

    def text(self, max_chars: int) -> tuple[str, bool]:
        text = b"".join(self._parts).decode("utf-8", errors="replace")
        if len(text) > max_chars:
            return text[:max_chars], True
        return text, self._dropped
