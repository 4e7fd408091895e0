"""The workflow runner's agent driver: run the configured agent command for an agent request.

The engine hands every committed agent request to :class:`CommandDriver` (the
:class:`~piwf.workflow.agent_driver.AgentDriver` of a runner). In a ``headless`` run it picks
the command (the run's ``--agent-command``, else the node's ``agent(command=...)``, else the
server's ``PIWF_AGENT_COMMAND``; none: the step waits for an outside submission) and runs
**turns** until the request is decided::

    one turn:
      private temp dir (0700) with mcp.json (0600) for this request
      start the command: its own session and process group, cwd = the project, stdin a pipe,
        stdout/stderr = this runner's captured output, environment = the runner's minus every
        PIWF_* variable, plus PIWF_REQUEST_ID, PIWF_HOME, PIWF_MCP_CONFIG
      process.register (pid, start identity, group) ─▶ turn, earlier unproductive turns,
        stored prompt, request state          (claim lost: the command is stopped, we exit)
      write the prompt (+ "Reminder N of 2: ..." from the second turn on) and close stdin
      wait for the command to exit, or for interaction.settled and then 2 s more
      end the group (SIGTERM, grace, SIGKILL) and whatever of its tree is left
      process.unregister ─▶ the request's state, unproductive turns so far
    answered ─▶ AgentAccepted(value)     expired ─▶ AgentExpired
    pending, 1 or 2 unproductive turns ─▶ another turn, a reminder
    pending, 3 unproductive turns ─▶ AgentFailed(missingSubmission ...)
    the command cannot be started ─▶ AgentFailed(agentCommand ...)

While the command's leader is this process's unreaped child (its exit is watched with
``waitid(WNOWAIT)``), its group number cannot name anything else, so ending the group is safe;
it is reaped only after the group is gone. When this runner dies instead, the server reaps the
registered group, identity-checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from piwf.config import state_home
from piwf.errors import AgentCommandError, MissingSubmissionError, RunCommandError
from piwf.processes import end_own_group, start_identity
from piwf.protocol.runner_v1 import (
    MAX_UNPRODUCTIVE_TURNS,
    Launch,
    ProcessRegistration,
    ProcessUnregistration,
    TurnEnded,
    TurnStarted,
)
from piwf.runner.workflow_runner import PipePort
from piwf.workflow.agent_driver import (
    AgentAccepted,
    AgentExpired,
    AgentFailed,
    AgentOutcome,
    AgentTurn,
)

#: How long a command may linger after its request was settled before its group is ended.
SETTLED_GRACE_S = 2.0
#: SIGTERM to SIGKILL when the group is ended.
GROUP_GRACE_S = 0.5
#: How long the end of a group waits for its leader's exit to be seen.
_EXIT_WAIT_S = 5.0
#: How long a turn waits, once its runner is being ended, for the lifeline's exit (which
#: comes within its bounded grace rounds, far sooner).
_STOPPING_WAIT_S = 30.0
#: The variables an agent command may name in its arguments (``$NAME`` or ``${NAME}``): the
#: runner substitutes exactly these, nothing else, and no shell ever runs.
_ARGUMENT_VARIABLES = ("PIWF_REQUEST_ID", "PIWF_MCP_CONFIG", "PIWF_HOME")
_VARIABLE = re.compile(
    r"\$(?:\{(" + "|".join(_ARGUMENT_VARIABLES) + r")\}|(" + "|".join(_ARGUMENT_VARIABLES) + r")"
    r"(?![A-Za-z0-9_]))"
)


def choose_command(launch: Launch, node_command: tuple[str, ...] | None) -> list[str] | None:
    """The command for a step: the run's, else the node's, else the server's; None in an
    interactive run or when none is configured."""
    if launch.execution_mode != "headless":
        return None
    for command in (launch.run_agent_command, node_command, launch.server_agent_command):
        if command:
            return list(command)
    return None


def agent_environment(
    base: Mapping[str, str], *, request_id: str, home: str, mcp_config: str
) -> dict[str, str]:
    """The command's environment: ``base`` without any ``PIWF_*`` variable, plus the three it
    needs to submit (nothing else of the run or the server: no claim, epoch or token)."""
    environment = {name: value for name, value in base.items() if not name.startswith("PIWF_")}
    environment.update(PIWF_REQUEST_ID=request_id, PIWF_HOME=home, PIWF_MCP_CONFIG=mcp_config)
    return environment


def expand_arguments(command: list[str], environment: Mapping[str, str]) -> list[str]:
    """Replace ``$PIWF_REQUEST_ID``, ``$PIWF_MCP_CONFIG`` and ``$PIWF_HOME`` (also ``${...}``)
    in each argument; anything else stays as written."""

    def value(match: re.Match[str]) -> str:
        return environment[match.group(1) or match.group(2)]

    return [_VARIABLE.sub(value, part) for part in command]


def write_mcp_config(directory: Path, *, request_id: str, home: str) -> Path:
    """Write the MCP configuration of the request's own ``piwf mcp`` server (0600)."""
    config = {
        "mcpServers": {
            "piwf": {
                "command": sys.executable,
                "args": ["-m", "piwf", "mcp", "--request", request_id],
                "env": {"PIWF_HOME": home},
            }
        }
    }
    path = directory / "mcp.json"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
        json.dump(config, stream, indent=2)
    return path


def turn_prompt(started: TurnStarted, turn: AgentTurn) -> str:
    """The stored prompt, and from the second unproductive turn on the reminder after it."""
    prompt = started.prompt or turn.prompt
    number = started.unproductive_turns
    if number == 0:
        return prompt
    rejection = started.request.rejection
    detail = (
        f"Your last submission was rejected: {rejection}"
        if rejection
        else "No submission was received."
    )
    left = MAX_UNPRODUCTIVE_TURNS - number
    return (
        f"{prompt}\n\nReminder {number} of {MAX_UNPRODUCTIVE_TURNS - 1}: this step is still "
        f"open. {detail} Submit the output for request {turn.request_id} now "
        f"(piwf submit {turn.request_id} '<json>'); after {left} more turn(s) without an "
        "accepted submission the step fails.\n"
    )


class _ExitWatch:
    """Learns when a child exits without reaping it (``waitid`` with ``WNOWAIT``).

    ``fd`` becomes readable once it exited; ``code`` is its exit status (negative: the signal).
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.code: int | None = None
        self._reader, self._writer = os.pipe()
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="piwf-agent-exit", daemon=True).start()

    @property
    def fd(self) -> int:
        return self._reader

    @property
    def exited(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)

    def close(self) -> None:
        for descriptor in (self._reader, self._writer):
            with contextlib.suppress(OSError):
                os.close(descriptor)

    def _watch(self) -> None:
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # already reaped: it has exited, its status is unknown
            info = None
        if info is not None:
            self.code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        self._done.set()
        with contextlib.suppress(OSError):
            os.write(self._writer, b"x")


class CommandDriver:
    """Runs a headless step's agent command, turn after turn, over the runner's pipe."""

    def __init__(
        self,
        port: PipePort,
        launch: Launch,
        *,
        end_descendants: Callable[[], None],
        stopping: Callable[[], bool] = lambda: False,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port
        self.launch = launch
        #: Ends every process this runner still has below it (the lifeline's).
        self.end_descendants = end_descendants
        #: Whether this runner is being ended (the lifeline's): no new turn may start then.
        self.stopping = stopping
        self.environ = os.environ if environ is None else environ

    def drive(self, turn: AgentTurn) -> AgentOutcome | None:
        """Run turns of the command until the request is decided (see the module docstring);
        None when the run has no command for this step."""
        command = choose_command(self.launch, turn.command)
        if command is None:
            return None
        while True:
            self._refuse_when_stopping()
            outcome = self._one_turn(command, turn)
            if isinstance(outcome, AgentFailed):
                return outcome
            ended, exit_code = outcome
            request = ended.request
            if request.status == "answered":
                return AgentAccepted(request.value)
            if request.status == "expired":
                return AgentExpired(
                    f"agent request {turn.request_id} reached its active-time deadline "
                    "before an output was accepted"
                )
            if request.status == "cancelled":
                return AgentFailed(f"agent request {turn.request_id} was cancelled")
            if ended.unproductive_turns >= MAX_UNPRODUCTIVE_TURNS:
                return AgentFailed(_missing_submission(turn, request.rejection, exit_code))

    def _refuse_when_stopping(self) -> None:
        """Start no agent command while this runner is being ended.

        The server stops a runner (SIGTERM) at its agent's active-time deadline; the lifeline
        thread then ends the agent's group, and this thread, seeing its command gone, would
        otherwise start the next turn's command before the lifeline ends the runner too. The
        lifeline's exit comes within its bounded grace; this never returns before it."""
        if self.stopping():
            threading.Event().wait(_STOPPING_WAIT_S)
            raise RunCommandError("the runner is being stopped; no further agent turn starts")

    def _one_turn(
        self, command: list[str], turn: AgentTurn
    ) -> tuple[TurnEnded, int | None] | AgentFailed:
        """One turn of ``command``: what the server says after it, and how its leader exited
        (negative: the signal; None: unknown); an :class:`AgentFailed` when it cannot start."""
        home = self.launch.state_home or str(state_home())
        with tempfile.TemporaryDirectory(prefix="piwf-agent-") as directory:
            config = write_mcp_config(Path(directory), request_id=turn.request_id, home=home)
            environment = agent_environment(
                self.environ, request_id=turn.request_id, home=home, mcp_config=str(config)
            )
            argv = expand_arguments(command, environment)
            self._refuse_when_stopping()
            directory = self._directory()
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    cwd=directory,
                    env=environment,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as error:
                # Named as given (before $VARIABLES expand: their values stay out of errors).
                return AgentFailed(
                    f"{AgentCommandError.code}: the agent command {command[0]!r} could "
                    f"not be started ({_why_not_started(argv[0], directory, error)}); install "
                    "it or fix --agent-command, agent(command=...) or PIWF_AGENT_COMMAND"
                )
            watch = _ExitWatch(process.pid)
            try:
                identity = start_identity(process.pid)
                if identity is None:
                    raise RunCommandError("the agent command's start identity is unreadable")
                started = self._register(turn, process.pid, identity)
                if (
                    started.request.status == "pending"
                    and started.unproductive_turns < MAX_UNPRODUCTIVE_TURNS
                ):
                    _feed(process, turn_prompt(started, turn))
                    self._wait(watch, turn.request_id)
            finally:
                self._shut_down(process, watch)
            return self._unregister(turn, identity, watch.code), watch.code

    def _directory(self) -> str:
        project = self.launch.project_path
        return project if project and Path(project).is_dir() else str(Path.cwd())

    def _register(self, turn: AgentTurn, pid: int, identity: str) -> TurnStarted:
        registration = ProcessRegistration(
            runId=turn.run_id, requestId=turn.request_id, pid=pid, startIdentity=identity, pgid=pid
        )
        response = self.port.call("process.register", registration.to_json())
        return TurnStarted.model_validate(response.result)

    def _unregister(self, turn: AgentTurn, identity: str, code: int | None) -> TurnEnded:
        unregistration = ProcessUnregistration(
            runId=turn.run_id, requestId=turn.request_id, startIdentity=identity, exitCode=code
        )
        response = self.port.call("process.unregister", unregistration.to_json())
        return TurnEnded.model_validate(response.result)

    def _wait(self, watch: _ExitWatch, request_id: str) -> None:
        """Until the command exits, or ``SETTLED_GRACE_S`` after the server said its request is
        no longer pending."""
        channel = self.port.connection
        linger_until: float | None = None
        while not watch.exited:
            if linger_until is None and request_id in self.port.settled:
                linger_until = time.monotonic() + SETTLED_GRACE_S
            timeout = None if linger_until is None else linger_until - time.monotonic()
            if timeout is not None and timeout <= 0:
                return
            readable, _, _ = select.select([channel.fileno(), watch.fd], [], [], timeout)
            if channel.fileno() in readable:
                # Between calls the server sends nothing but settled notices.
                self.port.note_settled(self.port.receive_frame())

    def _shut_down(self, process: subprocess.Popen[bytes], watch: _ExitWatch) -> None:
        """End the command's group, see its leader exit, then end and reap what is left."""
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        end_own_group(process.pid, GROUP_GRACE_S)
        watch.wait(_EXIT_WAIT_S)
        self.end_descendants()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=_EXIT_WAIT_S)
        watch.close()


def _feed(process: subprocess.Popen[bytes], prompt: str) -> None:
    """Write the prompt to the command's stdin and close it, from a thread: a command that
    never reads must not block this runner."""
    stdin = process.stdin
    assert stdin is not None

    def write() -> None:
        with contextlib.suppress(OSError, ValueError):
            stdin.write(prompt.encode("utf-8"))
            stdin.close()

    threading.Thread(target=write, name="piwf-agent-prompt", daemon=True).start()


def _why_not_started(program: str, directory: str, error: OSError) -> str:
    """The reason ``program`` could not be started: the system's, made precise where it
    misleads (a script that exists but whose ``#!`` interpreter does not, a directory, a file
    without its execute bit)."""
    reason = error.strerror or type(error).__name__
    if os.sep not in program:
        return reason  # looked up on PATH: the system's reason is the whole story
    path = Path(directory, program)
    if isinstance(error, FileNotFoundError) and path.is_file():
        return f"{reason}: the file exists, so its #! interpreter was not found"
    if isinstance(error, PermissionError) and path.is_dir():
        return f"{reason}: it is a directory"
    if isinstance(error, PermissionError) and path.is_file() and not os.access(path, os.X_OK):
        return (
            f"{reason}: the file is not executable (chmod +x it, or name its interpreter "
            "first, e.g. 'python3 SCRIPT')"
        )
    return reason


def _missing_submission(turn: AgentTurn, rejection: str | None, exit_code: int | None) -> str:
    """The error of a request whose command used its turns without an accepted submission:
    how the last turn's command exited (when known), then the latest rejection when there was
    one, else where the command's own output (a crash, a missing program or module) can be
    read."""
    last = (
        f" The last submission was rejected: {rejection}"
        if rejection
        else f" No submission was received; what the command printed: piwf run logs {turn.run_id}."
    )
    return (
        f"{MissingSubmissionError.code}: agent request {turn.request_id} ended "
        f"{MAX_UNPRODUCTIVE_TURNS} turns of its agent command (two with a reminder) without an "
        f"accepted submission.{_exit_text(exit_code)}{last} Fix the agent command or its "
        "prompt, then restart the run, or route on $result.outcome."
    )


def _exit_text(exit_code: int | None) -> str:
    """How the last turn's command exited, as a sentence (empty when unknown)."""
    if exit_code is None:
        return ""
    if exit_code >= 0:
        return f" Its last turn's command exited with status {exit_code}."
    number = -exit_code
    try:
        name = f"{signal.Signals(number).name}, "
    except ValueError:
        name = ""
    return f" Its last turn's command was ended by a signal ({name}{number})."
