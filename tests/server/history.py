"""Client histories for crash tests (Jepsen's invoke / ok / fail / info).

A :class:`History` sends each durable command over a fresh connection and records what the
client learned: ``ok`` (accepted or adopted), ``fail`` (any other answer) or ``info`` (the
connection broke first: the command may or may not have committed). After the crashes,
:meth:`History.check` holds the server to the contract of the client protocol:

- ok ⇒ durable: the receipt exists, with the change it acknowledged;
- fail ⇒ absent: no accepted receipt and no change (a refused start created no run);
- info ⇒ all or nothing: a retry with the same key and payload is ``ok``, and a retried start
  still owns exactly one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from piwf.state import StateDatabase
from tests.server.harness import RawClient, ServerProcess

CLIENT_ID = "workload"
SUCCESS = {"accepted", "adopted"}


@dataclass(frozen=True)
class Command:
    """One durable command of a workload, identified by its idempotency key."""

    key: str
    operation: str
    payload: dict[str, Any]
    run_key: str | None = None  # the start command whose run this command targets


@dataclass
class History:
    """Every invoke and completion, in order; ``run_ids`` maps start keys to their runs."""

    events: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, key, outcome)
    run_ids: dict[str, str] = field(default_factory=dict)

    def invoke(self, server: ServerProcess, command: Command) -> bool:
        """Send ``command``; return False when the connection broke (recorded as ``info``)."""
        run_id = None
        if command.run_key is not None:
            run_id = self.run_ids.get(command.run_key)
            if run_id is None:
                return True  # its run is unknown yet: nothing to send this round
        self.events.append(("invoke", command.key, ""))
        request_id = f"{command.key}-{len(self.events)}"  # every attempt has a new request id
        try:
            client = RawClient(server.socket_path, CLIENT_ID)
        except OSError:
            self.events.append(("info", command.key, "connect"))
            return False
        try:
            response = client.request(
                command.operation,
                command.payload,
                key=command.key,
                run_id=run_id,
                request_id=request_id,
            )
        except (OSError, ConnectionError):
            self.events.append(("info", command.key, "broken"))
            return False
        finally:
            client.close()
        kind = "ok" if response.outcome in SUCCESS else "fail"
        self.events.append((kind, command.key, response.outcome))
        receipt = response.receipt or {}
        if kind == "ok" and command.operation == "run.start":
            self.run_ids[command.key] = receipt["run"]["runId"]
        return True

    def run(self, server: ServerProcess, commands: list[Command]) -> None:
        """Send the workload in order until the server goes away."""
        for command in commands:
            if not self.invoke(server, command):
                return

    def completions(self, key: str) -> list[str]:
        return [kind for kind, event_key, _ in self.events if event_key == key and kind != "invoke"]

    def check(self, server: ServerProcess, commands: list[Command]) -> None:
        """Hold the durable state to every completion (see the module docstring)."""
        # info ⇒ all or nothing: the retry must settle it as ok (a commit it adopts, or a
        # first commit now); a fail stays a fail.
        for command in commands:
            kinds = self.completions(command.key)
            if kinds and kinds[-1] == "info":
                assert self.invoke(server, command), command.key
                assert self.completions(command.key)[-1] in {"ok", "fail"}, command.key
        receipts = self._receipts(server.home)
        for command in commands:
            kinds = self.completions(command.key)
            receipt = receipts.get(command.key)
            if "ok" in kinds:
                assert receipt is not None, f"{command.key}: ok but no receipt"
                assert receipt[0] == "accepted", f"{command.key}: ok but {receipt[0]}"
                if command.operation == "run.start":
                    assert receipt[1] == self.run_ids[command.key], command.key
            elif "fail" in kinds:
                assert receipt is None or receipt[0] not in SUCCESS, f"{command.key}: fail"
                if command.operation == "run.start":
                    assert receipt is None or receipt[1] is None, f"{command.key}: fail, a run"

    @staticmethod
    def _receipts(home: Path) -> dict[str, tuple[str, str | None]]:
        with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
            rows = tx.all(
                "SELECT idempotency_key, outcome, run_id FROM server_commands WHERE client_id = ?",
                (CLIENT_ID,),
            )
            return {row[0]: (row[1], row[2]) for row in rows}
