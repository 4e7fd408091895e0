"""A real terminal for tests of terminal programs: one tmux server and session per terminal,
running one command in a pane of a fixed size (send keys, read the screen)."""

from __future__ import annotations

import shlex
import subprocess

from tests.server.harness import wait_for


class TmuxTerminal:
    """One tmux server (its own socket) and session running ``command`` with ``env`` in a
    ``width`` x ``height`` pane; the pane stays after the command ends, showing ``EXIT=<n>``."""

    def __init__(
        self,
        socket: str,
        command: str,
        env: dict[str, str],
        *,
        width: int = 160,
        height: int = 40,
        history_lines: int = 0,
    ) -> None:
        self.socket = socket
        self.history_lines = history_lines
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        # `read` keeps the pane after the command ends, so its exit status can be read.
        # COLUMNS and LINES are dropped: where the pane inherits them (80 and 24 under pytest),
        # a program would take them for the terminal's size instead of the pane's.
        script = f"env -u COLUMNS -u LINES {exports} {command}; echo EXIT=$?; read held"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), script)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        """The pane's text (with ``history_lines`` of scrollback above it)."""
        history = ("-S", f"-{self.history_lines}") if self.history_lines else ()
        return self._tmux("capture-pane", "-p", "-J", *history, "-t", "t")

    def title(self) -> str:
        """The pane's title, as the program in it set it (an OSC 0/2 escape sets it)."""
        return self._tmux("display-message", "-p", "-t", "t", "#{pane_title}").rstrip("\n")

    def type(self, text: str) -> None:
        """Type ``text`` and press Enter."""
        self._tmux("send-keys", "-t", "t", "-l", text)
        self._tmux("send-keys", "-t", "t", "Enter")

    def press(self, key: str) -> None:
        """Press one key (tmux key names: ``q``, ``C-c``, ``Enter``)."""
        self._tmux("send-keys", "-t", "t", key)

    def interrupt(self) -> None:
        self.press("C-c")

    def wait_for_text(self, text: str, *, count: int = 1, timeout_s: float = 30.0) -> None:
        """Wait (bounded) until ``text`` shows ``count`` times on the screen."""
        try:
            wait_for(lambda: self.screen().count(text) >= count, timeout_s=timeout_s)
        except AssertionError:  # the screen as it is at the deadline, not as it was at first
            raise AssertionError(
                f"timed out after {timeout_s} s waiting for {text!r} on the screen:\n"
                + self.screen()
            ) from None

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)
