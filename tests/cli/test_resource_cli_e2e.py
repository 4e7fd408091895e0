"""``piwf resource ...`` from the installed script against a real server, as a user drives it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cli.test_cli_e2e import REPO, Piwf, piwf  # noqa: F401 - piwf is the fixture
from tests.server.harness import wait_for

GREETING = REPO / "fixtures" / "resource_managers" / "greeting.py"


def project_with_manager(tmp_path: Path, name: str, source: str) -> tuple[Path, tuple[str, str]]:
    """A project whose ``.piwf/resource_managers/NAME.py`` holds ``source``; returns the file
    and the ``--project`` option that names the project."""
    managers = tmp_path / "project" / ".piwf" / "resource_managers"
    managers.mkdir(parents=True)
    module = managers / f"{name}.py"
    module.write_text(source)
    return module, ("--project", str(managers.parent.parent))


def last_error(piwf: Piwf, manager: str, key: str) -> str:  # noqa: F811
    """Wait (bounded) until the resource's queue records a reconcile's error; return it."""
    error: str = wait_for(
        lambda: (
            piwf.json("resource", "get", manager, key)["resource"].get("queue", {}).get("lastError")
        ),
        timeout_s=30,
        what="the reconcile's error",
    )
    return error


def test_resource_apply_get_list_reconcile_and_delete(piwf: Piwf, tmp_path: Path) -> None:  # noqa: F811
    project = tmp_path / "project"
    (project / ".piwf" / "resource_managers").mkdir(parents=True)
    (project / ".piwf" / "resource_managers" / "greeting.py").symlink_to(GREETING)
    out = tmp_path / "out"
    out.mkdir()
    spec = f'{{"dir": "{out}", "name": "Ada"}}'
    where = ("--project", str(project))

    created = piwf.json("resource", "apply", "greeting", "ada", "--spec", spec, *where)
    assert created["outcome"] == "created"
    assert created["resource"]["generation"] == 1

    def settled() -> object:
        detail = piwf.json("resource", "get", "greeting", "ada")
        ready = detail["resource"]["state"] == "settled" and detail["status"].get("phase")
        return detail if ready == "ready" else None

    detail = wait_for(settled, timeout_s=30, what="the resource to converge")
    assert detail["resource"]["ready"] == "True"
    assert (out / "ada.txt").read_text() == "HELLO ADA\n"

    listing = piwf.json("resource", "list")
    assert [(r["manager"], r["key"], r["state"]) for r in listing["resources"]] == [
        ("greeting", "ada", "settled")
    ]
    human = piwf.run("resource", "list")
    assert human.returncode == 0
    assert "greeting  ada" in human.stdout
    # A manager with no resources is a filter that matched none, named back.
    other = piwf.run("resource", "list", "--manager", "greeter")
    assert other.returncode == 0
    assert other.stdout == (
        "no managed resources of manager 'greeter' (piwf resource list shows every manager's)\n"
    )

    enqueued = piwf.json("resource", "reconcile", "greeting", "ada")
    assert enqueued["outcome"] == "enqueued"
    assert enqueued["resource"]["resourceVersion"] == detail["resource"]["resourceVersion"]

    deleting = piwf.json("resource", "delete", "greeting", "ada")
    assert deleting["deleted"] is False

    def gone() -> bool:
        return piwf.run("resource", "get", "greeting", "ada").returncode == 1

    wait_for(gone, timeout_s=30, what="the deletion")
    assert not (out / "ada.txt").exists()
    missing = piwf.json("resource", "get", "greeting", "ada", exit_code=1)
    assert missing["error"]["code"] == "resourceNotFound"
    unknown = piwf.json("resource", "apply", "nobody", "x", "--spec", "{}", *where, exit_code=1)
    assert unknown["error"]["code"] == "resourceManagerLoad"
    usage = piwf.json("resource", "apply", "greeting", "x", "--spec", "[1]", exit_code=2)
    assert usage["error"]["code"] == "usage"


KEEPER = """
from piwf.resource import define_resource_manager, settled

def reconcile(ctx, resource):
    return settled(finalizers=[{finalizers}])

manager = define_resource_manager(
    name="keeper", initial_status=lambda spec: {{}}, reconcile=reconcile, timeout_ms=10_000
)
"""


def test_resource_refusals_say_what_to_do_next(piwf: Piwf, tmp_path: Path) -> None:  # noqa: F811
    managers = tmp_path / "project" / ".piwf" / "resource_managers"
    managers.mkdir(parents=True)
    keeper = managers / "keeper.py"
    keeper.write_text(KEEPER.format(finalizers='"t.example/keep"'))
    where = ("--project", str(managers.parent.parent))

    for command in ("get", "delete", "reconcile"):
        missing = piwf.json("resource", command, "keeper", "nobody", exit_code=1)
        assert missing["error"] == {
            "code": "resourceNotFound",
            "message": "no resource 'nobody' of manager 'keeper' (piwf resource list shows the"
            f" resources of this state home, PIWF_HOME={piwf.home})",
        }

    big = tmp_path / "big.json"
    big.write_text('{"x": "' + "a" * 300_000 + '"}')
    too_large = piwf.json(
        "resource", "apply", "keeper", "k", "--spec-file", str(big), *where, exit_code=1
    )
    assert too_large["error"]["code"] == "resourceSpec"
    assert too_large["error"]["message"] == (
        "the spec is 300008 bytes of JSON, over the limit of 262144; keep large data outside"
        " the spec (in a file the spec names, for example)"
    )
    # Far over the limit (and over the 1 MiB a request carries): the same refusal, not a
    # usage error about the request frame.
    huge = tmp_path / "huge.json"
    huge.write_text('{"x": "' + "a" * 3_000_000 + '"}')
    far_too_large = piwf.json(
        "resource", "apply", "keeper", "k", "--spec-file", str(huge), *where, exit_code=1
    )
    assert far_too_large["error"] == {
        "code": "resourceSpec",
        "message": "the spec is 3000008 bytes of JSON, over the limit of 262144; keep large data"
        " outside the spec (in a file the spec names, for example)",
    }

    piwf.json("resource", "apply", "keeper", "k", "--spec", "{}", *where)
    wait_for(
        lambda: piwf.json("resource", "get", "keeper", "k")["resource"]["finalizers"],
        timeout_s=30,
        what="the finalizer",
    )
    assert piwf.json("resource", "delete", "keeper", "k")["deleted"] is False
    again = piwf.json("resource", "apply", "keeper", "k", "--spec", "{}", *where, exit_code=1)
    assert again["error"] == {
        "code": "resourceDeleting",
        "message": "resource keeper/k is being deleted: it is removed once its manager drops its"
        " finalizers (piwf resource get keeper k shows how far it is); apply it again after that",
    }

    # The way out of a resource whose manager never drops its finalizers: fix the manager.
    keeper.write_text(KEEPER.format(finalizers=""))
    piwf.json("resource", "reconcile", "keeper", "k")
    wait_for(
        lambda: piwf.run("resource", "get", "keeper", "k").returncode == 1,
        timeout_s=30,
        what="the deletion",
    )


SHOUTER = r"""
from piwf.resource import condition_false, define_resource_manager, settled

def reconcile(ctx, resource):
    if resource.spec.get("fail"):
        raise RuntimeError("\x1b]0;owned\x07boom\n  errors      0\u202e")
    return settled(
        status={"s": "\u202ered\x9b"},
        conditions=[condition_false("Ready", "Bad", "line1\n  FORGED  ROW\x1b[2J")],
    )

manager = define_resource_manager(
    name="shouter", initial_status=lambda spec: {}, reconcile=reconcile
)
"""


def test_resource_get_shows_what_a_manager_wrote_without_driving_the_terminal(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    _, where = project_with_manager(tmp_path, "shouter", SHOUTER)
    piwf.json("resource", "apply", "shouter", "calm", "--spec", "{}", *where)
    piwf.json("resource", "apply", "shouter", "loud", "--spec", '{"fail": true}', *where)
    wait_for(
        lambda: piwf.json("resource", "get", "shouter", "calm")["conditions"],
        timeout_s=30,
        what="the condition",
    )
    failing = last_error(piwf, "shouter", "loud")
    assert "\x1b]0;owned" in failing  # --json keeps the text as stored

    calm = piwf.run("resource", "get", "shouter", "calm")
    loud = piwf.run("resource", "get", "shouter", "loud")
    assert calm.returncode == loud.returncode == 0
    for shown in (calm.stdout, loud.stdout):
        assert not any(character in shown for character in "\x1b\x07\x9b\u202e"), shown
    # A line break the manager wrote forges no row or field line of its own.
    assert "line1\\n  FORGED  ROW\\x1b[2J" in calm.stdout
    assert not [line for line in calm.stdout.splitlines() if line.startswith("  FORGED")]
    assert "RuntimeError: \\x1b]0;owned\\x07boom\\n  errors      0\\u202e" in loud.stdout
    assert len([line for line in loud.stdout.splitlines() if line.startswith("  errors ")]) == 1


HOARDER = """
from piwf.resource import define_resource_manager, settled

def reconcile(ctx, resource):
    ctx.workflows.ensure("render", "hello", {"who": "x" * 2_000_000})
    return settled()

manager = define_resource_manager(
    name="hoarder", initial_status=lambda spec: {}, reconcile=reconcile
)
"""


def test_a_call_over_one_frame_fails_the_reconcile_saying_what_to_do(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    _, where = project_with_manager(tmp_path, "hoarder", HOARDER)
    piwf.json("resource", "apply", "hoarder", "h", "--spec", "{}", *where)
    error = last_error(piwf, "hoarder", "h")
    assert error.startswith("ResourceError: workflow.ensure: the call is 2,000,")
    assert error.endswith(
        " bytes of JSON, over the 1,048,576 bytes (1 MiB) one call carries; nothing was sent."
        " Keep large data outside the request and the input (in a file they name, for example)"
    )
    assert piwf.json("resource", "get", "hoarder", "h")["workflows"] == []


RAISER = """
from piwf.resource import define_resource_manager

def reconcile(ctx, resource):
    raise RuntimeError("the bucket is gone")

manager = define_resource_manager(
    name="raiser", initial_status=lambda spec: {}, reconcile=reconcile
)
"""


def test_a_failed_reconcile_leaves_its_traceback_in_the_reconcile_log(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    module, where = project_with_manager(tmp_path, "raiser", RAISER)
    piwf.json("resource", "apply", "raiser", "r", "--spec", "{}", *where)
    assert last_error(piwf, "raiser", "r") == "RuntimeError: the bucket is gone"
    detail = piwf.json("resource", "get", "raiser", "r")
    # Newest first; a retry still running (it retries) has no result yet.
    failure = next(r for r in detail["reconciles"] if r.get("result") == "failed")
    path = piwf.home / "server" / "runners" / f"{failure['reconcileId']}.log"

    def logged() -> str | None:  # the server copies the child's stderr as it reads it
        text = path.read_text() if path.exists() else ""
        return text if text.rstrip().endswith("RuntimeError: the bucket is gone") else None

    log = wait_for(logged, timeout_s=30, what="the traceback in the reconcile's log")
    assert "Traceback (most recent call last)" in log
    assert f'File "{module.resolve()}", line 5, in reconcile' in log

    # --json names the log as the human form does (a later retry may have failed since).
    runners = piwf.home / "server" / "runners"
    named = rf"{re.escape(str(runners))}/reconcile-[0-9a-f]+\.log"
    assert re.fullmatch(named, piwf.json("resource", "get", "raiser", "r")["traceback"])
    human = piwf.run("resource", "get", "raiser", "r").stdout
    assert re.search(rf"^  traceback +{named}$", human, re.M)


REFUSER = """
from piwf.resource import define_resource_manager, settled

def initial_status(spec):
    return {"phase": spec["phase"]}

manager = define_resource_manager(
    name="refuser", initial_status=initial_status, reconcile=lambda ctx, r: settled()
)
"""

BROKEN_AT_IMPORT = """
def region():
    return {}["region"]

REGION = region()
"""


def test_manager_code_that_raises_names_its_line_and_where_its_traceback_is(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``initial_status`` raising on apply, a manager file that fails at import on apply and
    on a later reconcile: the error names the line of the manager's file, and the full
    traceback is in a log the error (or ``resource get``) names."""
    refuser, where = project_with_manager(tmp_path, "refuser", REFUSER)
    refused = piwf.run("resource", "apply", "refuser", "a", "--spec", "{}", *where)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(
        "Error: manager 'refuser' refused the spec at line 5 of refuser.py: KeyError: 'phase';"
        f" the traceback is in {piwf.home / 'server' / 'runners'}/resolver-"
    ), refused.stderr
    log = Path(refused.stderr.rsplit(" ", 1)[1].strip())
    assert f'File "{refuser.resolve()}", line 5, in initial_status' in log.read_text()
    machine = piwf.json("resource", "apply", "refuser", "a", "--spec", "{}", *where, exit_code=1)
    assert machine["error"]["code"] == "resourceSpec"
    assert "at line 5 of refuser.py" in machine["error"]["message"]
    assert "the traceback is in " in machine["error"]["message"]

    broken, _ = project_with_manager(tmp_path / "b", "broken", BROKEN_AT_IMPORT)
    where = ("--project", str(broken.parent.parent.parent))
    failed = piwf.json("resource", "apply", "broken", "b", "--spec", "{}", *where, exit_code=1)
    message = failed["error"]["message"]
    assert failed["error"]["code"] == "resourceManagerLoad"
    assert f"{broken}: import failed at line 3: KeyError: 'region'" in message
    log = Path(message.rsplit(" ", 1)[1])
    assert f'File "{broken.resolve()}", line 5, in <module>' in log.read_text()

    # A manager that loaded on apply and no longer does: the reconcile's log has the traceback,
    # and `resource get` names that log next to the last error.
    refuser.write_text(REFUSER.replace('spec["phase"]', '"new"'))
    piwf.json(
        "resource",
        "apply",
        "refuser",
        "a",
        "--spec",
        "{}",
        *("--project", str(refuser.parent.parent.parent)),
    )
    wait_for(
        lambda: piwf.json("resource", "get", "refuser", "a")["resource"]["state"] == "settled",
        timeout_s=30,
        what="the resource to settle",
    )
    refuser.write_text(REFUSER + "\nraise RuntimeError('the manager is broken now')\n")
    piwf.json("resource", "reconcile", "refuser", "a")
    error = last_error(piwf, "refuser", "a")
    assert error.endswith("import failed at line 11: RuntimeError: the manager is broken now")
    detail = piwf.json("resource", "get", "refuser", "a")
    # Newest first; a retry still running (it retries) has no result yet.
    failure = next(r for r in detail["reconciles"] if r.get("result") == "failed")
    path = piwf.home / "server" / "runners" / f"{failure['reconcileId']}.log"

    def logged() -> str | None:  # the server copies the child's stderr as it reads it
        text = path.read_text() if path.exists() else ""
        return text if "the manager is broken now" in text else None

    assert f'File "{refuser.resolve()}", line 11, in <module>' in wait_for(
        logged, timeout_s=30, what="the traceback in the reconcile's log"
    )
    human = piwf.run("resource", "get", "refuser", "a")  # the newest failure's log (it retries)
    shown = re.search(r"^  traceback   (\S+)$", human.stdout, re.MULTILINE)
    assert shown is not None, human.stdout
    assert Path(shown[1]).parent == path.parent and "line 11, in <module>" in logged_text(shown[1])


def logged_text(path: str) -> str:
    return Path(path).read_text()


MANY_EFFECTS = """
from piwf.resource import define_resource_manager, settled

def reconcile(ctx, resource):
    for n in range(resource.spec["effects"]):
        ctx.effects.ensure(
            key=f"touch:{n:03d}", kind="noop.touch", request={"n": n},
            observe=lambda signal: "not_applied", apply=lambda signal: "applied",
        )
    return settled(status={"phase": "ready"})

manager = define_resource_manager(
    name="many", initial_status=lambda spec: {"phase": "pending"}, reconcile=reconcile,
)
"""


def test_resource_get_shows_the_newest_effects_and_how_many_there_are(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A resource with more effects than one listing holds: ``resource get`` reads and shows
    the newest 50, oldest first, and says how many there are."""
    _, where = project_with_manager(tmp_path, "many", MANY_EFFECTS)
    piwf.json("resource", "apply", "many", "k", "--spec", '{"effects": 63}', *where)

    def ready() -> object:
        detail = piwf.json("resource", "get", "many", "k")
        return detail if detail["status"].get("phase") == "ready" else None

    detail = wait_for(ready, timeout_s=60, what="the reconcile that made 63 effects")
    assert detail["effectCount"] == 63
    assert detail["reconcileCount"] >= 1 and detail["workflowCount"] == 0
    assert len(detail["effects"]) == 50
    shown = piwf.run("resource", "get", "many", "k").stdout
    assert "effects (50 of 63 shown: the newest, and every one not settled):" in shown
    assert shown.count("noop.touch") == 50
