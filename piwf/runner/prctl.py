"""Two Linux process controls, through ``prctl(2)`` by ``ctypes``; elsewhere both do nothing.

- :func:`die_with_parent`: ``PR_SET_PDEATHSIG``, the signal the kernel sends this process when
  the thread that started it ends. It is set after the parent may already have gone, so the
  parent is compared afterwards: a mismatch means the signal will never come.
- :func:`become_subreaper`: ``PR_SET_CHILD_SUBREAPER``, so an orphaned descendant (a
  double-forked, ``setsid``-ed daemon) is reparented to this process instead of to init, and
  stays in its tree where it can be found and ended.

Neither starts a thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

#: Whether this platform has the controls (other platforms rely on the lifeline thread alone).
AVAILABLE = sys.platform.startswith("linux")


def die_with_parent(number: signal.Signals, expected_parent: int | None) -> bool:
    """Ask for ``number`` when the parent ends; return False when the parent is already gone.

    ``expected_parent`` is the pid that started this process (None: whatever parent it has
    now). On other platforms nothing is set and only the parent check is made.
    """
    parent = os.getppid() if expected_parent is None else expected_parent
    if AVAILABLE:
        _prctl(_PR_SET_PDEATHSIG, int(number))
    return os.getppid() == parent


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants; False where the platform cannot."""
    return AVAILABLE and _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.prctl
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has prctl
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    call.restype = ctypes.c_int
    return bool(call(option, value, 0, 0, 0) == 0)
