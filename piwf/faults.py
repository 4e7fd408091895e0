"""Named fault points: a no-op unless ``PIWF_FAULTS`` arms them (crash and failure tests).

Production code calls ``faults.point("cmd.after_commit_before_reply")`` at commit boundaries.
Tests arm points through the environment of the process they start::

    PIWF_FAULTS="cmd.after_commit_before_reply@1=kill;runner.mid_step@2+=exit"

``@N`` fires on the Nth hit only, ``@N+`` on every hit from the Nth on (SQLite's two modes).
Actions: ``kill`` (SIGKILL self), ``exit`` (``os._exit(70)``), ``raise``
(:class:`FaultInjectedError`), ``ioerror`` / ``busy`` (an ``sqlite3.OperationalError`` like
SQLite's own), ``delay:MS``, ``stop`` (SIGSTOP self) and ``drop`` (:class:`FaultDropError`:
the caller closes its connection).
When ``PIWF_FAULTS_LOG`` names a file, every hit of an armed point is appended to it (and
fsynced) before the action runs, so a test can tell which points were reached.

Supervised children do not inherit the server's ``PIWF_FAULTS``: the server hands them
``PIWF_CHILD_FAULTS`` (when set) as their ``PIWF_FAULTS``, so a test arms a runner child's points
(``child.*``, ``effect.before_settle``) without arming the server's.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass

#: Every point name piwf code may hit; a test checks each appears in the code.
POINTS: frozenset[str] = frozenset(
    {
        "cmd.after_parse",
        "cmd.before_commit",
        "cmd.after_commit_before_reply",
        "server.after_epoch",
        "server.before_listen",
        "server.before_release",
        "backup.before_link",
        "run.after_claim_commit",
        "runner.after_launch_record",
        "runner.after_message_commit",
        "runner.after_exit_commit",
        "recovery.after_each_fix",
        "deadline.before_stop",
        "retention.after_tree_delete",
        "retention.before_vacuum",
        # In supervised children, armed by PIWF_CHILD_FAULTS (each child counts its own hits).
        "resolver.before_reply",
        "child.after_ready",
        "child.after_commit",
        "effect.before_settle",
        "channel.after_poll",
        # In the server: a chat update applied in its transaction, not yet committed.
        "channel.before_answer_commit",
        # In piwf view: each list of runs it shows (a crash inside the viewer).
        "viewer.show_runs",
    }
)

ACTIONS = ("kill", "exit", "raise", "ioerror", "busy", "delay", "stop", "drop")


class FaultInjectedError(RuntimeError):
    """Raised by the ``raise`` action."""


class FaultDropError(RuntimeError):
    """Raised by the ``drop`` action: the caller drops the connection it is serving."""


@dataclass(frozen=True)
class _Arm:
    point: str
    hit: int
    persistent: bool
    action: str
    argument: int


def _parse(spec: str) -> list[_Arm]:
    arms: list[_Arm] = []
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        target, _, action_text = item.partition("=")
        name, _, count_text = target.partition("@")
        persistent = count_text.endswith("+")
        count = int(count_text.rstrip("+") or "1")
        action, _, argument = action_text.partition(":")
        if action not in ACTIONS or count < 1 or not name:
            raise ValueError(f"bad PIWF_FAULTS entry {item!r}")
        arms.append(_Arm(name, count, persistent, action, int(argument or "0")))
    return arms


_ARMS = _parse(os.environ.get("PIWF_FAULTS", ""))
_HITS: Counter[str] = Counter()


def arm(spec: str) -> None:
    """Replace the armed points with ``spec`` (the ``PIWF_FAULTS`` syntax) and reset counts."""
    global _ARMS
    _ARMS = _parse(spec)
    _HITS.clear()


def point(name: str) -> None:
    """Mark fault point ``name``; act only if ``PIWF_FAULTS`` armed it for this hit."""
    if not _ARMS:
        return
    _HITS[name] += 1
    count = _HITS[name]
    for arm in _ARMS:
        if arm.point == name and (count == arm.hit or (arm.persistent and count >= arm.hit)):
            _log(f"{name} {count} {arm.action}")
            _act(arm)


def hits(name: str) -> int:
    """Return how many times an armed process hit ``name`` (0 when nothing is armed)."""
    return _HITS[name]


def _log(line: str) -> None:
    path = os.environ.get("PIWF_FAULTS_LOG")
    if not path:
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(descriptor, f"{os.getpid()} {line}\n".encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _act(arm: _Arm) -> None:
    if arm.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif arm.action == "exit":
        os._exit(70)
    elif arm.action == "raise":
        raise FaultInjectedError(f"fault injected at {arm.point}")
    elif arm.action == "ioerror":
        raise sqlite3.OperationalError("disk I/O error")
    elif arm.action == "busy":
        raise sqlite3.OperationalError("database is locked")
    elif arm.action == "delay":
        time.sleep(arm.argument / 1000)
    elif arm.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif arm.action == "drop":
        raise FaultDropError(f"connection dropped at {arm.point}")
