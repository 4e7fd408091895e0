"""An id of one kind given where another belongs: ``piwf run show REQUEST_ID``, ``piwf effect
resolve RUN_ID``. Each said only "no run X" / "no effect X"; the refusal now says what the id
is and the command that takes it, keeping its error code, and an unknown id of the right kind
keeps today's message.

The installed script against a real server (the fixture of tests/cli/test_cli_e2e.py starts
nothing itself; the first command autostarts the server, and the fixture stops and reaps it).
"""

from __future__ import annotations

from tests.cli.test_cli_e2e import HELLO, Piwf, piwf  # noqa: F401 - a fixture used by name
from tests.cli.test_decision_inputs_e2e import CHECKPOINT, pending

#: Ids of the shapes piwf makes that no state home has.
EFFECT_ID = "effect-" + "3f" * 20
RESOURCE_UID = "mr-" + "5c" * 10

#: Every command that takes a run id and refuses an unknown one with ``runNotFound``.
RUN_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("run", "show", "{id}"),
    ("run", "steps", "{id}"),
    ("run", "explain", "{id}"),
    ("run", "wait", "{id}", "--timeout", "1"),
    ("run", "logs", "{id}"),
    ("run", "pause", "{id}"),
    ("run", "resume", "{id}"),
    ("run", "cancel", "{id}"),
    ("run", "restart", "{id}"),
    ("run", "fork", "{id}", "--from", "a"),
    ("run", "settings", "{id}"),
    ("requests", "--run", "{id}"),
    ("session", "capture", "{id}"),
)
#: Every command that takes a request id.
REQUEST_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("answer", "{id}", "{}"),
    ("submit", "{id}", "{}"),
    ("update", "{id}", "{}"),
)


def refusals(cli: Piwf, commands: tuple[tuple[str, ...], ...], given: str) -> list[dict[str, str]]:
    """The ``--json`` error of each command with ``given`` as its id; each exits 1."""
    return [
        cli.json(*(part.replace("{id}", given) for part in args), exit_code=1)["error"]
        for args in commands
    ]


def request_hint(request_id: str) -> str:
    return (
        f"that is a request id (piwf requests lists it while it is pending; piwf answer"
        f" {request_id} VALUE or piwf submit {request_id} '<json>' settles it)"
    )


def effect_hint(effect_id: str) -> str:
    return (
        f"that is an effect id (piwf run show RUN_ID lists a run's effects; piwf effect resolve"
        f" {effect_id} --applied | --retry settles an ambiguous one)"
    )


RESOURCE_HINT = (
    "that is a managed resource's uid (piwf resource list shows the resources; piwf resource"
    " get MANAGER KEY shows one)"
)


def test_a_request_id_where_a_run_id_belongs(piwf: Piwf) -> None:  # noqa: F811
    run_id = piwf.json("run", "start", CHECKPOINT, "--input", '{"steps": ["a"]}')["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]
    expected = f"no run {request_id}: {request_hint(request_id)}"
    for error in refusals(piwf, RUN_COMMANDS, request_id):
        assert error == {"code": "runNotFound", "message": expected}
    shown = piwf.run("run", "show", request_id)
    assert (shown.returncode, shown.stdout) == (1, "")
    assert shown.stderr == f"Error: {expected}\n"
    assert piwf.json("requests", "--run", run_id)["requests"][0]["requestId"] == request_id, (
        "nothing was done to the run"
    )


def test_an_effect_id_where_a_run_id_belongs(piwf: Piwf) -> None:  # noqa: F811
    expected = f"no run {EFFECT_ID}: {effect_hint(EFFECT_ID)}"
    for error in refusals(piwf, RUN_COMMANDS, EFFECT_ID):
        assert error == {"code": "runNotFound", "message": expected}


def test_a_resource_uid_where_a_run_id_belongs(piwf: Piwf) -> None:  # noqa: F811
    expected = f"no run {RESOURCE_UID}: {RESOURCE_HINT}"
    for error in refusals(piwf, RUN_COMMANDS, RESOURCE_UID):
        assert error == {"code": "runNotFound", "message": expected}


def test_a_reconcile_id_where_a_run_or_an_effect_id_belongs(piwf: Piwf) -> None:  # noqa: F811
    """A reconcile id, copied from ``piwf resource get``, said only "no effect X"."""
    reconcile_id = "reconcile-" + "6d" * 8
    hint = (
        "that is a reconcile id (piwf resource get MANAGER KEY lists a resource's recent"
        " reconciles)"
    )
    refused = piwf.json("effect", "resolve", reconcile_id, "--retry", exit_code=1)
    assert refused["error"] == {
        "code": "effectNotFound",
        "message": f"no effect {reconcile_id}: {hint}",
    }
    for error in refusals(piwf, RUN_COMMANDS[:1], reconcile_id):
        assert error == {"code": "runNotFound", "message": f"no run {reconcile_id}: {hint}"}


def test_a_run_id_where_an_effect_id_belongs(piwf: Piwf) -> None:  # noqa: F811
    run_id = piwf.json("run", "start", HELLO, "--input", '{"who": "ada"}', "--wait")["run"]["runId"]
    hint = f"that is a run id (piwf run show {run_id})"
    refused = piwf.json("effect", "resolve", run_id, "--applied", exit_code=1)
    assert refused["error"] == {"code": "effectNotFound", "message": f"no effect {run_id}: {hint}"}
    refused = piwf.json("channel", "recover", run_id, "confirm", exit_code=1)
    assert refused["error"] == {
        "code": "channelEffectNotFound",
        "message": f"no channel send {run_id}: {hint}",
    }
    assert piwf.json("run", "show", run_id)["run"]["status"] == "completed"


def test_a_request_id_where_an_effect_id_belongs(piwf: Piwf) -> None:  # noqa: F811
    request_id = "request-" + "2b" * 20
    refused = piwf.json("effect", "resolve", request_id, "--retry", exit_code=1)
    assert refused["error"] == {
        "code": "effectNotFound",
        "message": f"no effect {request_id}: {request_hint(request_id)}",
    }
    refused = piwf.json("channel", "recover", request_id, "retry", exit_code=1)
    assert refused["error"] == {
        "code": "channelEffectNotFound",
        "message": f"no channel send {request_id}: {request_hint(request_id)}",
    }


def test_an_effect_id_or_an_unknown_run_id_where_a_request_id_belongs(piwf: Piwf) -> None:  # noqa: F811
    for error in refusals(piwf, REQUEST_COMMANDS, EFFECT_ID):
        assert error == {
            "code": "requestNotFound",
            "message": f"no request {EFFECT_ID}: {effect_hint(EFFECT_ID)}",
        }
    # A run this home has is named with its requests (tests/cli/test_requests_paused_e2e.py);
    # one it lacks is still a run id by its shape.
    for error in refusals(piwf, REQUEST_COMMANDS, "run-nope"):
        assert error == {
            "code": "requestNotFound",
            "message": "no request run-nope: that is a run id (piwf run show run-nope)",
        }


def test_an_unknown_id_of_the_right_kind_keeps_its_message(piwf: Piwf) -> None:  # noqa: F811
    no_run = (
        f"no run run-nope (piwf run list shows the runs of this state home, PIWF_HOME={piwf.home})"
    )
    for error in refusals(piwf, RUN_COMMANDS, "run-nope"):
        assert error == {"code": "runNotFound", "message": no_run}
    for error in refusals(piwf, RUN_COMMANDS, "nope"):
        assert error["message"].startswith("no run nope (piwf run list shows the runs")
    for error in refusals(piwf, REQUEST_COMMANDS, "request-nope"):
        assert error["message"] == (
            "no request request-nope (piwf requests lists the pending requests of this state"
            f" home, PIWF_HOME={piwf.home})"
        )
    refused = piwf.json("effect", "resolve", EFFECT_ID, "--applied", exit_code=1)
    assert refused["error"] == {
        "code": "effectNotFound",
        "message": f"no effect {EFFECT_ID} (piwf run show RUN_ID lists the effects of a run of"
        f" this state home, PIWF_HOME={piwf.home})",
    }


def test_an_id_a_shell_would_read_is_not_put_in_the_command(piwf: Piwf) -> None:  # noqa: F811
    """The hint is there to be copied: an id with a character a shell reads (``$``, ``;``,
    a quote) is named in the refusal but not in the command, and the human form escapes
    nothing it need not (the id is printable ASCII, the protocol's rule)."""
    given = "request-$(touch${IFS}x);'"
    expected = (
        f"no run {given}: that is a request id (piwf requests lists it while it is pending;"
        " piwf answer REQUEST_ID VALUE or piwf submit REQUEST_ID '<json>' settles it)"
    )
    for error in refusals(piwf, RUN_COMMANDS[:2], given):
        assert error == {"code": "runNotFound", "message": expected}
    refused = piwf.run("effect", "resolve", "run-a;b", "--applied")
    assert refused.returncode == 1
    assert refused.stderr == "Error: no effect run-a;b: that is a run id (piwf run show RUN_ID)\n"
