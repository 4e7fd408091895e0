"""The live run view (``piwf.run-view.v1``) and its renderers, on real servers.

Each test drives a run into one situation (running a node, waiting on a request, paused,
parked on a changed source, every slot busy, an ambiguous effect, failed, many steps) and reads
it the ways a user does: ``Client.run_view``, ``piwf run show --json``, ``piwf run explain
--json`` and ``piwf run steps --json``. Every renderer must show the display the server
derived (I7). Gate files hold nodes at known points; every wait polls against a deadline.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from piwf import Client
from piwf.cli.effects import effect_resolve
from piwf.protocol.view_payloads import STEP_PAGE_BYTES, RunView
from tests.cli_process import PIWF
from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_agent_deadlines import piwf
from tests.server.test_content_refs import BIG_OUTPUT, big_value, digest
from tests.server.test_execution import FAST, hold_until_gate, start, write_workflow

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT = str(REPO / "fixtures" / "workflows" / "checkpoint_review.py")


def gated_workflow(directory: Path, name: str, entered: Path, gate: Path) -> str:
    """``first`` (completes) then ``hold`` (blocks on ``gate``) then ``last``."""
    return write_workflow(
        directory,
        name,
        f"""
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def hold(ctx):
            ctx.publish_update("progress", "main", {{"stage": "holding"}})
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return {{"held": True}}

        workflow = define_workflow(
            name={name!r},
            start_at="first",
            nodes={{
                "first": compute(lambda ctx: {{"n": 1}}),
                "hold": compute(hold),
                "last": compute(lambda ctx: {{"done": True}}),
            }},
            edges=[{{"from": "first", "to": "hold"}}, {{"from": "hold", "to": "last"}}],
        )
        """,
    )


def cli_json(server: ServerProcess, *args: str, exit_code: int = 0) -> Any:
    result = piwf(server, *args, "--json")
    assert result.returncode == exit_code, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def every_renderer(server: ServerProcess, run_id: str) -> tuple[RunView, dict[str, Any]]:
    """The view through the client, and the explanation; asserts the renderers agree."""
    with Client(server.home, autostart=False) as client:
        view = client.run_view(run_id)
    shown = cli_json(server, "run", "show", run_id)
    explained = cli_json(server, "run", "explain", run_id)
    if shown["run"]["revision"] == view.revision:  # the run may move on between the reads
        assert shown["display"] == view.display.to_wire()
    assert explained["status"] in {view.display.status, shown["display"]["status"]}
    return view, explained


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


# conformance: I7
def test_a_running_run_shows_its_current_node_its_steps_and_its_updates(
    server: ServerProcess, tmp_path: Path
) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = gated_workflow(tmp_path, "gated", entered, gate)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "gated")
    wait_for(entered.exists, timeout_s=30, what="the hold node")
    view, explained = every_renderer(server, run_id)
    display = view.display
    assert (display.status, display.activity) == ("running", "executing")
    assert display.current_node is not None
    assert (display.current_node.path, display.current_node.visit) == ("hold", 1)
    assert display.controls == ["pause", "cancel"]
    topology = view.topology
    assert topology is not None and topology.start_at == "first"
    assert [(n.path, n.kind) for n in topology.nodes] == [
        ("first", "compute"),
        ("hold", "compute"),
        ("last", "compute"),
    ]
    assert [(e.source, e.to) for e in topology.edges] == [("first", "hold"), ("hold", "last")]
    assert [(s.path, s.outcome, s.output) for s in view.steps.steps] == [
        ("first", "completed", {"n": 1})
    ]
    assert explained["cause"] == "running" and '"hold"' in explained["explanation"]
    gate.touch()
    with Client(server.home, autostart=False) as client:
        assert client.wait_run(run_id, 30).run.status == "completed"
        steps = client.run_steps(run_id)
        view = client.run_view(run_id)
    assert [(s.index, s.path, s.outcome) for s in steps] == [
        (0, "first", "completed"),
        (1, "hold", "completed"),
        (2, "last", "completed"),
    ]
    held = steps[1]
    assert [(u.type, u.key, u.data) for u in held.updates] == [
        ("progress", "main", {"stage": "holding"})
    ]
    assert held.duration_ms is not None and held.duration_ms >= 0
    assert (view.display.status, view.display.activity, view.display.controls) == (
        "completed",
        "idle",
        ["restart"],
    )
    listed = cli_json(server, "run", "steps", run_id)
    assert [s["path"] for s in listed["steps"]] == ["first", "hold", "last"]


def waiting_at_a_checkpoint(server: ServerProcess) -> str:
    """Start a run of :data:`CHECKPOINT` and return its id once it waits for the answer."""
    with raw_client(server) as client:
        run_id = start(client, CHECKPOINT, {"steps": ["a"]}, "review")
    with Client(server.home, autostart=False) as client:
        wait_for(
            lambda: client.run_view(run_id).display.status == "waiting",
            timeout_s=30,
            what="the checkpoint",
        )
    return run_id


def test_a_waiting_run_names_its_request_and_the_command_that_answers_it(
    server: ServerProcess,
) -> None:
    run_id = waiting_at_a_checkpoint(server)
    view, explained = every_renderer(server, run_id)
    waiting = view.display.waiting_on
    assert waiting is not None
    assert (waiting.path, waiting.kind, waiting.action) == ("review", "checkpoint", "answer")
    assert waiting.command == f"piwf answer {waiting.request_id} VALUE"
    assert view.display.activity == "waitingForPerson"
    assert view.display.current_node is None
    assert view.display.controls == ["answer", "pause", "cancel"]
    assert explained["cause"] == "waiting"
    assert explained["commands"] == [waiting.command]
    shown = piwf(server, "run", "show", run_id)
    assert f"next      {waiting.command}" in shown.stdout


def test_a_paused_waiting_run_offers_no_answer(server: ServerProcess) -> None:
    # A paused run refuses answers (runPaused): its controls must not offer one.
    run_id = waiting_at_a_checkpoint(server)
    with Client(server.home, autostart=False) as client:
        client.pause_run(run_id)
        view = client.run_view(run_id)
    assert view.display.status == "paused"
    assert view.display.controls == ["resume", "cancel"]
    shown = piwf(server, "run", "show", run_id)
    assert "controls  resume, cancel" in shown.stdout


def test_a_paused_run_says_resume(server: ServerProcess, tmp_path: Path) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = gated_workflow(tmp_path, "paused", entered, gate)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "paused")
        wait_for(entered.exists, timeout_s=30, what="the hold node")
        assert client.request("run.pause", key="pause", run_id=run_id).outcome == "accepted"
    gate.touch()
    view, explained = every_renderer(server, run_id)
    assert (view.display.status, view.display.activity) == ("paused", "blocked")
    assert view.display.controls == ["resume", "cancel"]
    assert explained["cause"] == "paused"
    assert explained["commands"] == [f"piwf run resume {run_id}"]


def test_a_run_parked_on_a_changed_source_names_the_file(
    server: ServerProcess, tmp_path: Path
) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = gated_workflow(tmp_path, "changed", entered, gate)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "changed")
        wait_for(entered.exists, timeout_s=30, what="the hold node")
        assert client.request("run.pause", key="pause", run_id=run_id).outcome == "accepted"
        Path(workflow).write_text(Path(workflow).read_text() + "\n# changed\n")
        gate.touch()
        assert client.request("run.resume", key="resume", run_id=run_id).outcome == "accepted"
    with Client(server.home, autostart=False) as client:
        wait_for(
            lambda: client.run_view(run_id).display.reason_code == "sourceChanged",
            timeout_s=30,
            what="the run to park sourceChanged",
        )
    view, explained = every_renderer(server, run_id)
    assert (view.display.status, view.display.activity) == ("queued", "blocked")
    assert view.display.reason is not None and workflow in view.display.reason
    assert explained["cause"] == "sourceChanged"
    assert workflow in explained["explanation"]
    assert explained["commands"][0] == f"piwf run resume {run_id}"


def test_a_reason_above_16_kib_travels_by_reference_and_arrives_whole(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Five mounted workflows deep in long directory names: the changed-files reason is
    about 20 KB, so the display carries a notice and ``reasonRef``, and the client reads the
    whole list back into ``reason``."""
    deep = tmp_path.joinpath(*(["d" * 240] * 15))
    deep.mkdir(parents=True)
    children = []
    for index in range(5):
        child = deep / f"child{index}.py"
        child.write_text(
            "from piwf.workflow import compute, define_workflow\n"
            f"workflow = define_workflow(name='child{index}', start_at='n',"
            " nodes={'n': compute(lambda ctx: {})}, edges=[], exits={'done': {'from': 'n'}})\n"
        )
        children.append(child)
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    relative = os.path.relpath(deep, tmp_path)
    mounts = ", ".join(f"'m{i}': include('./{relative}/child{i}.py')" for i in range(5))
    edges = ", ".join(
        [
            "{'from': 'first', 'to': 'hold'}",
            "{'from': 'hold', 'to': 'm0'}",
            *(f"{{'from': 'm{i}.done', 'to': 'm{i + 1}'}}" for i in range(4)),
        ]
    )
    workflow = write_workflow(
        tmp_path,
        "deep",
        f"""
        from piwf.workflow import compute, define_workflow, include

        {hold_until_gate()}

        def hold(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return {{}}

        workflow = define_workflow(
            name="deep", start_at="first", includes={{{mounts}}},
            nodes={{"first": compute(lambda ctx: {{}}), "hold": compute(hold)}},
            edges=[{edges}],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "deep")
        wait_for(entered.exists, timeout_s=30, what="the hold node")
        assert client.request("run.pause", key="pause", run_id=run_id).outcome == "accepted"
        for child in children:
            child.write_text(child.read_text() + "# changed\n")
        gate.touch()
        assert client.request("run.resume", key="resume", run_id=run_id).outcome == "accepted"
        wait_for(
            lambda: (
                client.request("view.run.get", run_id=run_id).receipt["display"].get("reasonCode")
                == "sourceChanged"
            ),
            timeout_s=30,
            what="the run to park sourceChanged",
        )
        display = client.request("view.run.get", run_id=run_id).receipt["display"]
        reference = display["reasonRef"]
        assert reference["length"] > 16 * 1024
        assert "reasonRef" in display["reason"] and str(children[0]) not in display["reason"]
        shown = client.request("run.get", run_id=run_id).receipt["parkedReason"]
        assert shown.endswith(f"more characters: piwf run explain {run_id})")
    with Client(server.home, autostart=False) as client:
        whole = client.run_view(run_id).display
    assert whole.reason_ref is None and whole.reason is not None
    assert all(str(child) in whole.reason for child in children)
    explained = cli_json(server, "run", "explain", run_id, "--json")
    assert explained["cause"] == "sourceChanged"
    assert str(children[4]) in explained["explanation"]


def test_a_run_waiting_for_a_slot_names_the_runs_that_hold_them(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = servers.start(env={**FAST, "PIWF_MAX_WORKERS": "1"})
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = gated_workflow(tmp_path, "slot", entered, gate)
    with raw_client(server) as client:
        holder = start(client, workflow, {}, "holder")
        wait_for(entered.exists, timeout_s=30, what="the holder's node")
        queued = start(client, CHECKPOINT, {"steps": []}, "queued")
        behind = start(client, CHECKPOINT, {"steps": []}, "behind")
    try:
        view, explained = every_renderer(server, queued)
        assert (view.display.status, view.display.activity) == ("queued", "waitingForSlot")
        assert view.display.capacity is not None
        assert view.display.capacity.holders == [holder]
        assert view.display.capacity.queued_ahead == 0
        assert explained["cause"] == "capacityFull" and holder in explained["explanation"]
        # The command runs as printed: one more slot than the server has.
        assert explained["commands"] == ["piwf server stop && piwf server start --max-workers 2"]
        # The run behind it is told that another goes first, not that it starts next.
        view, explained = every_renderer(server, behind)
        assert view.display.capacity is not None and view.display.capacity.queued_ahead == 1
        assert "1 run is queued ahead of this one" in explained["explanation"]
        assert holder in explained["explanation"]
    finally:
        gate.touch()


def test_an_ambiguous_effect_is_named_with_the_command_that_resolves_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write_workflow(
        tmp_path,
        "manual",
        """
        import os
        from piwf.workflow import action, define_workflow, manual_effect

        workflow = define_workflow(
            name="manual",
            start_at="post",
            nodes={"post": action(effect=manual_effect("chat.post"), run=lambda ctx: os._exit(23))},
            edges=[],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "manual")
    with Client(server.home, autostart=False) as client:
        wait_for(
            lambda: client.run_view(run_id).display.status == "ambiguous",
            timeout_s=30,
            what="the ambiguous effect",
        )
    view, explained = every_renderer(server, run_id)
    (effect,) = view.display.effects_to_resolve
    assert effect.effect_type == "chat.post"
    assert "resolve" in view.display.controls
    assert explained["cause"] == "effectAmbiguous"
    assert explained["commands"][0] == effect.command
    program, options = effect.command.rsplit(" ", 1)
    assert program == f"piwf effect resolve {effect.effect_id}"
    for option in options.split("|"):  # each one the command really has (click raises if not)
        effect_resolve.make_context("resolve", [effect.effect_id, option])


def test_a_failed_run_names_its_node_and_how_to_run_it_again(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write_workflow(
        tmp_path,
        "fails",
        """
        from piwf.workflow import compute, define_workflow

        def lookup(ctx):
            return {"v": {}["missing"]}

        workflow = define_workflow(
            name="fails",
            start_at="ok",
            nodes={"ok": compute(lambda ctx: {}), "lookup": compute(lookup)},
            edges=[{"from": "ok", "to": "lookup"}],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "fails")
    with Client(server.home, autostart=False) as client:
        assert client.wait_run(run_id, 30).run.status == "failed"
    view, explained = every_renderer(server, run_id)
    last = view.steps.steps[-1]
    assert (last.path, last.outcome) == ("lookup", "failed")
    assert last.failure is not None and last.failure.error_type == "KeyError"
    assert explained["cause"] == "failed"
    assert 'node "lookup"' in explained["explanation"] and "KeyError" in explained["explanation"]
    assert explained["commands"] == [f"piwf run restart {run_id}"]
    steps = piwf(server, "run", "steps", run_id)
    assert "lookup" in steps.stdout and "KeyError: 'missing'" in steps.stdout


def test_many_steps_page_within_their_item_limit_and_byte_budget(
    server: ServerProcess, tmp_path: Path
) -> None:
    """70 visits of a loop with 10 KiB outputs (two of 40 KiB), then a last node: pages stop
    at their byte budget, an output above the inline threshold travels by reference, and the
    client reads every page and value."""
    workflow = write_workflow(
        tmp_path,
        "loop",
        """
        from piwf.workflow import compute, define_workflow

        def step(ctx):
            n = ctx.outputs.get("step", {}).get("n", 0) + 1
            pad = 40_000 if n in (10, 50) else 10_000
            return {"n": n, "pad": "x" * pad, "route": "again" if n < 70 else "done"}

        workflow = define_workflow(
            name="loop",
            start_at="step",
            max_steps=200,
            nodes={"step": compute(step), "finish": compute(lambda ctx: {"n": 0})},
            edges=[
                {
                    "from": "step",
                    "switch": {"on": "$output.route", "cases": {"again": "step", "done": "finish"}},
                }
            ],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "loop")
    with Client(server.home, autostart=False) as client:
        assert client.wait_run(run_id, 60).run.status == "completed"
        raw = client.request("view.run.get", {"stepLimit": 200}, run_id=run_id).receipt
        assert raw is not None
        first = raw["steps"]
        assert first["total"] == 71
        assert 1 <= len(first["steps"]) < 71, "the byte budget ends the page before its limit"
        assert first["nextCursor"] == str(first["steps"][-1]["index"])
        assert len(json.dumps(first["steps"])) <= STEP_PAGE_BYTES + 11_000
        assert raw["topology"]["edges"] == [
            {"from": "step", "on": "$output.route", "cases": {"again": "step", "done": "finish"}}
        ]
        by_reference = [step["index"] for step in first["steps"] if "outputRef" in step]
        assert by_reference == [9], "the 40 KiB output of visit 10, and only it"
        steps = client.run_steps(run_id, page_limit=200)
    assert [step.index for step in steps] == list(range(71))
    assert [step.output["n"] for step in steps] == [*range(1, 71), 0]
    assert all(step.output_ref is None for step in steps), "every reference was read"


def test_bad_view_requests_are_refused_and_change_nothing(server: ServerProcess) -> None:
    with raw_client(server) as client:
        run_id = start(client, CHECKPOINT, {"steps": []}, "bad")
        unknown = client.request("view.run.get", {}, run_id="run-doesnotexist00")
        assert (unknown.outcome, unknown.error and unknown.error.code) == (
            "notFound",
            "runNotFound",
        )
        for payload in (
            {"kind": "steps", "cursor": "not-a-cursor"},
            {"kind": "steps", "cursor": "-1"},
            {"kind": "nodes", "cursor": "1"},
            {"kind": "steps", "cursor": "1", "limit": 0},
            {"kind": "steps", "cursor": "1", "unknown": True},
        ):
            refused = client.request("view.page", payload, run_id=run_id)
            assert refused.outcome == "rejected", (payload, refused)
            assert refused.error is not None and refused.error.code == "invalidPayload"
        too_many = client.request("view.run.get", {"stepLimit": 10_000}, run_id=run_id)
        assert too_many.outcome == "rejected"
    missing = piwf(server, "run", "explain", "run-doesnotexist00")
    assert missing.returncode == 1 and "run-doesnotexist00" in missing.stderr


def test_the_cli_commands_answer_help(server: ServerProcess) -> None:
    for command in ("steps", "explain"):
        result = piwf(server, "run", command, "--help")
        assert result.returncode == 0 and "Example:" in result.stdout


class Terminal:
    """A ``piwf`` command whose standard error is a real pseudo-terminal (its progress goes
    there only on a terminal); stdout is a pipe, as a script would redirect it."""

    def __init__(self, server: ServerProcess, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [str(PIWF), *args],
            env={**os.environ, "PIWF_HOME": str(server.home)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        )
        os.close(slave)
        self.seen = ""

    def until(self, text: str, timeout_s: float = 30.0) -> str:
        """Read the terminal until ``text`` appears (bounded); return all read so far."""
        deadline = time.monotonic() + timeout_s
        while text not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never appeared on the terminal: {self.seen!r}"
            readable, _, _ = select.select([self.master], [], [], left)
            if readable:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the command ended and closed the terminal
                    chunk = b""
                assert chunk, f"{text!r} never appeared before the end: {self.seen!r}"
                self.seen += chunk.decode("utf-8", "replace").replace("\r\n", "\n")
        return self.seen

    def finish(self, timeout_s: float = 60.0) -> tuple[int, str]:
        out, _ = self.process.communicate(timeout=timeout_s)
        os.close(self.master)
        return self.process.returncode, out

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def test_run_start_wait_shows_live_progress_on_a_terminal_and_prints_the_output(
    server: ServerProcess, tmp_path: Path
) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = gated_workflow(tmp_path, "live", entered, gate)
    terminal = Terminal(server, "run", "start", workflow, "--wait", "--timeout", "60")
    try:
        terminal.until('completed "first"')
        terminal.until('running "hold"')
        seen = terminal.until('progress main: {"stage":"holding"}')
        assert 'running "last"' not in seen, "progress comes while the run runs"
        gate.touch()
        terminal.until('completed "last"')
        code, out = terminal.finish()
    finally:
        terminal.kill()
    assert code == 0
    assert out.splitlines()[-1] == 'output: {"done":true}'


def test_a_wait_on_a_terminal_names_the_request_and_the_answer_command(
    server: ServerProcess,
) -> None:
    terminal = Terminal(server, "run", "start", CHECKPOINT, "--input", '{"steps": ["a"]}', "--wait")
    try:
        seen = terminal.until("(checkpoint): piwf answer ")
        line = next(line for line in seen.splitlines() if "piwf answer " in line)
        assert 'waiting at "review" for request request-' in line
        request_id = line.split("piwf answer ", 1)[1].split()[0]
        answered = piwf(server, "answer", request_id, '{"ok": true}')
        assert answered.returncode == 0, answered.stderr
        code, out = terminal.finish()
    finally:
        terminal.kill()
    assert code == 0
    assert out.splitlines()[-1].startswith("output: ")
    assert '"applied":["a"]' in out


def test_a_wait_whose_stderr_is_not_a_terminal_prints_no_progress(
    server: ServerProcess,
) -> None:
    result = piwf(
        server,
        "run",
        "start",
        str(REPO / "fixtures" / "workflows" / "hello.py"),
        "--input",
        '{"who": "ada"}',
        "--wait",
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines()[-1] == 'output: {"shouted":"HELLO ADA"}'


def test_run_list_filters_by_display_status(server: ServerProcess, tmp_path: Path) -> None:
    hello = str(REPO / "fixtures" / "workflows" / "hello.py")
    with raw_client(server) as client:
        done = start(client, hello, {"who": "ada"}, "done")
        waiting = start(client, CHECKPOINT, {"steps": []}, "waiting")
    with Client(server.home, autostart=False) as client:
        assert client.wait_run(done, 30).run.status == "completed"
        wait_for(
            lambda: client.run_view(waiting).display.status == "waiting",
            timeout_s=30,
            what="the checkpoint",
        )
        assert [run.run_id for run in client.list_runs(status="waiting").runs] == [waiting]
    listed = cli_json(server, "run", "list", "--status", "completed")
    assert [run["runId"] for run in listed["runs"]] == [done]
    assert cli_json(server, "run", "list", "--status", "failed")["runs"] == []
    assert {run["runId"] for run in cli_json(server, "run", "list")["runs"]} == {done, waiting}
    bad = piwf(server, "run", "list", "--status", "stuck")
    assert bad.returncode == 2 and "stuck" in bad.stderr
    with raw_client(server) as client:
        refused = client.request("run.list", {"status": "stuck"})
    assert refused.outcome == "rejected"
    assert refused.error is not None and refused.error.code == "invalidPayload"


def follow_past_a_gate(server: ServerProcess, run_id: str, until: str, gate: Path) -> str:
    """Run ``piwf run show RUN --follow`` until it prints a line starting with ``until``, then
    open ``gate`` and return everything it printed once the run ended (it must exit 0)."""
    follower = subprocess.Popen(
        [str(PIWF), "run", "show", run_id, "--follow"],
        env={**os.environ, "PIWF_HOME": str(server.home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while not any(line.startswith(until) for line in lines):
            assert time.monotonic() < deadline, lines
            lines.append(follower.stdout.readline())
        gate.touch()
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(timeout=10)
    assert follower.returncode == 0, err
    return "".join(lines) + out


def test_run_show_follow_prints_the_run_then_its_progress_until_it_ends(
    server: ServerProcess, tmp_path: Path
) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = gated_workflow(tmp_path, "follow", entered, gate)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "follow")
    wait_for(entered.exists, timeout_s=30, what="the hold node")
    text = follow_past_a_gate(server, run_id, "following", gate)
    assert 'now       running node "hold"' in text
    after = text.split("following (Ctrl-C stops):", 1)[1]
    assert 'completed "hold"' in after and 'completed "last"' in after
    assert 'completed "first"' not in after, "a step the table showed is not printed again"
    assert after.splitlines()[-1] == 'output: {"done":true}'
    both = piwf(server, "run", "show", run_id, "--follow", "--json")
    assert both.returncode == 2 and "--follow" in json.loads(both.stdout)["error"]["message"]


def test_run_show_follow_prints_what_a_node_wrote_with_its_control_characters_escaped(
    server: ServerProcess, tmp_path: Path
) -> None:
    """An update's data, a step's failure and the run's error hold a terminal escape (it would
    set the terminal's title) and a right-to-left override: --follow shows them escaped."""
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = write_workflow(
        tmp_path,
        "noisy",
        f"""
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        TEXT = "\\x1b]0;HIJACKED\\x07abc\\u202eevil"

        def noisy(ctx):
            ctx.publish_update("progress", "main", {{"note": TEXT}})
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            raise RuntimeError("failed: " + TEXT)

        workflow = define_workflow(
            name="noisy", start_at="noisy", nodes={{"noisy": compute(noisy)}}, edges=[]
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "noisy")
    wait_for(entered.exists, timeout_s=30, what="the noisy node")
    text = follow_past_a_gate(server, run_id, "    progress main", gate)
    after = text.split("following (Ctrl-C stops):", 1)[1]
    assert "\x1b" not in after and "\x07" not in after and "\u202e" not in after, repr(after)
    assert r'progress main: {"note":"\u001b]0;HIJACKED\u0007abc\u202eevil"}' in after, after
    shown = r"failed: \x1b]0;HIJACKED\x07abc\u202eevil"
    assert 'failed "noisy" in ' in after and f"RuntimeError: {shown}" in after, after
    assert after.splitlines()[-1].startswith("error: ") and shown in after.splitlines()[-1]


def large_step_output_pages_through_a_reference(server: ServerProcess, n: int) -> None:
    """A step whose output is far beyond a frame: its view page carries a reference, and the
    client's steps hold the complete, verified value (big_output fixture: 9 bytes an item)."""
    expected = digest(big_value(n))
    with Client(server.home, autostart=False, request_timeout_s=120) as client:
        run = client.start_run(BIG_OUTPUT, input={"n": n})
        assert client.wait_run(run.run_id, timeout_s=300).run.status == "completed"
        raw = client.request("view.run.get", {}, run_id=run.run_id).receipt
        assert raw is not None
        (step,) = raw["steps"]["steps"]
        assert "output" not in step and step["outputRef"]["length"] > 9 * n
        (read,) = client.run_steps(run.run_id)
    assert digest(read.output) == expected


def test_a_large_step_output_pages_through_a_reference(server: ServerProcess) -> None:
    large_step_output_pages_through_a_reference(server, 400_000)  # 3.6 MB


@pytest.mark.soak
def test_a_fifty_mib_step_output_pages_through_a_reference(server: ServerProcess) -> None:
    large_step_output_pages_through_a_reference(server, 50 * 1024 * 1024 // 9)


def test_explain_names_a_runner_that_made_no_progress(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write_workflow(
        tmp_path,
        "always_dies",
        """
        import os
        from piwf.workflow import compute, define_workflow

        workflow = define_workflow(
            name="always_dies", start_at="die",
            nodes={"die": compute(lambda ctx: os._exit(23))}, edges=[],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "dies")
    with Client(server.home, autostart=False) as client:
        wait_for(
            lambda: client.run_view(run_id).display.reason_code == "runnerNoProgress",
            timeout_s=30,
            what="the no-progress park",
        )
    view, explained = every_renderer(server, run_id)
    assert (view.display.status, view.display.activity) == ("queued", "blocked")
    assert view.display.controls == ["resume", "cancel"]
    assert explained["cause"] == "runnerNoProgress"
    assert explained["commands"] == [f"piwf run resume {run_id}"]


def test_explain_names_a_crash_loop_and_the_resume_that_ends_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Each generation publishes an update (progress) and dies before its node finishes: the
    fifth crash in a row parks the run ``runnerCrashed`` (after back-offs of 1, 2 and 4 s)."""
    workflow = write_workflow(
        tmp_path,
        "crash_loop",
        """
        import os
        from piwf.workflow import compute, define_workflow

        def die(ctx):
            ctx.publish_update("progress", "main", {"stage": "about to crash"})
            os._exit(23)

        workflow = define_workflow(
            name="crash_loop", start_at="die", nodes={"die": compute(die)}, edges=[],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "crash_loop")
    with Client(server.home, autostart=False) as client:
        wait_for(
            lambda: client.run_view(run_id).display.reason_code == "runnerCrashed",
            timeout_s=60,
            what="the crash-loop park",
        )
    view, explained = every_renderer(server, run_id)
    assert (view.display.status, view.display.activity) == ("queued", "blocked")
    assert view.display.reason is not None and "crashed 5 times in a row" in view.display.reason
    assert explained["cause"] == "runnerCrashed"
    assert view.display.reason in explained["explanation"]
    assert explained["commands"] == [f"piwf run resume {run_id}"]


def test_explain_names_a_runner_that_broke_the_protocol(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write_workflow(
        tmp_path,
        "hostile",
        """
        import gc
        from piwf.workflow import compute, define_workflow

        def attack(ctx):
            from piwf.runner.workflow_runner import PipePort
            found = next(o for o in gc.get_objects() if isinstance(o, PipePort))
            found.call("drop_tables", {"run_id": ctx.run_id})
            return {}

        workflow = define_workflow(
            name="hostile", start_at="attack", nodes={"attack": compute(attack)}, edges=[]
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "hostile")
    with Client(server.home, autostart=False) as client:
        wait_for(
            lambda: client.run_view(run_id).display.reason_code == "protocolRejected",
            timeout_s=30,
            what="the protocolRejected park",
        )
    view, explained = every_renderer(server, run_id)
    assert view.display.activity == "blocked"
    assert explained["cause"] == "protocolRejected"
    assert view.display.reason is not None and view.display.reason in explained["explanation"]
    assert explained["commands"] == [f"piwf run resume {run_id}"]
