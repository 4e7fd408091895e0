"""Each node attempt's captured output in its own file: the server half of attempt logs.

One :class:`AttemptOutput` per runner session moves that runner's capture
(:class:`~piwf.server.children.capture.OutputCapture`) between targets as the runner reports
its nodes, around the call that reports them::

    node_started ─▶ drain ─▶ apply (+ open_log: the row, its log number, its file name)
                          ─▶ commit ─▶ switch to the attempt's file
    node_finished | node_failed ─▶ drain ─▶ apply (+ record_counts of that attempt)
                          ─▶ commit ─▶ switch back to the runner log
    process.register of another attempt's agent request (a resumed turn: the new runner
                   reported no node_started) ─▶ commit ─▶ drain ─▶ switch to that attempt's file
    runner exit ─▶ (the capture drained when it closed) record_counts of the attempt still
                   current, inside the exit's transaction

The runner flushes its ``sys.stdout``/``sys.stderr`` before it sends each of these calls, so
what a node printed is in the pipes before the call and the drain moves it to the target it was
written for. Only the server writes the files (under ``$PIWF_HOME/logs/``, directories
``0700``, files ``0600``), each made when its attempt's first byte arrives (an attempt that
prints nothing has a row and no file; readers take a missing file as empty); a child never
does. Nothing of their bytes goes to the server log: a failure to create a file is logged by
its error class, and the output then stays in the runner log. Counts are stored only when
they changed.
"""

from __future__ import annotations

from pathlib import Path

from piwf.config import ensure_private_dir
from piwf.server.children.capture import LogTarget, OutputCapture
from piwf.state import StateDatabase, Transaction
from piwf.state.enums import RunnerMessageOutcome
from piwf.state.execution import attempt_logs
from piwf.state.execution.attempts import attempt_id_for
from piwf.workflow import port

_SUCCESS = (RunnerMessageOutcome.ACCEPTED, RunnerMessageOutcome.ADOPTED)

#: The port messages that move the capture between targets.
NODE_MESSAGES = (port.NodeStarted, port.NodeFinished, port.NodeFailed)


class AttemptOutput:
    """Attributes one runner's captured output to the node attempt that was running."""

    def __init__(self, home: Path, capture: OutputCapture, run_id: str) -> None:
        self.home = home
        self.capture = capture
        self.run_id = run_id
        #: The attempt whose file receives the output now, and the file it opened.
        self.attempt_id: str | None = None
        self._opened: attempt_logs.AttemptLogRow | None = None

    def before(self, message: object) -> None:
        """Before a node message is applied: read what the pipes hold into the target that is
        current (the runner flushed before it sent the message)."""
        if isinstance(message, NODE_MESSAGES):
            self.capture.drain()

    def within(self, tx: Transaction, message: object, outcome: RunnerMessageOutcome) -> None:
        """Inside the node message's own transaction, after it was applied with ``outcome``:
        open the started attempt's log row, or store the counts of the attempt that ended."""
        if outcome not in _SUCCESS:
            return
        if isinstance(message, port.NodeStarted):
            attempt_id = attempt_id_for(
                message.run_id, message.path, message.visit, message.attempt
            )
            if attempt_id != self.attempt_id:
                self.record(tx)  # an attempt that ended without its own message (defensive)
            self._opened = attempt_logs.open_log(tx, attempt_id, self.run_id)
        elif isinstance(message, (port.NodeFinished, port.NodeFailed)):
            self.record(tx)

    def after(self, message: object, outcome: RunnerMessageOutcome) -> None:
        """Once the node message's transaction committed: switch the capture's target."""
        if outcome not in _SUCCESS or not isinstance(message, NODE_MESSAGES):
            return
        opened, self._opened = self._opened, None
        if isinstance(message, port.NodeStarted) and opened is not None:
            if opened.attempt_id == self.attempt_id:
                return  # the same attempt again (a repeated call): its file stays current
            self._open_target(opened)
            return
        self._stop_target()

    def follow_turn(self, db: StateDatabase, attempt_id: str) -> None:
        """An agent turn of ``attempt_id`` was registered (committed): send the output to that
        attempt's file from now on. A turn in the node's own visit changes nothing; a resumed
        turn (a new runner goes on with a waiting attempt, so no ``node_started`` comes first)
        gets its attempt's file, appended to, instead of the runner log. An attempt with no
        log row (none was opened for it) leaves the output where it goes."""
        if attempt_id == self.attempt_id:
            return
        with db.read() as tx:
            row = attempt_logs.read_log(tx, attempt_id)
        if row is None or row.run_id != self.run_id:
            return
        self.capture.drain()  # what came before the turn stays where it was written for
        self._open_target(row)

    def record(self, tx: Transaction) -> None:
        """Store the counts of the attempt whose file is current (inside ``tx``), when it
        wrote since they were last stored; its runner exit calls this too, after the capture
        drained at close."""
        target = self.capture.target
        if self.attempt_id is None or target is None:
            return
        target.flush_tail()
        if target.changed:
            attempt_logs.record_counts(tx, self.attempt_id, target.counts)
            target.recorded = target.counts

    def _open_target(self, row: attempt_logs.AttemptLogRow) -> None:
        """Send the output to the attempt's file from now on (made on its first byte)."""
        self._stop_target()
        path = self.home / row.log_file

        def make_directories() -> None:
            ensure_private_dir(self.home / attempt_logs.LOGS_DIR)
            ensure_private_dir(path.parent)

        label = f"attempt log {row.log_number} of run {self.run_id}"
        target = LogTarget(path, label=label, counts=row.counts, prepare=make_directories)
        self.attempt_id = row.attempt_id
        self.capture.switch(target)

    def _stop_target(self) -> None:
        previous = self.capture.switch(None)
        if previous is not None and self.attempt_id is not None:
            previous.flush_tail()  # its counts were stored with the tail (record), or never are
        self.attempt_id = None
