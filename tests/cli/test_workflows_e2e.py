"""``piwf workflows list | show`` and their client methods, against a real server.

Discovery is what ``run start NAME`` does: the project's ``.piwf/workflows/``, then the home's
``workflows/``, then the built-ins; the first file of a name wins. ``list`` loads no workflow
code; ``show`` loads it in a resolver child, as ``run start`` does.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.errors import RejectedError
from tests.cli.test_cli_e2e import REPO, Piwf, piwf  # noqa: F401 (the fixture)

FIXTURES = REPO / "fixtures" / "workflows"


def write(directory: Path, name: str, source: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def marking(marker: Path, name: str) -> str:
    """A workflow whose import leaves ``marker`` behind (to see whether code was loaded)."""
    return f"""
        import pathlib
        from piwf.workflow import compute, define_workflow

        pathlib.Path({str(marker)!r}).write_text("imported")
        workflow = define_workflow(
            name={name!r}, start_at="only", nodes={{"only": compute(lambda ctx: 1)}}, edges=[]
        )
        """


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "shop"
    (root / ".piwf" / "workflows").mkdir(parents=True)
    return root


def test_list_shows_what_a_name_finds_in_discovery_order_without_loading_code(
    piwf: Piwf,  # noqa: F811
    project: Path,
    tmp_path: Path,
) -> None:
    piwf.home.mkdir(mode=0o700)  # the state home, as piwf would create it
    home_flows = piwf.home / "workflows"
    project_flows = project / ".piwf" / "workflows"
    marker = tmp_path / "imported"
    write(project_flows, "greet", marking(marker, "greet-project"))
    write(home_flows, "greet", marking(marker, "greet-home"))  # hidden by the project's
    write(home_flows, "nightly", marking(marker, "nightly"))
    write(project_flows, "_helper", marking(marker, "helper"))  # never discovered
    listing = piwf.json("workflows", "list", "--project", str(project))
    found = {entry["name"]: (entry["origin"], entry["path"]) for entry in listing["workflows"]}
    assert found["greet"] == ("project", str(project_flows / "greet.py"))
    assert found["nightly"] == ("home", str(home_flows / "nightly.py"))
    assert found["noop"][0] == "builtin"
    assert "_helper" not in found
    assert [place["origin"] for place in listing["directories"]] == ["project", "home", "builtin"]
    assert listing["directories"][0] == {
        "origin": "project",
        "directory": str(project_flows),
        "exists": True,
    }
    assert not marker.exists(), "listing loaded no workflow code"
    text = piwf.run("workflows", "list", "--project", str(project))
    assert text.returncode == 0, text.stderr
    assert "greet" in text.stdout and "searched, in order:" in text.stdout
    # What the listing says is what run start runs: the project's greet.
    started = piwf.json("run", "start", "greet", "--project", str(project), "--wait")
    assert started["run"]["workflowName"] == "greet-project"


def test_show_describes_the_workflow_run_start_would_run(
    piwf: Piwf,  # noqa: F811
    project: Path,
) -> None:
    write(
        project / ".piwf" / "workflows",
        "order",
        """
        from pydantic import BaseModel
        from piwf.workflow import checkpoint, compute, define_workflow

        class Order(BaseModel):
            item: str
            quantity: int = 1

        workflow = define_workflow(
            name="order",
            title="Place an order",
            start_at="check",
            input=Order,
            nodes={
                "place": compute(lambda ctx: {"placed": True}),
                "check": compute(lambda ctx: {"ok": True}),
                "confirm": checkpoint(summary="Confirm the order"),
            },
            edges=[{"from": "check", "to": "confirm"}, {"from": "confirm", "to": "place"}],
        )
        """,
    )
    shown = piwf.json("workflows", "show", "order", "--project", str(project))
    assert shown["name"] == "order"
    assert shown["title"] == "Place an order"
    assert shown["source"] == str(project / ".piwf" / "workflows" / "order.py")
    assert shown["startAt"] == "check"
    # Nodes in the order a run meets them, each with its kind and declared settings.
    assert [(node["nodeId"], node["kind"]) for node in shown["nodes"]] == [
        ("check", "compute"),
        ("confirm", "checkpoint"),
        ("place", "compute"),
    ]
    assert shown["nodes"][1]["structure"] == {"summary": "Confirm the order"}
    assert shown["edges"] == [
        {"from": "check", "to": "confirm"},
        {"from": "confirm", "to": "place"},
    ]
    contract = shown["input"]
    assert (contract["kind"], contract["model"]) == ("model", "Order")
    assert contract["jsonSchema"]["required"] == ["item"]
    # The digest is the one run start records for the same file.
    started = piwf.json(
        "run", "start", "order", "--project", str(project), "--input", '{"item": "tea"}'
    )
    assert started["run"]["definitionDigest"] == shown["definitionDigest"]
    text = piwf.run("workflows", "show", "order", "--project", str(project))
    assert text.returncode == 0, text.stderr
    assert "parsed by the pydantic model Order" in text.stdout
    assert "check -> confirm" in text.stdout


def test_show_names_switch_routes_exits_and_mounts(piwf: Piwf) -> None:  # noqa: F811
    routed = piwf.json("workflows", "show", str(FIXTURES / "failure_route.py"))
    (edge,) = routed["edges"]
    assert edge["switch"]["on"] == "$result.outcome"
    assert routed["nodes"][0]["nodeId"] == "fragile"
    composed = piwf.json("workflows", "show", str(FIXTURES / "composition.py"))
    assert set(composed["includes"]) == {"docs", "workspace"}
    text = piwf.run("workflows", "show", str(FIXTURES / "failure_route.py"))
    assert "fragile on $result.outcome: " in text.stdout


def test_a_workflow_that_does_not_load_is_reported_with_the_loaders_message(
    piwf: Piwf,  # noqa: F811
    project: Path,
) -> None:
    flows = project / ".piwf" / "workflows"
    write(flows, "broken", "import not_a_module_anywhere\n")
    write(
        flows,
        "dangling",
        """
        from piwf.workflow import compute, define_workflow
        workflow = define_workflow(name="dangling", start_at="a",
                                   nodes={"a": compute(lambda ctx: 1)},
                                   edges=[{"from": "a", "to": "b"}])
        """,
    )
    for name, expected in (
        ("broken", "import failed at line 1: ModuleNotFoundError: No module named "),
        ("dangling", "targets unknown node 'b' (line 2)"),
        ("missing", "no workflow named 'missing' (searched"),
    ):
        answer = piwf.json("workflows", "show", name, "--project", str(project), exit_code=1)
        assert answer["error"]["code"] == "workflowLoad", answer
        assert expected in answer["error"]["message"], answer
    # Both broken files are still listed (listing loads nothing) and nothing was recorded.
    names = [
        w["name"] for w in piwf.json("workflows", "list", "--project", str(project))["workflows"]
    ]
    assert {"broken", "dangling"} <= set(names)
    assert piwf.json("run", "list")["runs"] == []


def test_a_workflow_file_that_exits_at_import_is_a_load_error_naming_the_file(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    raises = write(tmp_path / "broken", "raises", "raise SystemExit(3)\n")
    dies = write(tmp_path / "broken", "dies", "import os\nos._exit(0)\n")
    expected = {
        raises: f"{raises}: SystemExit(3) raised while importing it",
        dies: f"the resolver child exited with code 0 while loading {dies} (does the module "
        "call os._exit or exit at import?)",
    }
    for path, message in expected.items():
        for command in (("run", "start"), ("workflows", "show")):
            answer = piwf.json(*command, str(path), exit_code=1)
            assert answer["error"]["code"] == "workflowLoad", answer
            assert answer["error"]["message"].startswith(message), answer
        with Client(piwf.home) as client, pytest.raises(RejectedError) as refused:
            client.start_run(str(path))  # not UnavailableError: a retry would fail the same
        assert refused.value.error_code == "workflowLoad"
        assert str(refused.value).startswith(message)
    assert piwf.json("run", "list")["runs"] == []


def test_a_definition_past_one_frame_is_refused_naming_its_size_and_what_to_do(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    # 15,000 chained nodes compile to about 1.3 MB, past the 1 MiB one frame carries.
    source = """
        from piwf.workflow import compute, define_workflow

        names = [f"step{i:05d}" for i in range(15000)]
        workflow = define_workflow(
            name="huge",
            start_at=names[0],
            nodes={name: compute(lambda ctx: 1) for name in names},
            edges=[{"from": a, "to": b} for a, b in zip(names, names[1:])],
        )
        """
    path = write(tmp_path / "flows", "huge", source)
    for command in (("run", "start"), ("workflows", "show")):
        answer = piwf.json(*command, str(path), exit_code=1)
        assert answer["error"]["code"] == "workflowLoad", answer  # as any definition's refusal
        message = answer["error"]["message"]
        assert message.startswith(f"{path}: its compiled definition takes "), message
        assert "over the 1048576 a definition may take" in message
        assert "pass the data as the run's input" in message
    assert piwf.json("run", "list")["runs"] == []


def test_a_cancelled_error_at_import_is_reported_with_its_line_not_as_an_exit(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    source = "import asyncio\n\nasync def main():\n    raise asyncio.CancelledError\n\n"
    path = write(tmp_path / "broken", "cancelled", source + "asyncio.run(main())\n")
    answer = piwf.json("run", "start", str(path), exit_code=1)
    assert answer["error"]["code"] == "workflowLoad", answer
    # Before 3.11 the loop raises a new CancelledError for the cancelled task: its traceback in
    # the file starts at the asyncio.run() call (line 6), not at the raise (line 4).
    line = 4 if sys.version_info >= (3, 11) else 6
    assert answer["error"]["message"].startswith(
        f"{path}: import failed at line {line}: CancelledError;"
    ), answer
    assert piwf.json("run", "list")["runs"] == []


def test_the_client_lists_and_shows_workflows(
    piwf: Piwf,  # noqa: F811
    project: Path,
) -> None:
    write(
        project / ".piwf" / "workflows",
        "parsed",
        """
        from piwf.workflow import compute, define_workflow

        def parse_order(raw):
            return raw

        workflow = define_workflow(
            name="parsed", start_at="only", input=parse_order,
            nodes={"only": compute(lambda ctx: 1)}, edges=[],
        )
        """,
    )
    with Client(piwf.home) as client:
        listing = client.list_workflows(project=project)
        assert [w.name for w in listing.workflows if w.origin == "project"] == ["parsed"]
        shown = client.show_workflow("parsed", project=project)
        assert (shown.input.kind, shown.input.parser) == ("parser", "parse_order")
        assert client.show_workflow(FIXTURES / "hello.py").input.kind == "any"
        with pytest.raises(RejectedError, match="no workflow named 'nope'") as refused:
            client.show_workflow("nope", project=project)
        assert refused.value.error_code == "workflowLoad"
        # Bad payloads are refused at once, naming the field, before any child starts.
        for operation, payload in (
            ("workflow.list", {"projectPath": "relative/dir"}),
            ("workflow.show", {"workflow": "parsed", "projectPath": "relative/dir"}),
            ("workflow.show", {"workflow": ""}),
            ("workflow.list", {"surprise": True}),
        ):
            with pytest.raises(RejectedError) as bad:
                client.request(operation, payload)  # type: ignore[arg-type]
            assert bad.value.error_code == "invalidPayload", (operation, payload)


def test_a_node_named_twice_in_the_call_is_refused_not_silently_dropped(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Python keeps the last of two equal keys in a dict display, so a second node "fetch"
    replaced the first without a word and the run executed the wrong code."""
    source = """
        from piwf.workflow import compute, define_workflow

        workflow = define_workflow(
            name="twice",
            start_at="fetch",
            nodes={
                "fetch": compute(lambda ctx: "first"),
                "fetch": compute(lambda ctx: "second"),
            },
            edges=[],
        )
        """
    path = write(tmp_path / "flows", "twice", source)
    for command in (("run", "start"), ("workflows", "show")):
        answer = piwf.json(*command, str(path), exit_code=1)
        assert answer["error"] == {
            "code": "workflowLoad",
            "message": f"{path}: line 8: key 'fetch' is written twice in one dict of"
            " define_workflow(...); Python keeps only the last, so the first would be dropped"
            " without a word: give each node, mount, exit and switch case its own name",
        }, answer
    assert piwf.json("run", "list")["runs"] == []


def test_a_file_that_keeps_its_workflow_compiled_runs_as_the_docs_write_it(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The docs' examples write ``workflow = compile_workflow(define_workflow(...))``; such a
    file copied as it stands was refused as defining no workflow."""
    source = """
        from piwf.workflow import compute, define_workflow
        from piwf.workflow.compiler import compile_workflow

        workflow = compile_workflow(
            define_workflow(
                name="kept", start_at="a", nodes={"a": compute(lambda ctx: "ran")}, edges=[]
            )
        )
        """
    path = write(tmp_path / "flows", "kept", source)
    # Named both ways, it is still one definition.
    write(tmp_path / "flows", "both", source + "definition = workflow.definition\n")
    assert piwf.json("workflows", "show", str(tmp_path / "flows" / "both.py"))["name"] == "kept"
    shown = piwf.json("workflows", "show", str(path))
    assert shown["name"] == "kept", shown
    done = piwf.json("run", "start", str(path), "--wait")
    assert (done["run"]["status"], done["output"]) == ("completed", "ran")
