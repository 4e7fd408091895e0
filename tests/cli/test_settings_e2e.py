"""Live settings against a real server, through the installed script and the Python client.

A patch accepted while a run waits is audited and reaches only the attempts that start after
it; an attempt that is running when a patch lands keeps its copy (and its runner keeps its
authority); a patch that is not granted, does not apply, is refused by the workflow's
``parse`` or comes after a newer change is refused with a typed error and changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import textwrap
from pathlib import Path
from typing import Any

import pytest

from piwf.client import Client
from piwf.errors import RejectedError
from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 (the fixture)
from tests.cli.test_timers_e2e import until

LIVE = """
    from typing import Literal

    from pydantic import BaseModel

    from piwf.workflow import checkpoint, compute, define_workflow
    from piwf.workflow.settings import allow_path, settings_route, workflow_settings


    class Routing(BaseModel):
        route: Literal["fast", "careful"]
        limit: int


    workflow = define_workflow(
        name="live",
        start_at="before",
        nodes={
            "before": compute(lambda ctx: ctx.settings.model_dump()),
            "wait": checkpoint(summary="go on?"),
            "pick": settings_route(lambda ctx: ctx.settings.route, choices=["fast", "careful"]),
            "fast": compute(lambda ctx: {"went": "fast", "limit": ctx.settings.limit}),
            "careful": compute(lambda ctx: {"went": "careful", "limit": ctx.settings.limit}),
        },
        edges=[
            {"from": "before", "to": "wait"},
            {"from": "wait", "to": "pick"},
            {"from": "pick", "switch": {"on": "$output.choice",
                                        "cases": {"fast": "fast", "careful": "careful"}}},
        ],
        settings=workflow_settings(
            initial={"route": "fast", "limit": 3},
            parse=Routing,
            description="how the work is routed",
            paths=[
                allow_path("/route", read=["human"], replace=["human"]),
                allow_path("/limit", read=["human"]),
            ],
        ),
    )
    """


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def waiting_request(client: Client, run_id: str) -> str:
    found = until(lambda: client.list_requests(run_id=run_id), "the checkpoint to open")
    return str(found[0].request_id)


def test_a_patch_while_the_run_waits_is_audited_and_reaches_only_later_attempts(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "live.py", LIVE)
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    with Client(home=piwf.home) as client:
        request_id = waiting_request(client, run_id)
    shown = piwf.json("run", "settings", run_id)
    scope = shown["scopes"][0]
    assert (scope["changeNumber"], scope["value"]) == (0, {"route": "fast", "limit": 3})
    assert scope["description"] == "how the work is routed"

    patch = json.dumps([{"op": "replace", "path": "/route", "value": "careful"}])
    changed = piwf.json("run", "settings", run_id, "--patch", patch, "--expect", "0")
    assert changed["scope"]["changeNumber"] == 1
    assert changed["scope"]["value"] == {"route": "careful", "limit": 3}

    assert piwf.json("answer", request_id, '{"approved": true}')["outcome"] == "won"
    finished = piwf.json("run", "wait", run_id, "--timeout", "60")
    assert finished["run"]["status"] == "completed"
    assert finished["output"] == {"went": "careful", "limit": 3}
    steps = {step["path"]: step for step in piwf.json("run", "steps", run_id)["steps"]}
    assert steps["before"]["output"] == {"route": "fast", "limit": 3}  # started before it

    shown_run = piwf.json("run", "show", run_id)
    assert shown_run["settings"] == [{"mountPath": "", "invocation": 1, "changeNumber": 1}]
    assert f"run: change 1 (piwf run settings {run_id})" in piwf.run("run", "show", run_id).stdout
    audit = piwf.json("run", "settings", run_id)["scopes"][0]["changes"]
    assert [(c["changeNumber"], c["actor"]) for c in audit] == [(1, "human")]
    assert audit[0]["patch"] == json.loads(patch)
    database = f"file:{piwf.home / 'state.sqlite'}?mode=ro"
    with contextlib.closing(sqlite3.connect(database, uri=True)) as db:
        copies = db.execute(
            "SELECT a.node_path, s.change_number FROM attempt_settings s"
            " JOIN node_attempts a USING (attempt_id) ORDER BY a.started_at, a.node_path"
        ).fetchall()
        events = db.execute(
            "SELECT count(*) FROM events WHERE event_type = 'settings.changed'"
        ).fetchone()[0]
    assert dict(copies) == {"before": 0, "wait": 0, "pick": 1, "careful": 1}
    assert events == 1


BLOCKING = """
    import pathlib, time

    from piwf.workflow import compute, define_workflow
    from piwf.workflow.settings import allow_path, workflow_settings

    GATE = pathlib.Path({gate!r})


    def hold(ctx):
        before = ctx.settings["level"]
        GATE.with_suffix(".started").write_text("started")
        deadline = time.monotonic() + 60
        while not GATE.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return [before, ctx.settings["level"]]


    workflow = define_workflow(
        name="blocking",
        start_at="hold",
        nodes={{"hold": compute(hold), "next": compute(lambda ctx: ctx.settings["level"])}},
        edges=[{{"from": "hold", "to": "next"}}],
        settings=workflow_settings(
            initial={{"level": 1}},
            paths=[allow_path("", read=["human"], replace=["human"])],
        ),
    )
    """


def test_a_running_attempt_keeps_its_copy_and_its_runner_its_authority(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    flow = write(tmp_path / "blocking.py", BLOCKING.format(gate=str(gate)))
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    until(lambda: gate.with_suffix(".started").exists(), "the first node to start")
    patch = json.dumps([{"op": "replace", "path": "/level", "value": 2}])
    assert piwf.json("run", "settings", run_id, "--patch", patch)["scope"]["changeNumber"] == 1
    gate.write_text("go")
    finished = piwf.json("run", "wait", run_id, "--timeout", "60")
    assert finished["run"]["status"] == "completed", finished
    steps = {step["path"]: step for step in piwf.json("run", "steps", run_id)["steps"]}
    assert steps["hold"]["output"] == [1, 1]
    assert steps["next"]["output"] == 2


def refused(piwf: Piwf, run_id: str, *args: str) -> dict[str, Any]:  # noqa: F811
    answer: dict[str, Any] = piwf.json("run", "settings", run_id, *args, exit_code=1)
    return answer["error"]


def test_refused_patches_say_why_and_change_nothing(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "live.py", LIVE)
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    with Client(home=piwf.home) as client:
        request_id = waiting_request(client, run_id)
        cases = [
            ([{"op": "replace", "path": "/limit", "value": 9}], "'/limit'"),
            ([{"op": "replace", "path": "/route", "value": "sideways"}], "parse refused"),
            ([{"op": "remove", "path": "/route/x"}], "does not apply"),
            ([{"op": "replace", "path": "/route"}], "missing value"),
        ]
        for patch, says in cases:
            error = refused(piwf, run_id, "--patch", json.dumps(patch))
            assert error["code"] == "settingsRefused", error
            assert says in error["message"], error
        assert client.run_settings(run_id).scopes[0].change_number == 0
        for change in ([], ["--patch", json.dumps(cases[0][0])]):
            nowhere = refused(piwf, run_id, "--mount", "nowhere", *change)
            assert nowhere["message"] == (
                "settings of mount 'nowhere': the run's workflow mounts no workflow at that path"
                " (it mounts none); give one of its mount paths, or none for the run's own"
                " workflow"
            ), nowhere

        client.change_settings(run_id, [{"op": "replace", "path": "/route", "value": "careful"}])
        stale = json.dumps([{"op": "replace", "path": "/route", "value": "fast"}])
        conflict = refused(piwf, run_id, "--patch", stale, "--expect", "0")
        assert conflict["code"] == "settingsConflict", conflict
        assert "piwf run settings" in conflict["message"]
        assert client.run_settings(run_id).scopes[0].value == {"route": "careful", "limit": 3}

        client.answer(request_id, {"approved": True})
        assert client.wait_run(run_id, timeout_s=60).run.status == "completed"
    ended = refused(piwf, run_id, "--patch", stale)
    assert "can no longer change" in ended["message"]
    usage = piwf.run("run", "settings", run_id, "--patch", "[1,")
    assert usage.returncode == 2, usage


SESSION_FLOW = """
    from piwf.workflow import allow_path, checkpoint, compute, define_workflow, workflow_settings

    workflow = define_workflow(
        name="tuned",
        start_at="first",
        nodes={"first": compute(lambda ctx: ctx.settings), "wait": checkpoint(summary="ok?")},
        edges=[{"from": "first", "to": "wait"}],
        settings=workflow_settings(
            initial={"tone": "plain", "budget": 1},
            paths=[
                allow_path("/tone", read=["session"], replace=["session", "human"]),
                allow_path("/budget", read=["human"], replace=["human"]),
            ],
        ),
    )
    """


def test_the_origin_session_changes_only_what_the_workflow_grants_it(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "tuned.py", SESSION_FLOW)
    started = piwf.json("run", "start", str(flow), "--session", "session-tuned")
    run_id = started["run"]["runId"]
    with Client(home=piwf.home) as client:
        waiting_request(client, run_id)
        session = client.session("session-tuned")
        tone = [{"op": "replace", "path": "/tone", "value": "warm"}]
        changed = session.change_settings(run_id, tone)
        assert changed.change_number == 1
        assert changed.value == {"tone": "warm"}  # a session reads only what it is granted
        budget = json.dumps([{"op": "replace", "path": "/budget", "value": 5}])
        with pytest.raises(RejectedError) as refused_budget:
            session.change_settings(run_id, json.loads(budget))
        assert refused_budget.value.error_code == "settingsRefused"
        assert "does not let a session replace" in str(refused_budget.value)
        with pytest.raises(RejectedError) as stale:
            client.change_settings(run_id, tone, coordinator_epoch="epoch-not-active")
        assert stale.value.error_code == "sessionAuthority"
        scope = client.run_settings(run_id).scopes[0]
        assert scope.value == {"tone": "warm", "budget": 1}
        assert [(c.change_number, c.actor) for c in scope.changes] == [(1, "session")]
        client.cancel_run(run_id)


ENTERED_AGAIN = """
    from piwf.workflow import compute, define_workflow, include
    from piwf.workflow.settings import allow_path, workflow_settings


    def _inner():
        return define_workflow(
            name="inner", start_at="use", nodes={"use": compute(lambda ctx: 1)}, edges=[],
            exits={"done": {"from": "use"}},
            settings=workflow_settings(
                initial={"notes": "x" * 60_000}, description="entered on every round",
                paths=[allow_path("/notes", read=["human"])],
            ),
        )


    def count(ctx):
        n = (ctx.outputs.get("count") or {"n": 0})["n"] + 1
        return {"n": n, "more": n <= 52}


    workflow = define_workflow(
        name="entered_again", start_at="count", max_steps=200,
        includes={"inner": include(_inner())},
        nodes={"count": compute(count), "end": compute(lambda ctx: "ok")},
        edges=[{"from": "count", "switch": {"on": "$output.more",
                                            "cases": {"true": "inner", "false": "end"}}},
               {"from": "inner.done", "to": "count"}],
    )
    """


def test_a_mount_entered_in_a_loop_shows_its_newest_entries_with_their_count(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Every entry of a mount with settings is a scope: 2,000 entries made ``run.settings``
    larger than one frame. It shows the newest 10 that fit in 512 KiB (eight of 60 KiB each
    here) and ``run.get`` the newest 50 scopes, each with how many there are."""
    workflow = write(tmp_path / "entered_again.py", ENTERED_AGAIN)
    run_id = piwf.json("run", "start", str(workflow))["run"]["runId"]
    assert piwf.json("run", "wait", run_id, "--timeout", "120")["run"]["status"] == "completed"

    shown = piwf.json("run", "settings", run_id, "--mount", "inner")
    assert shown["scopeCount"] == 52
    assert [scope["invocation"] for scope in shown["scopes"]] == list(range(45, 53))
    human = piwf.run("run", "settings", run_id, "--mount", "inner").stdout
    assert human.startswith("entries of mount 'inner' (the newest 8 of 52):\n")

    detail = piwf.json("run", "show", run_id)
    assert detail["settingsCount"] == 52
    assert [scope["invocation"] for scope in detail["settings"]] == list(range(3, 53))
    line = f"(the newest 50 of 52; piwf run settings {run_id})"
    assert line in piwf.run("run", "show", run_id).stdout
