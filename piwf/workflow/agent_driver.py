"""The headless agent seam: how the engine hands an open agent request to whatever runs agents.

The engine stays free of processes. An agent visit commits its request through the port first;
then, when the engine was given an :class:`AgentDriver`, it asks the driver to fulfil that
request, and without one (the default) the run parks ``waiting`` for an outside submission::

    engine ─request_interaction─▶ port           the request is durable before anything runs
           ─drive(AgentTurn)─────▶ driver ─▶ None            nothing to run: park waiting
                                          ─▶ AgentAccepted   a submission was accepted (its
                                                             value is the node output)
                                          ─▶ AgentExpired    the active-time deadline passed
                                                             (the visit ends ``timed_out``)
                                          ─▶ AgentFailed     the attempt fails with this error

A visit that resumes an open, unanswered agent request (a runner relaunched after a crash, a
pause) asks again with ``resumed=True``. The workflow runner's driver runs the configured agent
command (:mod:`piwf.runner.agent_command`); a dry run (:func:`piwf.workflow.memory.
run_in_memory`) can pass one that answers through its port. A driver may raise what the port
raises (claim loss); the engine lets it propagate like any port error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeAlias

from piwf.canonical import JsonValue


@dataclass(frozen=True)
class AgentTurn:
    """One open agent request to fulfil.

    ``command`` is the node's own agent command (``agent(command=...)``), None when it names
    none; ``prompt`` is the prompt the visit computed (the server's stored prompt, with its
    step contract, is what a command is given).
    """

    run_id: str
    request_id: str
    path: str
    visit: int
    attempt: int
    command: tuple[str, ...] | None
    prompt: str
    resumed: bool = False


@dataclass(frozen=True)
class AgentAccepted:
    """A submission for the request was accepted; ``value`` is the (validated) output."""

    value: JsonValue


@dataclass(frozen=True)
class AgentExpired:
    """The request's active-time deadline passed before an accepted submission."""

    detail: str


@dataclass(frozen=True)
class AgentFailed:
    """The attempt fails: ``error`` says what happened and what to do (it starts with an error
    code such as ``missingSubmission``)."""

    error: str


AgentOutcome: TypeAlias = AgentAccepted | AgentExpired | AgentFailed


class AgentDriver(Protocol):
    """Runs agents for the engine's open agent requests."""

    def drive(self, turn: AgentTurn) -> AgentOutcome | None:
        """Fulfil ``turn`` and say how it ended, or return None when there is nothing to run
        for it (the run then parks ``waiting`` for an outside submission)."""
        ...
