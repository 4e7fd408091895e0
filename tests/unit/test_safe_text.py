"""The escapes that keep stored text from driving the terminal (piwf/cli/safe_text.py)."""

from __future__ import annotations

import pytest

from piwf.cli.safe_text import log_text, one_line, printable

BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


@pytest.mark.parametrize("escape", [one_line, printable, log_text])
def test_every_bidirectional_control_shows_as_its_escape(escape: object) -> None:
    assert callable(escape)
    shown = escape(f"a{BIDI_CONTROLS}b")
    assert shown == "a" + "".join(f"\\u{ord(c):04x}" for c in BIDI_CONTROLS) + "b"
    assert all(character not in shown for character in BIDI_CONTROLS)


def test_each_function_keeps_only_its_own_layout_characters() -> None:
    text = "x\ny\tz\x1b[31m\r\u2028"
    assert one_line(text) == "x\\ny\\tz\\x1b[31m\\r\\u2028"
    assert printable(text) == "x\ny\\tz\\x1b[31m\\r\\u2028"
    assert log_text(text) == "x\ny\tz\\x1b[31m\\r\\u2028"


def test_other_text_is_left_as_it_is() -> None:
    text = "café 😀 👩\u200d💻 日本語 \u00ad"  # a joiner and a soft hyphen are not controls
    assert one_line(text) == printable(text) == log_text(text) == text
