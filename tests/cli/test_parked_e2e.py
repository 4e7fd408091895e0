"""Runs parked until someone acts, through the installed script against a real server.

A run parked ``runnerNoProgress``, ``sourceChanged`` or ``effectAmbiguous`` never goes on by
itself: ``run start --wait`` and ``run wait`` end as soon as it parks (exit 1, the reason and
``piwf run explain``), and every view shows it ``queued`` (the seed's closed set of display
statuses) with ``needsAction``, the activity ``blocked`` and its reason (or ``ambiguous``). A
run that merely waits (a request, a timer) is still waited for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import click
import pytest

from piwf.client import Client
from tests.cli.test_cli import COMMANDS
from tests.cli.test_cli_e2e import REPO, Piwf, piwf, wait_gone  # noqa: F401 (the fixture)
from tests.cli_process import run_piwf
from tests.server.harness import wait_for

#: What each wait below is given: far longer than a park takes.
WAIT_TIMEOUT_S = 120
#: A wait on a run that needs an operator must end well within this.
ENDS_WITHIN_S = 30.0

CRASH = """
    import os
    from piwf.workflow import compute, define_workflow

    def die(ctx):
        print("about to die", flush=True)
        os._exit(3)

    workflow = define_workflow(
        name="crash", start_at="a",
        nodes={"a": compute(lambda ctx: 1), "b": compute(die)},
        edges=[{"from": "a", "to": "b"}],
    )
    """

NAP = """
    from piwf.workflow import compute, define_workflow, sleep

    workflow = define_workflow(
        name="nap", start_at="nap",
        nodes={"nap": sleep(2000), "after": compute(lambda ctx: 1)},
        edges=[{"from": "nap", "to": "after"}],
    )
    """

MANUAL = """
    import os
    from piwf.workflow import action, define_workflow, manual_effect

    def post(ctx):
        os._exit(23)

    workflow = define_workflow(
        name="manual", start_at="post",
        nodes={"post": action(effect=manual_effect("chat.post"), run=post)}, edges=[],
    )
    """

SELF_KILLING = """
    import os, signal
    from piwf.workflow import action, define_workflow, idempotent_effect

    def deploy(ctx):
        os.kill(os.getpid(), signal.SIGKILL)

    workflow = define_workflow(
        name="selfkill", start_at="deploy",
        nodes={"deploy": action(effect=idempotent_effect("preview.deploy"), run=deploy)},
        edges=[],
    )
    """

HELD_POST = """
    import os, pathlib, time
    from piwf.workflow import action, define_workflow, manual_effect

    def post(ctx):
        folder = pathlib.Path(ctx.input["dir"])
        (folder / "posting").touch()
        deadline = time.monotonic() + 120
        while not (folder / "never").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"posted": True}

    workflow = define_workflow(
        name="held", start_at="post",
        nodes={"post": action(effect=manual_effect("chat.post"), run=post)}, edges=[],
    )
    """

CHECKPOINT = """
    from piwf.workflow import checkpoint, define_workflow

    workflow = define_workflow(
        name="ask", start_at="ask", nodes={"ask": checkpoint(summary="ok?")}, edges=[],
    )
    """


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def timed(cli: Piwf, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the script (its own bound is above every wait given) and how long it took."""
    began = time.monotonic()
    result = run_piwf(args, env=cli.env, cwd=REPO, timeout=WAIT_TIMEOUT_S + 30)
    return result, time.monotonic() - began


def one_document(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.stdout.count("\n") == 1, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_a_wait_ends_when_its_run_parks_without_progress(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "crash.py", CRASH)
    started, took = timed(piwf, "run", "start", str(flow), "--wait", "--timeout", "120")
    assert took < ENDS_WITHIN_S, f"run start --wait sat out {took:.0f} s on a parked run"
    assert started.returncode == 1, (started.stdout, started.stderr)
    run_id = started.stdout.split()[1]
    assert "runnerNoProgress" in started.stderr
    assert f"piwf run explain {run_id}" in started.stderr

    waited, took = timed(piwf, "run", "wait", run_id, "--timeout", "120", "--json")
    assert took < ENDS_WITHIN_S, f"run wait sat out {took:.0f} s on a parked run"
    assert waited.returncode == 1, (waited.stdout, waited.stderr)
    document = one_document(waited)
    assert document["timedOut"] is False
    assert document["run"]["needsAction"] is True
    assert document["run"]["errorCode"] == "runnerNoProgress"
    assert document["run"]["displayStatus"] == "queued"
    # What the server knows: how the runner ended and the attempt that was active.
    reason = document["parkedReason"]
    assert "exited with code 3" in reason and 'node "b" (visit 1, attempt 2)' in reason


def test_a_parked_run_shows_that_it_needs_action_everywhere_with_its_cause(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "crash.py", CRASH)
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    with Client(home=piwf.home) as client:
        wait_for(lambda: client.get_run(run_id).run.needs_action, 30, "the no-progress park")

    listed = piwf.json("run", "list", "--status", "queued")["runs"]
    assert [(run["runId"], run["needsAction"]) for run in listed] == [(run_id, True)]
    assert "queued (needs action: runnerNoProgress)" in piwf.run("run", "list").stdout
    shown = piwf.json("run", "show", run_id)
    assert (shown["run"]["displayStatus"], shown["display"]["status"]) == ("queued", "queued")
    assert shown["display"]["activity"] == "blocked"
    assert "exited with code 3" in shown["parkedReason"]
    explained = piwf.json("run", "explain", run_id)
    assert (explained["status"], explained["cause"]) == ("queued", "runnerNoProgress")
    text = piwf.run("run", "explain", run_id).stdout
    assert 'exited with code 3 while node "b" (visit 1, attempt 2) ran' in text
    assert "status      running (queue: parked)" in piwf.run("run", "show", run_id).stdout
    # Both attempts of "b" lost their runner: neither is shown running.
    logs = piwf.json("run", "logs", run_id)
    assert [(a["nodePath"], a["attempt"], a["status"]) for a in logs["attempts"]] == [
        ("a", 1, "completed"),
        ("b", 1, "interrupted"),
        ("b", 2, "interrupted"),
    ]
    assert piwf.json("server", "status")["parkedByReason"] == {"runnerNoProgress": 1}


EXITS = """
    import sys
    from piwf.workflow import compute, define_workflow

    def leave(ctx):
        sys.exit(3)

    workflow = define_workflow(name="exits", start_at="a", nodes={"a": compute(leave)}, edges=[])
    """


def test_a_node_that_calls_sys_exit_is_named_in_its_attempts_log(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """SystemExit prints no traceback, so the runner says what ended it, where run logs reads."""
    flow = write(tmp_path / "exits.py", EXITS)
    started, _ = timed(piwf, "run", "start", str(flow), "--wait", "--timeout", "120")
    assert started.returncode == 1, (started.stdout, started.stderr)
    run_id = started.stdout.split()[1]
    assert "runnerNoProgress" in started.stderr
    logs = piwf.run("run", "logs", run_id).stdout
    said = "workflow code raised SystemExit (code 3), which ends the runner, not the node"
    assert logs.count(said) == 2, logs  # once for each attempt
    explained = piwf.run("run", "explain", run_id).stdout
    assert "by sys.exit or a signal" in explained and "piwf run logs" in explained


def test_a_wait_ends_when_its_run_parks_on_a_changed_source(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "nap.py", NAP)
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    with Client(home=piwf.home) as client:
        wait_for(lambda: client.run_view(run_id).display.activity == "sleeping", 30, "the timer")
    flow.write_text(flow.read_text() + "\n# changed\n")
    waited, took = timed(piwf, "run", "wait", run_id, "--timeout", "120")
    assert took < ENDS_WITHIN_S, f"run wait sat out {took:.0f} s on a parked run"
    assert waited.returncode == 1, (waited.stdout, waited.stderr)
    assert f"{run_id}  queued (needs action: sourceChanged)  nap" in waited.stdout
    assert "sourceChanged" in waited.stderr and str(flow) in waited.stderr
    assert f"piwf run explain {run_id}" in waited.stderr


def test_a_wait_ends_when_its_run_has_an_ambiguous_effect(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "manual.py", MANUAL)
    started, took = timed(piwf, "run", "start", str(flow), "--wait", "--timeout", "120", "--json")
    assert took < ENDS_WITHIN_S, f"run start --wait sat out {took:.0f} s on a parked run"
    assert started.returncode == 1, (started.stdout, started.stderr)
    run = one_document(started)["run"]
    assert (run["displayStatus"], run["errorCode"], run["needsAction"]) == (
        "ambiguous",
        "effectAmbiguous",
        True,
    )
    # A resume before the effect is settled names it and the command that settles it.
    (effect,) = piwf.json("run", "show", run["runId"])["effects"]
    # The wait says which effect may or may not have happened, and how its runner ended.
    assert one_document(started)["parkedReason"] == (
        f"effect {effect['effectId']} (chat.post) may or may not have been applied: its runner"
        ' exited with code 23 while node "post" (visit 1, attempt 1) ran'
    )
    refused = piwf.json("run", "resume", run["runId"], exit_code=1)["error"]
    assert refused == {
        "code": "runCommand",
        "message": f"run {run['runId']} cannot resume while an effect of it is ambiguous"
        f" ({effect['effectId']}): check the outside system, settle each with piwf effect"
        " resolve EFFECT_ID --applied (it happened) or --retry (it did not), then resume it",
    }


def test_a_run_that_waits_on_a_request_is_still_waited_for(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "ask.py", CHECKPOINT)
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    with Client(home=piwf.home) as client:
        wait_for(lambda: client.get_run(run_id).waiting_on is not None, 30, "the checkpoint")
    waited, took = timed(piwf, "run", "wait", run_id, "--timeout", "1", "--json")
    assert waited.returncode == 1
    document = one_document(waited)
    assert (document["timedOut"], document["run"]["displayStatus"]) == (True, "waiting")
    assert took >= 1.0


def test_a_number_of_seconds_that_is_not_finite_is_a_usage_error(
    piwf: Piwf,  # noqa: F811
) -> None:
    """Each float option once (the walk below checks every one at the type level)."""
    for args, number in (
        (("run", "wait", "run-0123456789", "--timeout"), "nan"),
        (("run", "start", "x.py", "--wait", "--timeout"), "inf"),
        (("server", "start", "--idle-exit"), "Infinity"),
        (("server", "run", "--idle-exit"), "nan"),
    ):
        result = piwf.run(*args, number)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "is not a finite number of seconds" in result.stderr, result.stderr
    assert piwf.json("server", "status") == {"state": "stopped"}


def test_every_float_option_of_the_cli_refuses_what_is_not_finite() -> None:
    """Every option that takes a float, found by walking the command tree."""
    found = []
    for path, command in COMMANDS.items():
        for param in command.params:
            if isinstance(param.type, click.types.FloatParamType):
                found.append(f"{path} {param.name}")
                for number in ("nan", "inf"):
                    with pytest.raises(click.BadParameter):
                        param.type.convert(number, param, None)
    assert len(found) >= 4, found


def test_a_server_refuses_an_idle_exit_that_is_not_finite(
    piwf: Piwf,  # noqa: F811
) -> None:
    piwf.env["PIWF_IDLE_EXIT_S"] = "nan"
    result = piwf.run("server", "start")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "PIWF_IDLE_EXIT_S must be a finite number of seconds" in result.stderr


def test_a_run_parked_for_an_effect_that_is_resolved_since_asks_only_for_the_resume(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "manual.py", MANUAL)
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    with Client(home=piwf.home) as client:
        wait_for(lambda: client.get_run(run_id).run.needs_action, 30, "the effectAmbiguous park")
    (effect,) = piwf.json("run", "show", run_id)["effects"]
    piwf.json("effect", "resolve", effect["effectId"], "--applied")

    resume = f"piwf run resume {run_id}"
    shown = piwf.json("run", "show", run_id)
    # Still parked (only a resume clears it), but no longer for anything left to resolve.
    assert (shown["run"]["errorCode"], shown["run"]["needsAction"]) == ("effectAmbiguous", True)
    display = shown["display"]
    assert (display["activity"], display["controls"]) == ("blocked", ["resume", "cancel"])
    assert display["reason"] == "its ambiguous effects are resolved; it goes on when resumed"
    text = piwf.run("run", "show", run_id).stdout
    assert "action      parked for an ambiguous effect (effect " in text
    assert f"(visit 1, attempt 1) ran), which is resolved now; {resume}" in text
    assert "resolve its ambiguous effect" not in text and "piwf effect resolve" not in text
    explained = piwf.json("run", "explain", run_id)
    assert explained["commands"] == [resume]
    assert "effects are resolved" in explained["explanation"]
    assert "fix the cause" not in explained["explanation"]

    piwf.json("run", "resume", run_id)
    waited = piwf.json("run", "wait", run_id, "--timeout", "60")
    assert waited["run"]["status"] == "completed"  # the applied effect is adopted, not redone


def test_a_server_killed_inside_a_manual_effect_leaves_a_reason_that_names_it(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """SIGKILL the server while a manual action runs: the next server parks the run
    ``effectAmbiguous`` with a stored reason naming the effect, never running it again."""
    flow = write(tmp_path / "held.py", HELD_POST)
    started = piwf.json("run", "start", str(flow), "--input", json.dumps({"dir": str(tmp_path)}))
    run_id = started["run"]["runId"]
    wait_for((tmp_path / "posting").exists, 60, "the manual action to begin")
    (tmp_path / "posting").unlink()
    lock = json.loads((piwf.home / "server" / "server.lock").read_text())
    os.kill(lock["pid"], signal.SIGKILL)
    assert wait_gone(lock["pid"], 30), "the server outlived its SIGKILL"

    waited, took = timed(piwf, "run", "wait", run_id, "--timeout", "120", "--json")
    assert took < ENDS_WITHIN_S, f"run wait sat out {took:.0f} s on a parked run"
    assert waited.returncode == 1, (waited.stdout, waited.stderr)
    document = one_document(waited)
    assert document["run"]["errorCode"] == "effectAmbiguous"
    (effect,) = piwf.json("run", "show", run_id)["effects"]
    assert (effect["status"], effect["attemptCount"]) == ("ambiguous", 1)
    assert document["parkedReason"] == (
        f"effect {effect['effectId']} (chat.post) may or may not have been applied: its server"
        ' stopped or died while node "post" (visit 1, attempt 1) ran'
    )
    human = piwf.run("run", "wait", run_id, "--timeout", "120")
    assert human.returncode == 1
    assert f"is parked effectAmbiguous: effect {effect['effectId']} (chat.post)" in human.stderr
    assert not (tmp_path / "posting").exists(), "the manual action ran again by itself"


SLOW_POST = """
    import time
    from piwf.workflow import action, define_workflow, manual_effect

    workflow = define_workflow(
        name="slow", start_at="post",
        nodes={
            "post": action(
                effect=manual_effect("chat.post"), run=lambda ctx: time.sleep(60), timeout_ms=200
            ),
        },
        edges=[],
    )
    """


def test_a_manual_action_past_its_deadline_parks_with_a_reason_that_names_its_effect(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The reason was only ``timed out after 200 ms``: `run wait` said the run parked
    ``effectAmbiguous`` without saying which effect was in doubt."""
    flow = write(tmp_path / "slow.py", SLOW_POST)
    started, took = timed(piwf, "run", "start", str(flow), "--wait", "--timeout", "120", "--json")
    assert took < ENDS_WITHIN_S, f"run start --wait sat out {took:.0f} s on a parked run"
    assert started.returncode == 1, (started.stdout, started.stderr)
    document = one_document(started)
    assert document["run"]["errorCode"] == "effectAmbiguous"
    assert document["parkedReason"] == (
        "effect 'chat.post' may or may not have been applied: timed out after 200 ms"
    )
    run_id = document["run"]["runId"]
    (effect,) = piwf.json("run", "show", run_id)["effects"]
    assert (effect["status"], effect["attemptCount"]) == ("ambiguous", 1)
    human = piwf.run("run", "show", run_id)
    # The action line gave the command with an EFFECT_ID placeholder; it names the effect.
    assert (
        "action      effect 'chat.post' may or may not have been applied: timed out after"
        f" 200 ms; check whether it happened and settle it (piwf effect resolve"
        f" {effect['effectId']} --applied|--retry), then piwf run resume {run_id}"
    ) in human.stdout
    assert f"next      piwf effect resolve {effect['effectId']} --applied|--retry" in human.stdout


def test_a_crash_loop_says_once_what_to_do(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """An idempotent action that SIGKILLs its runner every time stops relaunching at the fifth
    crash; each view gives the count and the resume once."""
    flow = write(tmp_path / "selfkill.py", SELF_KILLING)
    started, took = timed(piwf, "run", "start", str(flow), "--wait", "--timeout", "120")
    assert took < ENDS_WITHIN_S + 30, f"run start --wait sat out {took:.0f} s on a crash loop"
    assert started.returncode == 1, (started.stdout, started.stderr)
    run_id = started.stdout.split()[1]
    assert "parked runnerCrashed: the runner crashed 5 times in a row" in started.stderr
    resume = f"piwf run resume {run_id}"

    explained = piwf.json("run", "explain", run_id)
    assert explained["explanation"] == (
        "its runner crashed repeatedly: the runner crashed 5 times in a row without finishing"
        f" a node; fix the cause, then resume the run ({resume})."
    )
    assert explained["commands"] == [resume]
    shown = piwf.run("run", "show", run_id).stdout
    action = next(line for line in shown.splitlines() if line.startswith("  action"))
    assert action == (
        "  action      the runner crashed 5 times in a row without finishing a node;"
        f" fix the cause, then resume the run ({resume})"
    )
    (effect,) = piwf.json("run", "show", run_id)["effects"]
    assert (effect["status"], effect["attemptCount"]) == ("pending", 5)


def test_a_run_paused_inside_a_manual_effect_parks_cleanly_when_resumed(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A pause stops the runner while its manual action runs; on resume the next runner finds
    the effect still applying from the older generation: the effect becomes ambiguous and the
    runner's own park commits (it used to be refused at a stale revision, so the runner exited
    with a protocol error and only the exit's recovery parked the run)."""
    flow = write(tmp_path / "held.py", HELD_POST)
    started = piwf.json("run", "start", str(flow), "--input", json.dumps({"dir": str(tmp_path)}))
    run_id = started["run"]["runId"]
    wait_for((tmp_path / "posting").exists, 60, "the manual action to begin")
    (tmp_path / "posting").unlink()
    assert piwf.json("run", "pause", run_id)["run"]["paused"] is True
    piwf.json("run", "resume", run_id)

    waited, took = timed(piwf, "run", "wait", run_id, "--timeout", "120", "--json")
    assert took < ENDS_WITHIN_S, f"run wait sat out {took:.0f} s on a parked run"
    assert waited.returncode == 1, (waited.stdout, waited.stderr)
    document = one_document(waited)
    assert document["run"]["errorCode"] == "effectAmbiguous"
    assert document["parkedReason"] == (
        "effect 'chat.post' may or may not have been applied: an earlier attempt of this visit"
        " stopped while its action ran"
    )
    (effect,) = piwf.json("run", "show", run_id)["effects"]
    assert (effect["status"], effect["attemptCount"]) == ("ambiguous", 1)
    assert not (tmp_path / "posting").exists(), "the manual action ran again by itself"
    logs = piwf.run("run", "logs", run_id)
    assert "invalidTransition" not in logs.stdout, logs.stdout

    piwf.json("effect", "resolve", effect["effectId"], "--applied")
    piwf.json("run", "resume", run_id)
    assert piwf.json("run", "wait", run_id, "--timeout", "60")["run"]["status"] == "completed"
