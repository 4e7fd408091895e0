"""Stored text made safe to print in the human output.

Text that a user, a workflow or an agent wrote (a run's title, a failure message, a traceback,
a node's output, an agent's prompt) may carry control characters. Printed raw, a line break
can forge a table row and a terminal escape can drive the terminal (set its title, move the
cursor, hide what follows). Each function here shows such characters as their Python escapes
(``\\n``, ``\\x1b``) and leaves every other character as it is; ``--json`` output keeps the
text as stored. The bidirectional controls (U+202E RIGHT-TO-LEFT OVERRIDE and its kin) count
as control characters too: printed raw they reorder what the terminal shows, so a name or a
path could read as another.
"""

from __future__ import annotations

import unicodedata


def one_line(text: str) -> str:
    """``text`` (a run's title: a person's or a workflow's free text) safe to print in a line or
    a table cell: each control character (a line break, a tab, a terminal escape such as ESC,
    a Unicode line or paragraph separator) shows as its Python escape (``\\n``, ``\\x1b``), so
    it cannot break the layout, forge a line or drive the terminal; other text is unchanged."""
    return _escaped(text, kept="")


def printable(text: str) -> str:
    """Free text of several lines (an error, a traceback, a node's stderr) safe to print: its
    line breaks kept, every other control character escaped as :func:`one_line` does, so no
    stored text can drive the terminal."""
    return _escaped(text, kept="\n")


def log_text(text: str) -> str:
    """What a node printed (its stdout and stderr, as ``piwf run logs`` shows it) safe to
    print: line breaks and tabs kept, every other control character (a terminal escape, a bell,
    a carriage return) escaped as :func:`one_line` does, so a node's output cannot drive the
    terminal; ``--json`` keeps the text as stored."""
    return _escaped(text, kept="\n\t")


def given(text: str, *, limit: int = 80) -> str:
    """A value the user gave on the command line, to name it back in an error: quoted, its
    control characters escaped as :func:`one_line` does and cut to ``limit`` characters (a
    pasted payload is not repeated whole)."""
    shown = one_line(text)
    if len(shown) > limit:
        shown = shown[: limit - 3] + "..."
    return f"'{shown}'"


#: The bidirectional formatting characters (embeddings, overrides, isolates, marks).
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


def _escaped(text: str, *, kept: str) -> str:
    """``text`` with each control character not in ``kept`` shown as its Python escape."""
    return "".join(
        repr(character)[1:-1] if character not in kept and _is_control(character) else character
        for character in text
    )


def _is_control(character: str) -> bool:
    return unicodedata.category(character) in ("Cc", "Zl", "Zp") or character in _BIDI_CONTROLS
