"""The CLI's contract (docs/CLI.md) where outside testers found it broken: with ``--json`` one
JSON document, exit 0 ok, 1 runtime error, 2 usage error, and errors that say what to do next.

The installed script runs against a private ``PIWF_HOME`` (the fixture of
tests/cli/test_cli_e2e.py, which reaps every process of that home).
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest

from piwf import Client
from piwf._version import __version__
from piwf.client.runs import start_payload
from piwf.errors import CommandError, PiwfError, SessionError
from tests.cli.test_cli_e2e import HELLO, REPO, Piwf, piwf  # noqa: F401 - a fixture used by name
from tests.cli_process import PIWF, run_piwf
from tests.server.harness import wait_for

CHECKPOINT = "fixtures/workflows/checkpoint_review.py"


def test_effect_resolve_takes_exactly_one_of_applied_and_retry(piwf: Piwf) -> None:  # noqa: F811
    for flags in (["--applied", "--retry"], ["--retry", "--applied"], []):
        refused = piwf.json("effect", "resolve", "effect-3f2a", *flags, exit_code=2)
        assert refused["error"]["code"] == "usage"
        assert "exactly one of --applied" in refused["error"]["message"]
    assert piwf.json("server", "status") == {"state": "stopped"}, "a usage error starts nothing"


def test_a_session_and_an_agent_command_are_exclusive_everywhere(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    both = ["--session", "chat-1", "--agent-command", "echo hi"]
    refused = piwf.json("run", "start", HELLO, *both, exit_code=2)
    assert refused["error"]["code"] == "usage"
    assert "a session or an agent command, not both" in refused["error"]["message"]
    assert piwf.json("server", "status") == {"state": "stopped"}, "a usage error starts nothing"

    with Client(piwf.home) as client:
        with pytest.raises(SessionError, match="not both"):
            client.start_run(HELLO, session="chat-1", agent_command=["echo"])
        # Any client, not only this one: the server refuses the combination as a bad payload.
        wire = start_payload(
            REPO / HELLO, input=None, project=REPO, title=None, agent_command=["echo"]
        )
        with pytest.raises(PiwfError) as raised:
            client.request("run.start", {**wire, "session": "chat-1"})
        assert raised.value.code == "invalidPayload" or (
            isinstance(raised.value, CommandError) and raised.value.error_code == "invalidPayload"
        )
        assert "not both" in str(raised.value)
        assert client.list_runs().runs == []
    # Refused, the run never used the session: showing it says so (a mistyped id looks alike).
    shown = piwf.run("session", "show", "chat-1")
    assert (shown.returncode, shown.stderr) == (0, ""), shown
    assert "no run has used session chat-1 in this state home; piwf session list" in shown.stdout


def test_a_malformed_session_id_is_a_usage_error_in_every_command(
    piwf: Piwf,  # noqa: F811
) -> None:
    for session in ("", "a b", "x" * 129):
        for args in (
            ["run", "start", HELLO, "--session", session],
            ["session", "show", session],
            ["session", "attach", session],
        ):
            refused = piwf.json(*args, exit_code=2)
            assert refused["error"]["code"] == "usage", (session, args)
            assert "a session id is 1 to 128 characters" in refused["error"]["message"]


def test_version_with_json_is_one_document(piwf: Piwf) -> None:  # noqa: F811
    assert piwf.json("--version") == {"version": __version__}
    assert piwf.run("--version").stdout == f"piwf {__version__}\n"


@pytest.mark.parametrize(
    ("variable", "value", "rule"),
    [
        ("PIWF_MAX_WORKERS", "abc", "a positive integer and at most 9007199254740991"),
        ("PIWF_IDLE_EXIT_S", "xyz", "a finite number of seconds, 0 or more and at most 1000000000"),
    ],
)
def test_a_bad_environment_variable_is_named_with_what_it_takes(
    piwf: Piwf,  # noqa: F811
    variable: str,
    value: str,
    rule: str,
) -> None:
    piwf.env[variable] = value
    refused = piwf.run("server", "start")
    assert refused.returncode == 1
    assert f"{variable} must be {rule}, not '{value}'" in refused.stderr
    assert "invalid literal" not in refused.stderr and "could not convert" not in refused.stderr


def test_a_workflow_path_that_is_no_regular_file_says_so(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "flow.py"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        refused = piwf.json("run", "start", path, exit_code=1)
        assert refused["error"]["message"].startswith(f"{path}: is not a regular file")
    missing = piwf.json("run", "start", str(tmp_path / "nope.py"), exit_code=1)
    assert "no such workflow file" in missing["error"]["message"]
    # what to do next: fix the path, or use a name, and where the names are listed
    assert "check the path" in missing["error"]["message"]
    assert "piwf workflows list" in missing["error"]["message"]


def test_answer_reads_its_response_from_stdin_with_a_dash(piwf: Piwf) -> None:  # noqa: F811
    started = piwf.json("run", "start", CHECKPOINT, "--input", '{"steps": ["a"]}')
    run_id = started["run"]["runId"]
    request = wait_for(
        lambda: (piwf.json("requests", "--run", run_id)["requests"] or [None])[0],
        timeout_s=30,
        what="the checkpoint's request",
    )
    answered = run_piwf(
        ["answer", request["requestId"], "-", "--json"],
        env=piwf.env,
        cwd=REPO,
        input='{"ok": true}',
    )
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["outcome"] == "won"
    done = piwf.json("run", "wait", run_id, "--timeout", "60")
    assert done["run"]["status"] == "completed"
    assert piwf.json("run", "show", run_id)["output"]["note"] == {"ok": True}


def open_request(cli: Piwf, run_id: str) -> str:
    """The id of the request ``run_id`` waits on, once it waits."""
    request = wait_for(
        lambda: (cli.json("requests", "--run", run_id)["requests"] or [None])[0],
        timeout_s=30,
        what=f"the request of {run_id}",
    )
    return str(request["requestId"])


def test_a_command_of_the_other_kind_offers_the_right_one_only_while_the_request_is_open(
    piwf: Piwf,  # noqa: F811
) -> None:
    checkpoint_run = piwf.json("run", "start", CHECKPOINT, "--input", '{"steps": ["a"]}')
    run_id = checkpoint_run["run"]["runId"]
    request_id = open_request(piwf, run_id)
    refused = piwf.json("submit", request_id, "{}", exit_code=1)["error"]
    assert refused["message"].endswith(f"answer it with: piwf answer {request_id} '<json>'")
    piwf.json("answer", request_id, '{"ok": true}')
    piwf.json("run", "wait", run_id, "--timeout", "60")
    refused = piwf.json("submit", request_id, "{}", exit_code=1)["error"]
    assert refused == {
        "code": "notAgentRequest",
        "message": f"request {request_id} is a checkpoint, not an agent request; it is settled"
        f" already and takes nothing more (its winner: piwf run show {run_id})",
    }

    decision_run = piwf.json(
        "run", "start", "fixtures/workflows/decision_timeout.py", "--input", '{"release": "1"}'
    )
    request_id = open_request(piwf, decision_run["run"]["runId"])
    refused = piwf.json("submit", request_id, "{}", exit_code=1)["error"]
    assert refused["message"].endswith(
        f"""answer it with: piwf answer {request_id} '{{"choice": "<choice>"}}'"""
        " (choices: hold, ship)"
    ), "a decision's answer is a choice: the hint shows that form and its choices"
    piwf.json("run", "cancel", decision_run["run"]["runId"])

    agent_run = piwf.json(
        "run", "start", "fixtures/workflows/agent_validate.py", "--input", '{"topic": "x"}'
    )
    run_id = agent_run["run"]["runId"]
    request_id = open_request(piwf, run_id)
    refused = piwf.json("answer", request_id, "{}", exit_code=1)["error"]
    assert refused["code"] == "notDecisionRequest", refused
    assert refused["message"].endswith(f"submit its output with: piwf submit {request_id} '<json>'")
    piwf.json("submit", request_id, '{"summary": "done"}')
    piwf.json("run", "wait", run_id, "--timeout", "60")
    refused = piwf.json("answer", request_id, "{}", exit_code=1)["error"]
    assert refused["code"] == "notDecisionRequest", refused
    assert refused["message"] == (
        f"request {request_id} is an agent step's request, not a checkpoint or decision; it is"
        f" settled already and takes nothing more (its accepted output: piwf run show {run_id})"
    )


def test_a_state_home_that_cannot_be_a_directory_is_named(tmp_path: Path) -> None:
    plain_file = tmp_path / "f"
    plain_file.write_text("")
    home = plain_file / "sub"
    cli = Piwf(home)
    refused = cli.json("run", "list", exit_code=1)
    assert f"state home {home}: Not a directory" in refused["error"]["message"]
    assert refused["error"]["message"].endswith(
        "; fix or move that path, or set PIWF_HOME to a directory you can write"
    ), "the error says what to do next"
    with pytest.raises(PiwfError, match=f"state home {home}: Not a directory"):
        with Client(home) as client:
            client.server_status()


def test_server_run_says_why_it_cannot_start_when_a_server_already_runs(
    piwf: Piwf,  # noqa: F811
) -> None:
    started = piwf.json("server", "start")
    second = piwf.run("server", "run")
    assert second.returncode == 1
    assert second.stderr.startswith(
        f"Error: a piwf server (pid {started['pid']}) is already running for this state home"
    )
    assert "piwf server stop" in second.stderr
    refused = piwf.json("server", "run", exit_code=1)
    assert refused["error"]["code"] == "serverRunning"
    assert f"(pid {started['pid']}) is already running" in refused["error"]["message"]
    assert piwf.json("server", "status")["state"] == "running", "the first server is untouched"


def test_a_home_whose_socket_path_cannot_exist_has_no_server_running(tmp_path: Path) -> None:
    home = tmp_path / ("h" * 120)
    cli = Piwf(home)
    status = cli.json("server", "status")
    assert status["state"] == "stopped"
    assert "over the OS limit of 107; set PIWF_HOME to a shorter directory" in status["note"]
    text = cli.run("server", "status")
    assert text.returncode == 0
    assert text.stdout.startswith(f"no piwf server can run for {home}: the socket path")
    stopped = cli.json("server", "stop")
    assert (stopped["state"], stopped["wasRunning"]) == ("stopped", False)
    assert "shorter directory" in stopped["note"]
    # A command that needs a server still fails, naming the same cause.
    refused = cli.json("run", "list", exit_code=1)
    assert refused["error"]["code"] == "serverUnavailable"
    assert "set PIWF_HOME to a shorter directory" in refused["error"]["message"]


def test_a_home_that_is_a_file_has_no_server_running(tmp_path: Path) -> None:
    """No socket can lie under a file: status and stop say stopped, with the fix, exit 0."""
    home = tmp_path / "h"
    home.write_bytes(b"notes")
    cli = Piwf(home)
    fix = f"{home} is not a directory; move it away, or set PIWF_HOME to another directory"
    status = cli.json("server", "status")
    assert status["state"] == "stopped" and status["note"].startswith(fix), status
    text = cli.run("server", "status")
    assert (text.returncode, text.stderr) == (0, "")
    assert text.stdout.startswith(f"no piwf server can run for {home}: {fix}")
    stopped = cli.json("server", "stop")
    assert (stopped["state"], stopped["wasRunning"]) == ("stopped", False)
    assert stopped["note"].startswith(fix)
    refused = cli.json("run", "list", exit_code=1)  # a command that needs one still fails
    assert "is not a directory" in refused["error"]["message"]
    assert home.read_bytes() == b"notes"


def test_status_of_a_home_no_server_could_start_in_says_why(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    cli = Piwf(home)
    assert cli.json("server", "status") == {"state": "stopped"}, "a usable home has no note"
    home.chmod(0o755)
    fix = f"{home} has mode 0755; run `chmod 700 {home}`"
    assert cli.json("server", "status") == {"state": "stopped", "note": fix}
    text = cli.run("server", "status")
    assert (text.returncode, text.stderr) == (0, "")
    assert text.stdout == f"no piwf server is running for {home}, and none can start: {fix}\n"
    refused = cli.json("server", "start", exit_code=1)
    assert refused["error"]["code"] == "unsafeStateHome", "what status warned of, start refuses"
    assert cli.json("server", "status") == {"state": "stopped", "note": fix}


def test_an_unknown_id_says_where_to_look_in_every_command(piwf: Piwf) -> None:  # noqa: F811
    no_run = (
        f"no run run-nope (piwf run list shows the runs of this state home, PIWF_HOME={piwf.home})"
    )
    for args in (
        ["run", "show", "run-nope"],
        ["run", "steps", "run-nope"],
        ["run", "explain", "run-nope"],
        ["run", "wait", "run-nope", "--timeout", "1"],
        ["run", "logs", "run-nope"],
        ["run", "pause", "run-nope"],
        ["run", "resume", "run-nope"],
        ["run", "cancel", "run-nope"],
        ["run", "restart", "run-nope"],
        ["run", "fork", "run-nope", "--from", "a"],
        ["run", "settings", "run-nope"],
        ["requests", "--run", "run-nope"],
    ):
        refused = piwf.json(*args, exit_code=1)
        assert refused["error"] == {"code": "runNotFound", "message": no_run}, args
    for args in (
        ["answer", "request-nope", "{}"],
        ["submit", "request-nope", "{}"],
        ["update", "request-nope", "{}"],
    ):
        refused = piwf.json(*args, exit_code=1)
        assert refused["error"]["message"].startswith(
            "no request request-nope (piwf requests lists the pending requests of this state"
        ), args
        assert f"PIWF_HOME={piwf.home})" in refused["error"]["message"]
    refused = piwf.json("effect", "resolve", "effect-nope", "--applied", exit_code=1)
    assert refused["error"]["code"] == "effectNotFound"
    assert refused["error"]["message"].startswith("no effect effect-nope (piwf run show RUN_ID")
    assert f"PIWF_HOME={piwf.home})" in refused["error"]["message"]
    refused = piwf.json("channel", "recover", "effect-nope", "confirm", exit_code=1)
    assert refused["error"] == {
        "code": "channelEffectNotFound",
        "message": "no channel send effect-nope (piwf channel status lists the ambiguous sends"
        f" of this state home, PIWF_HOME={piwf.home}; the effect of a run step is settled with"
        " piwf effect resolve EFFECT_ID --applied | --retry)",
    }

    malformed = piwf.json("resource", "list", "--manager", "bad name", exit_code=2)
    assert malformed["error"]["code"] == "usage" and "manager" in malformed["error"]["message"]


POST_AND_HANG = """
import pathlib, time
from piwf.workflow import action, define_workflow, manual_effect

def post(ctx):
    pathlib.Path({entered!r}).touch()
    time.sleep(120)  # cancelled while the manual effect applies: its outcome is unknown

workflow = define_workflow(
    name="post_and_hang",
    start_at="post",
    nodes={{"post": action(effect=manual_effect("chat.post"), run=post)}},
    edges=[],
)
"""


def cancelled_while_applying(cli: Piwf, tmp_path: Path) -> tuple[str, str]:
    """A run cancelled while its manual effect applies: the run's id and that (ambiguous)
    effect's id."""
    entered = tmp_path / "entered"
    workflow = tmp_path / "post_and_hang.py"
    workflow.write_text(POST_AND_HANG.format(entered=str(entered)))
    run_id = cli.json("run", "start", str(workflow))["run"]["runId"]
    wait_for(entered.exists, timeout_s=30, what="the effect's action to start")
    cli.json("run", "cancel", run_id)
    (effect,) = wait_for(
        lambda: [
            e for e in cli.json("run", "show", run_id)["effects"] if e["status"] == "ambiguous"
        ],
        timeout_s=30,
        what="the cancelled effect to be ambiguous",
    )
    return run_id, str(effect["effectId"])


def test_a_resolve_that_changes_nothing_says_so_and_does_not_claim_a_resolution(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    entered = tmp_path / "entered"
    workflow = tmp_path / "post_and_hang.py"
    workflow.write_text(POST_AND_HANG.format(entered=str(entered)))
    run_id = piwf.json("run", "start", str(workflow))["run"]["runId"]
    wait_for(entered.exists, timeout_s=30, what="the effect's action to start")
    (effect,) = piwf.json("run", "show", run_id)["effects"]
    effect_id = effect["effectId"]
    assert effect["status"] == "applying"

    # A retry of an effect that applies (never ambiguous) is adopted: nothing was resolved.
    text = piwf.run("effect", "resolve", effect_id, "--retry").stdout
    assert text == f"{effect_id}  chat.post  already applying: nothing to resolve\n"
    retried = piwf.json("effect", "resolve", effect_id, "--retry")
    assert (retried["effect"]["status"], retried["outcome"]) == ("applying", "unchanged")

    piwf.json("run", "cancel", run_id)
    wait_for(
        lambda: piwf.json("run", "show", run_id)["effects"][0]["status"] == "ambiguous",
        timeout_s=30,
        what="the cancelled effect to be ambiguous",
    )
    text = piwf.run("effect", "resolve", effect_id, "--applied").stdout
    assert text == f"{effect_id}  chat.post  now applied\n"
    again = piwf.json("effect", "resolve", effect_id, "--applied")
    assert (again["effect"]["status"], again["outcome"]) == ("applied", "unchanged")
    text = piwf.run("effect", "resolve", effect_id, "--applied").stdout
    assert text == f"{effect_id}  chat.post  already applied: nothing to resolve\n"


def test_a_cancelled_run_with_an_ambiguous_effect_asks_for_the_resolve_before_a_restart(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_id, effect_id = cancelled_while_applying(piwf, tmp_path)
    resolve = f"piwf effect resolve {effect_id} --applied|--retry"

    shown = piwf.json("run", "show", run_id)
    assert shown["run"]["status"] == "cancelled"
    assert shown["display"]["controls"] == ["resolve"], "no restart while an effect is unsettled"
    explained = piwf.json("run", "explain", run_id)
    assert explained["commands"] == [resolve]
    assert effect_id in explained["explanation"]
    text = piwf.run("run", "explain", run_id).stdout
    assert resolve in text and f"piwf run restart {run_id}" not in text

    refused = piwf.json("run", "restart", run_id, exit_code=1)
    message = refused["error"]["message"]
    assert f"{effect_id} (ambiguous)" in message
    assert "piwf effect resolve EFFECT_ID --applied | --retry" in message
    assert message.endswith("then restart it")

    piwf.json("effect", "resolve", effect_id, "--applied")
    assert piwf.json("run", "explain", run_id)["commands"] == [f"piwf run restart {run_id}"]
    restarted = piwf.json("run", "restart", run_id)
    assert restarted["run"]["runId"] != run_id
    piwf.json("run", "cancel", restarted["run"]["runId"])


def test_a_retry_of_an_ended_runs_effect_settles_it_not_applied_so_a_restart_can_do_it(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_id, effect_id = cancelled_while_applying(piwf, tmp_path)
    # No runner takes an ended run up again: a retry would leave the effect pending for ever
    # and the restart refused for ever. It settles it cancelled: it did not happen.
    resolved = piwf.json("effect", "resolve", effect_id, "--retry", "--note", "not in the chat")
    assert (resolved["effect"]["status"], resolved["outcome"]) == ("cancelled", "resolved")
    again = piwf.json("effect", "resolve", effect_id, "--retry")
    # the same decision again changes nothing
    assert (again["effect"]["status"], again["outcome"]) == ("cancelled", "unchanged")
    settled = piwf.json("effect", "resolve", effect_id, "--applied", exit_code=1)["error"]
    assert settled["message"] == (
        "effect is cancelled, not ambiguous: there is nothing to resolve (only an effect that may"
        f" or may not have happened takes a resolution; piwf run show {run_id} lists a run's"
        " effects with their status)"
    ), settled
    assert piwf.json("run", "explain", run_id)["commands"] == [f"piwf run restart {run_id}"]
    restarted = piwf.json("run", "restart", run_id)
    assert restarted["run"]["runId"] != run_id
    piwf.json("run", "cancel", restarted["run"]["runId"])


FAILS_ON_TWO_LINES = """
from piwf.workflow import compute, define_workflow

def fail(ctx):
    raise ValueError("the first line\\nthe second line\\x1b[31m")

workflow = define_workflow(
    name="fails_on_two_lines", start_at="fail", nodes={"fail": compute(fail)}, edges=[]
)
"""


def test_explain_prints_a_multi_line_failure_escaped_on_one_line(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = tmp_path / "fails_on_two_lines.py"
    workflow.write_text(FAILS_ON_TWO_LINES)
    run_id = piwf.json("run", "start", str(workflow), "--wait", exit_code=1)["run"]["runId"]

    explained = piwf.json("run", "explain", run_id)
    assert "the first line\nthe second line\x1b[31m" in explained["explanation"], explained
    lines = piwf.run("run", "explain", run_id).stdout.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{run_id}  failed: ")
    assert "the first line\\nthe second line\\x1b[31m" in lines[0]
    assert lines[1] == f"  piwf run restart {run_id}"

    # Where the record keeps its lines (run show, a wait's error), no stored text reaches the
    # terminal as a control sequence.
    shown = piwf.run("run", "show", run_id)
    waited = piwf.run("run", "wait", run_id)
    assert waited.returncode == 1
    for text in (shown.stdout, waited.stderr):
        assert "\x1b" not in text and "the second line\\x1b[31m" in text, text


PRINTS_ESCAPES = """
import sys
from piwf.workflow import compute, define_workflow

def loud(ctx):
    print("red \\x1b[31mtext\\x1b[0m\\tand a tab")
    print("title \\x1b]0;owned\\x07 bell", file=sys.stderr)
    return {}

workflow = define_workflow(
    name="prints_escapes", start_at="loud", nodes={"loud": compute(loud)}, edges=[]
)
"""


def test_run_logs_escape_what_a_node_printed_and_keep_it_in_json(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = tmp_path / "prints_escapes.py"
    workflow.write_text(PRINTS_ESCAPES)
    run_id = piwf.json("run", "start", str(workflow), "--wait")["run"]["runId"]

    stored = piwf.json("run", "logs", run_id)["attempts"][0]["text"]
    assert "\x1b[31mtext" in stored and "\x1b]0;owned\x07" in stored, stored
    for args in (["run", "logs", run_id], ["run", "logs", run_id, "--follow"]):
        shown = piwf.run(*args)
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout, shown.stdout
        assert "red \\x1b[31mtext\\x1b[0m\tand a tab\n" in shown.stdout, shown.stdout
        assert "title \\x1b]0;owned\\x07 bell\n" in shown.stdout, shown.stdout
    for args in (["run", "logs", run_id, "--raw"], ["run", "logs", run_id, "--follow", "--raw"]):
        raw = piwf.run(*args)
        assert raw.returncode == 0, raw.stderr
        assert stored in raw.stdout, raw.stdout  # as the node wrote it, escapes included


PRINTS_INVALID_UTF8 = """
import sys
from piwf.workflow import compute, define_workflow

def binary(ctx):
    sys.stdout.buffer.write(b"bytes \\x00\\xff\\xfe \\x1b[31mred\\x1b[0m\\n")
    sys.stdout.flush()
    return {}

workflow = define_workflow(
    name="prints_invalid_utf8", start_at="binary", nodes={"binary": compute(binary)}, edges=[]
)
"""


def test_run_logs_raw_prints_the_bytes_a_node_wrote_invalid_utf8_included(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = tmp_path / "prints_invalid_utf8.py"
    workflow.write_text(PRINTS_INVALID_UTF8)
    run_id = piwf.json("run", "start", str(workflow), "--wait")["run"]["runId"]
    written = b"bytes \x00\xff\xfe \x1b[31mred\x1b[0m\n"

    for follow in ([], ["--follow"]):
        raw = subprocess.run(
            [str(PIWF), "run", "logs", run_id, "--raw", *follow],
            env=piwf.env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert raw.returncode == 0, raw.stderr
        assert written in raw.stdout, raw.stdout  # not U+FFFD in place of 0xff 0xfe
    stored = piwf.json("run", "logs", run_id)["attempts"][0]["text"]
    assert stored == written.decode("utf-8", errors="replace"), stored


PRINTS_THEN_ASKS = """
from piwf.workflow import checkpoint, compute, define_workflow

def loud(ctx):
    print("printed before the pause", flush=True)
    return {}

workflow = define_workflow(
    name="prints_then_asks",
    start_at="loud",
    nodes={"loud": compute(loud), "ask": checkpoint(summary="Go on?")},
    edges=[{"from": "loud", "to": "ask"}],
)
"""


def test_run_logs_follow_of_a_paused_run_prints_what_is_there_and_says_why_it_stops(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Nothing more is written until someone resumes a paused run: following it would wait for
    a person, so the follow ends as `run show --follow` does, saying so."""
    workflow = tmp_path / "prints_then_asks.py"
    workflow.write_text(PRINTS_THEN_ASKS)
    run_id = piwf.json("run", "start", str(workflow))["run"]["runId"]
    wait_for(lambda: piwf.json("requests", "--run", run_id)["requests"], timeout_s=30)
    assert piwf.json("run", "pause", run_id)["run"]["paused"] is True

    followed = piwf.run("run", "logs", run_id, "--follow")  # a hang times out
    assert followed.returncode == 0, followed.stderr
    assert "printed before the pause" in followed.stdout
    assert f"run {run_id} is paused: nothing more is printed until it is resumed" in (
        followed.stderr
    )
    assert f"piwf run explain {run_id}" in followed.stderr


REJECTS_WITH_AN_ESCAPE = """
from piwf.workflow import agent, define_workflow

def check(output, ctx):
    raise ValueError("not \\x1b]0;owned\\x07 this\\n  submit       piwf submit request-forged")

workflow = define_workflow(
    name="rejects_with_an_escape",
    start_at="ask",
    nodes={
        "ask": agent(prompt="Count.", expected_output="a \\x1b]0;t\\x07 number", validate=check)
    },
    edges=[],
)
"""


def test_a_rejection_and_an_expected_output_reach_the_terminal_escaped(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = tmp_path / "rejects_with_an_escape.py"
    workflow.write_text(REJECTS_WITH_AN_ESCAPE)
    run_id = piwf.json("run", "start", str(workflow))["run"]["runId"]
    requests = wait_for(lambda: piwf.json("requests", "--run", run_id)["requests"], timeout_s=30)
    request_id = requests[0]["requestId"]

    forged = "  submit       piwf submit request-forged"
    rejected = piwf.json("submit", request_id, "1", exit_code=1)
    assert rejected["error"]["message"] == f"ValueError: not \x1b]0;owned\x07 this\n{forged}"
    submitted = piwf.run("submit", request_id, "1")
    assert submitted.returncode == 1
    assert submitted.stderr == f"Error: ValueError: not \\x1b]0;owned\\x07 this\n{forged}\n"
    listed = piwf.run("requests", "--run", run_id).stdout
    assert "\x1b" not in listed and "\x07" not in listed, listed
    assert "rejected     ValueError: not \\x1b]0;owned\\x07 this" in listed, listed
    assert "expected     a \\x1b]0;t\\x07 number" in listed, listed
    # A rejection of several lines stays under its field: no line of it passes for a field.
    assert f"\n{forged}" not in listed and f"\n    {forged}" in listed, listed
    audit = piwf.run("run", "show", run_id).stdout
    assert f"\n{forged}" not in audit and f"\n       {forged}" in audit, audit
    piwf.json("run", "cancel", run_id)


def test_a_channel_reload_with_no_profiles_says_where_they_are_configured(
    piwf: Piwf,  # noqa: F811
) -> None:
    reloaded = piwf.run("channel", "reload")
    assert reloaded.returncode == 0, reloaded.stderr
    started, nothing = reloaded.stdout.splitlines()
    assert started.startswith("started piwf server (pid "), started
    assert started.endswith(f" for {piwf.home}; it read channels.json"), started
    assert nothing == (
        f"no channel profiles: nothing to start (configure them in {piwf.home}/channels.json;"
        " docs/CHANNELS.md shows the setup)"
    )
    report = piwf.json("channel", "reload")
    assert report == {
        "failed": [],
        "restarted": [],
        "resent": [],
        "serverStarted": False,
        "started": [],
        "stopped": [],
        "unchanged": [],
    }


def test_a_dash_with_nothing_on_stdin_says_so_and_a_terminal_is_told_how_to_end(
    piwf: Piwf,  # noqa: F811
) -> None:
    """`piwf answer REQ -` typed at a terminal waited silently for stdin (it looked hung), and
    an empty stdin was refused as a JSON syntax error at column 1."""
    for command in ("answer", "submit", "update"):
        empty = run_piwf([command, "req-1", "-", "--json"], env=piwf.env, cwd=REPO, input="\n")
        assert empty.returncode == 2, empty.stdout
        assert (
            "stdin, which was empty: pipe the JSON in"
            in json.loads(empty.stdout)["error"]["message"]
        )
    assert not (piwf.home / "server").exists(), "nothing was sent, so no server was started"

    controller, terminal = pty.openpty()
    with subprocess.Popen(
        [str(PIWF), "answer", "req-1", "-"],
        env=piwf.env,
        cwd=REPO,
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as typed:
        os.close(terminal)
        assert typed.stderr is not None
        assert typed.stderr.readline() == "reading RESPONSE_JSON from stdin: type it, then Ctrl-D\n"
        os.write(controller, b'{"ok": true}\n\x04')
        _, rest = typed.communicate(timeout=60)
    os.close(controller)
    assert typed.returncode == 1 and "no request req-1" in rest, rest


def test_session_show_of_a_used_session_whose_messages_were_all_shown(
    piwf: Piwf,  # noqa: F811
) -> None:
    """A session whose only run ended and whose terminal message was shown has no message to
    list, but it was used: ``session show`` must not call it unused (a mistyped id)."""
    started = piwf.json("run", "start", HELLO, "--input", '{"who": "ada"}', "--session", "s-1")
    run_id = started["run"]["runId"]
    attached = subprocess.run(
        [str(PIWF), "session", "attach", "s-1", "--exit-when-done"],
        env=piwf.env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert attached.returncode == 0, attached
    assert f"terminal · run {run_id}" in attached.stdout
    view = piwf.json("session", "show", "s-1")
    assert (view["runs"], view["total"], view.get("activeRunId")) == (1, 0, None)
    shown = piwf.run("session", "show", "s-1")
    assert (shown.returncode, shown.stderr) == (0, ""), shown
    assert "no run has used" not in shown.stdout
    assert "(none to show)" in shown.stdout
    unused = piwf.run("session", "show", "s-2")
    assert "no run has used session s-2 in this state home" in unused.stdout


def test_server_start_says_which_settings_a_running_server_does_not_take(
    piwf: Piwf,  # noqa: F811
) -> None:
    """`PIWF_AGENT_COMMAND=... piwf server start` (docs/AGENTS.md) with a server already
    running (any earlier command starts one) applied nothing and said only "already running":
    the agent steps then waited for a command that was never set."""
    piwf.env.pop("PIWF_AGENT_COMMAND", None)
    piwf.env.pop("PIWF_MAX_WORKERS", None)
    assert piwf.json("server", "start")["started"] is True
    assert "notApplied" not in piwf.json("server", "start"), "nothing given, nothing to say"
    piwf.env["PIWF_AGENT_COMMAND"] = "my-agent --fast"
    again = piwf.json("server", "start", "--max-workers", "2")
    assert again["started"] is False
    assert again["notApplied"] == ["--max-workers", "PIWF_AGENT_COMMAND"]
    text = piwf.run("server", "start")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("piwf server already running"), text.stdout
    assert text.stderr == (
        "it keeps the settings it started with and does not take these given here:"
        " PIWF_AGENT_COMMAND (to apply them: piwf server stop, then piwf server start)\n"
    )
    assert "my-agent" not in text.stderr + text.stdout, "a setting's value is not repeated"
