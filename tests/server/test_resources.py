"""Managed resources under a real server: real resource-runner children, real signals, real
SQLite. Gate files hold a reconcile or a run at a known point and marker files record what
manager code really did, so nothing here depends on timing (waits poll with a deadline)."""

from __future__ import annotations

import contextlib
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf.client import Client
from piwf.errors import NotFoundError
from piwf.protocol.resource_payloads import ResourceDetail
from piwf.state import StateDatabase
from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for

REPO = Path(__file__).resolve().parents[2]
GREETING = REPO / "fixtures" / "resource_managers" / "greeting.py"
HELLO = str(REPO / "fixtures" / "workflows" / "hello.py")
FINALIZER = "fixtures.piwf/greeting-file"
FAST = {"PIWF_IDLE_EXIT_S": "0", "PIWF_CLAIM_POLL_S": "0.05", "PIWF_RUN_RENEW_S": "0.2"}


@pytest.fixture
def reaper(short_home: Path) -> Iterator[None]:
    """After the test, kill every process still running for this state home (a reconcile
    child ends with a SIGKILLed server by itself; should that ever fail, it must still not
    outlive the test)."""
    yield
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.pid != os.getpid() and process.environ().get("PIWF_HOME") == str(short_home):
                process.kill()
                process.wait(timeout=10)


def project_with(tmp_path: Path, **managers: str) -> Path:
    """A project whose .piwf/resource_managers/ holds the greeting fixture and ``managers``."""
    directory = tmp_path / "project" / ".piwf" / "resource_managers"
    directory.mkdir(parents=True)
    (directory / "greeting.py").symlink_to(GREETING)
    for name, source in managers.items():
        (directory / f"{name}.py").write_text(textwrap.dedent(source))
    return tmp_path / "project"


def query(home: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        return [tuple(row) for row in tx.all(sql, params)]


def converged(client: Client, key: str, generation: int) -> ResourceDetail | None:
    detail = client.get_resource("greeting", key)
    info = detail.resource
    done = info.state == "settled" and info.observed_generation == generation
    return detail if done and detail.status.get("phase") == "ready" else None


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def start(servers: ServerFactory, **env: str) -> ServerProcess:
    server = servers.start(env={**FAST, **env})
    assert server.ready["ok"] is True, server.ready
    return server


@pytest.mark.usefixtures("reaper")
def test_a_resource_converges_takes_a_new_generation_and_is_deleted_by_its_finalizer(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start(servers)
    out = tmp_path / "out"
    out.mkdir()
    project = project_with(tmp_path)
    spec = {"dir": str(out), "name": "ada"}
    with Client(home=server.home, autostart=False) as client:
        created = client.apply_resource("greeting", "ada", spec, project=project)
        assert created.outcome == "created"
        assert (created.resource.generation, created.resource.resource_version) == (1, 1)
        detail = wait_for(lambda: converged(client, "ada", 1), timeout_s=30, what="generation 1")
        assert (out / "ada.txt").read_text() == "HELLO ADA\n"
        assert detail.resource.finalizers == [FINALIZER]
        assert detail.resource.ready == "True"
        assert [(c.type, c.status, c.observed_generation) for c in detail.conditions] == [
            ("Ready", "True", 1)
        ]
        assert [w.state for w in detail.workflows] == ["succeeded"]
        assert [(e.effect_type, e.status, e.recovery) for e in detail.effects] == [
            ("file.write", "applied", "observe")
        ]

        assert client.apply_resource("greeting", "ada", spec, project=project).outcome == (
            "unchanged"
        )
        changed = client.apply_resource("greeting", "ada", {**spec, "name": "bob"}, project=project)
        assert (changed.outcome, changed.resource.generation) == ("updated", 2)
        wait_for(lambda: converged(client, "ada", 2), timeout_s=30, what="generation 2")
        assert (out / "ada.txt").read_text() == "HELLO BOB\n"
        assert lines(out / "applies.log") == ["ada generation 1", "ada generation 2"]

        deleting = client.delete_resource("greeting", "ada")
        assert deleting.deleted is False
        assert deleting.resource.state == "deleting"

        def gone() -> bool:
            try:
                client.get_resource("greeting", "ada")
            except NotFoundError:
                return True
            return False

        wait_for(gone, timeout_s=30, what="the finalized deletion")
        assert not (out / "ada.txt").exists()
        assert client.list_resources() == []
        with pytest.raises(NotFoundError):
            client.reconcile_resource("greeting", "ada")
    events = [
        row[0]
        for row in query(
            server.home,
            "SELECT event_type FROM events e JOIN"
            " resources r ON r.resource_id = e.resource_id WHERE r.resource_type ="
            " 'managed_resource' ORDER BY e.event_seq",
        )
    ]
    assert events[0] == "resource.created"
    assert "resource.spec_changed" in events
    assert "resource.deletion_requested" in events
    assert events[-1] == "resource.deleted"


# conformance: S7
@pytest.mark.usefixtures("reaper")
def test_a_server_killed_mid_reconcile_never_repeats_the_effect(
    servers: ServerFactory, tmp_path: Path
) -> None:
    first = start(servers)
    out, gate = tmp_path / "out", tmp_path / "never-opened"
    out.mkdir()
    project = project_with(tmp_path)
    spec = {"dir": str(out), "name": "ada", "hold": str(gate)}
    with Client(home=first.home, autostart=False) as client:
        client.apply_resource("greeting", "ada", spec, project=project)
    # The apply wrote the file and now holds, so the effect is `applying` when the server dies.
    wait_for(lambda: lines(out / "applies.log"), timeout_s=30, what="the first write")
    live = query(
        first.home,
        "SELECT pid FROM managed_resource_runners WHERE status IN ('starting', 'running')",
    )
    assert len(live) == 1
    orphan = psutil.Process(live[0][0])
    first.kill()
    second = start(servers)
    assert second.ready["epoch"] == 2

    def reaped() -> bool:
        try:
            return orphan.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(reaped, timeout_s=15, what="recovery to kill the orphaned reconcile")
    with Client(home=second.home, autostart=False) as client:
        wait_for(lambda: converged(client, "ada", 1), timeout_s=30, what="convergence")
    assert lines(out / "applies.log") == ["ada generation 1"], "the write ran twice"
    outcomes = query(
        second.home,
        "SELECT a.outcome FROM effect_attempts a JOIN effects e ON e.effect_id = a.effect_id"
        " WHERE e.effect_type = 'file.write' ORDER BY a.attempt_number",
    )
    assert outcomes == [("interrupted",), ("applied",)]  # the second attempt only observed
    statuses = {row[0] for row in query(second.home, "SELECT status FROM managed_resource_runners")}
    assert "orphaned" in statuses


GATED_MANAGER = """
import pathlib, time
from piwf.resource import define_resource_manager, settled

def reconcile(ctx, resource):
    folder = pathlib.Path(resource.spec["dir"])
    (folder / f"entered-res-{resource.key}").touch()
    deadline = time.monotonic() + 60
    while not (folder / f"gate-res-{resource.key}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return settled(status={"done": True})

manager = define_resource_manager(
    name="gated", initial_status=lambda spec: {}, reconcile=reconcile, timeout_ms=60_000
)
"""


def gated_workflow(directory: Path) -> str:
    path = directory / "gated_run.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import pathlib, time
            from piwf.workflow import compute, define_workflow

            def hold(ctx):
                folder = pathlib.Path({str(directory)!r})
                (folder / f"entered-run-{{ctx.input['n']}}").touch()
                deadline = time.monotonic() + 60
                gate = folder / f"gate-run-{{ctx.input['n']}}"
                while not gate.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                return {{"n": ctx.input["n"]}}

            workflow = define_workflow(
                name="gated", start_at="hold", nodes={{"hold": compute(hold)}}, edges=[]
            )
            """
        )
    )
    return str(path)


def live_kinds(home: Path) -> list[str]:
    runs = query(
        home, "SELECT 'run' FROM run_runners WHERE status IN ('starting','ready','running')"
    )
    reconciles = query(
        home,
        "SELECT 'reconcile' FROM managed_resource_runners WHERE status IN ('starting','running')",
    )
    return sorted(row[0] for row in runs + reconciles)


def most_at_once(home: Path) -> int:
    """The largest number of children of both kinds that were live at the same instant."""
    spans = query(home, "SELECT started_at, finished_at FROM run_runners") + query(
        home, "SELECT started_at, finished_at FROM managed_resource_runners"
    )
    points = sorted(
        [(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans if end is not None],
        key=lambda point: (point[0], point[1]),  # an exit frees its slot before a launch
    )
    live = most = 0
    for _, step in points:
        live += step
        most = max(most, live)
    return most


# conformance: X15
@pytest.mark.usefixtures("reaper")
def test_admissions_alternate_and_capacity_is_never_exceeded(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start(servers, PIWF_MAX_WORKERS="2")
    marks = tmp_path / "marks"
    marks.mkdir()
    project = project_with(tmp_path, gated=GATED_MANAGER)
    workflow = gated_workflow(marks)
    with raw_client(server) as raw, Client(home=server.home, autostart=False) as client:

        def start_run(n: int) -> None:
            response = raw.request(
                "run.start", {"workflow": workflow, "input": {"n": n}}, key=f"r{n}"
            )
            assert response.outcome == "accepted", response

        # Two runs fill both slots; then three more runs and three resources wait together.
        for n in (0, 1):
            start_run(n)
        wait_for(
            lambda: (marks / "entered-run-0").exists() and (marks / "entered-run-1").exists(),
            timeout_s=30,
            what="both slots busy",
        )
        for n in (2, 3, 4):
            start_run(n)
        for key in ("a", "b", "c"):
            client.apply_resource("gated", key, {"dir": str(marks)}, project=project)
        assert live_kinds(server.home) == ["run", "run"]

        def kinds_are(expected: list[str]) -> bool:
            return live_kinds(server.home) == expected

        # Both slots free up: one goes to each kind (alternation, not run priority).
        (marks / "gate-run-0").touch()
        (marks / "gate-run-1").touch()
        wait_for(lambda: kinds_are(["reconcile", "run"]), timeout_s=30, what="one of each")

        # A run's slot frees up while runs still wait: the last admission was a run, so this
        # slot goes to a reconcile.
        def entered(names: list[str]) -> str | None:
            return next((name for name in names if (marks / f"entered-{name}").exists()), None)

        running = wait_for(lambda: entered(["run-2", "run-3", "run-4"]), what="a waiting run")
        (marks / f"gate-{running}").touch()
        wait_for(lambda: kinds_are(["reconcile", "reconcile"]), timeout_s=30, what="two reconciles")
        # And a reconcile's slot goes back to a run.
        first = wait_for(lambda: entered(["res-a", "res-b", "res-c"]), what="a reconcile")
        (marks / f"gate-{first}").touch()
        wait_for(lambda: kinds_are(["reconcile", "run"]), timeout_s=30, what="a run again")
        for name in ("run-2", "run-3", "run-4", "res-a", "res-b", "res-c"):
            (marks / f"gate-{name}").touch()

        def all_done() -> bool:
            infos = client.list_resources()
            runs = raw.request("run.list", {}).receipt or {}
            statuses = [run["status"] for run in runs.get("runs", [])]
            return (
                len(infos) == 3
                and all(info.state == "settled" for info in infos)
                and statuses.count("completed") == 5
                and not live_kinds(server.home)
            )

        wait_for(all_done, timeout_s=60, what="every run and reconcile to finish")
    assert most_at_once(server.home) == 2


STUCK_MANAGER = """
import pathlib, time
from piwf.resource import define_resource_manager, settled

def reconcile(ctx, resource):
    pathlib.Path(resource.spec["marker"]).touch()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:   # ignores ctx.signal on purpose
        time.sleep(0.05)
    return settled()

manager = define_resource_manager(
    name="stuck", initial_status=lambda spec: {}, reconcile=reconcile, timeout_ms=400
)
"""


@pytest.mark.usefixtures("reaper")
def test_a_reconcile_that_blocks_forever_is_stopped_at_its_deadline_and_requeued(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start(servers, PIWF_MAX_WORKERS="1", PIWF_RECONCILE_GRACE_S="0.2")
    project = project_with(tmp_path, stuck=STUCK_MANAGER)
    marker = tmp_path / "entered"
    with raw_client(server) as raw, Client(home=server.home, autostart=False) as client:
        client.apply_resource("stuck", "s", {"marker": str(marker)}, project=project)
        wait_for(marker.exists, timeout_s=30, what="the stuck reconcile")
        started = raw.request("run.start", {"workflow": HELLO, "input": {"who": "x"}}, key="h")
        run_id = (started.receipt or {})["run"]["runId"]
        waited = raw.request("run.wait", {"timeoutMs": 30_000}, run_id=run_id)
        assert (waited.receipt or {})["run"]["status"] == "completed"

        def backing_off() -> Any:
            queue = client.get_resource("stuck", "s").resource.queue
            return queue if queue is not None and queue.consecutive_errors >= 1 else None

        queue = wait_for(backing_off, timeout_s=15, what="the timed-out reconcile's backoff")
    assert queue.reason == "error"
    assert "deadline" in (queue.last_error or "")
    rows = query(
        server.home,
        "SELECT status, result FROM managed_resource_runners ORDER BY started_at LIMIT 1",
    )
    assert rows == [("timedOut", "failed")]
    assert server.alive()


@pytest.mark.usefixtures("reaper")
def test_bad_input_is_refused_with_a_typed_error_and_changes_nothing(
    server: ServerProcess, tmp_path: Path
) -> None:
    project = str(project_with(tmp_path))
    good = {"dir": str(tmp_path), "name": "ada"}
    cases = [
        ({"manager": "nobody", "key": "k", "spec": good}, "rejected", "resourceManagerLoad"),
        ({"manager": "greeting", "key": "k", "spec": {"dir": 1}}, "rejected", "resourceSpec"),
        (
            {"manager": "greeting", "key": "k", "spec": {"x": "y" * 300_000}},
            "rejected",
            "resourceSpec",
        ),
        ({"manager": "greeting", "key": "k", "spec": [1, 2]}, "rejected", "invalidPayload"),
        (
            {"manager": "greeting", "key": "k", "spec": good, "bogus": 1},
            "rejected",
            "invalidPayload",
        ),
        ({"manager": "Greeting", "key": "k", "spec": good}, "rejected", "invalidPayload"),
        ({"manager": "greeting", "key": "has space", "spec": good}, "rejected", "invalidPayload"),
        ({"manager": "greeting", "spec": good}, "rejected", "invalidPayload"),
    ]
    with raw_client(server) as raw:
        for number, (payload, outcome, code) in enumerate(cases):
            response = raw.request(
                "resource.apply", {**payload, "projectPath": project}, key=f"bad-{number}"
            )
            assert (response.outcome, response.error and response.error.code) == (outcome, code), (
                payload.keys(),
                response,
            )
        assert raw.request("resource.list", {}).receipt == {"resources": []}
        missing = raw.request("resource.get", {"manager": "greeting", "key": "k"})
        assert (missing.outcome, missing.error and missing.error.code) == (
            "notFound",
            "resourceNotFound",
        )
        deleted = raw.request("resource.delete", {"manager": "greeting", "key": "k"}, key="d")
        assert deleted.outcome == "notFound"
    assert query(server.home, "SELECT count(*) FROM managed_resources") == [(0,)]


@pytest.mark.usefixtures("reaper")
def test_a_load_that_blocks_is_stopped_at_the_resolver_deadline_and_names_what_it_loaded(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start(servers, PIWF_RESOLVER_TIMEOUT_S="0.5")
    project = project_with(
        tmp_path,
        stalls="""
        import time
        from piwf.resource import define_resource_manager, settled

        manager = define_resource_manager(
            name="stalls",
            initial_status=lambda spec: time.sleep(3600),
            reconcile=lambda ctx, resource: settled(),
        )
        """,
    )
    workflow = tmp_path / "stalls_at_import.py"
    workflow.write_text("import time\ntime.sleep(3600)\n")
    apply = {"manager": "stalls", "key": "k", "spec": {}, "projectPath": str(project)}
    with raw_client(server) as client:
        applied = client.request("resource.apply", apply, key="apply-stalls")
        started = client.request("run.start", {"workflow": str(workflow), "input": {}}, key="s")
    for answer, subject, blocks in (
        (applied, "resource manager 'stalls'", "its module or initial_status"),
        (started, str(workflow), "its module, when imported,"),
    ):
        assert answer.outcome == "unavailable", answer
        assert answer.error is not None and answer.error.code == "resolverFailed"
        assert answer.error.message == (
            f"loading {subject} took longer than 0.5 s and was stopped; does {blocks} wait on "
            "something (a network call, a sleep, a lock)? Fix that and try again, or give the "
            "server more time with PIWF_RESOLVER_TIMEOUT_S"
        )
    assert query(server.home, "SELECT count(*) FROM managed_resources") == [(0,)]


@pytest.mark.usefixtures("reaper")
def test_a_manager_whose_initial_status_exits_is_refused_naming_initial_status(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start(servers)
    project = project_with(
        tmp_path,
        leaves="""
        import os
        from piwf.resource import define_resource_manager, settled

        manager = define_resource_manager(
            name="leaves",
            initial_status=lambda spec: os._exit(3),
            reconcile=lambda ctx, resource: settled(),
        )
        """,
    )
    apply = {"manager": "leaves", "key": "k", "spec": {}, "projectPath": str(project)}
    with raw_client(server) as client:
        applied = client.request("resource.apply", apply, key="apply-leaves")
    assert applied.outcome == "rejected", applied
    assert applied.error is not None
    assert applied.error.message.startswith(
        "the resolver child exited with code 3 while loading resource manager 'leaves' (does the"
        " module call os._exit or exit at import or in its initial_status?)"
    ), applied.error.message
    assert query(server.home, "SELECT count(*) FROM managed_resources") == [(0,)]


UNSURE = """
from piwf.resource import EffectIndeterminateError, define_resource_manager, requeue_after, settled

def reconcile(ctx, resource):
    try:
        record = ctx.effects.ensure(
            key="post", kind="chat.post", request={},
            observe=lambda signal: "indeterminate", apply=lambda signal: "applied",
        )
    except EffectIndeterminateError:  # look again in an hour: only an operator can tell
        return requeue_after(3_600_000, status={"effect": "ambiguous"})
    return settled(status={"effect": "applied" if record.applied else "not applied"})

manager = define_resource_manager(
    name="unsure", initial_status=lambda spec: {}, reconcile=reconcile
)
"""


@pytest.mark.usefixtures("reaper")
def test_resolving_a_resource_effect_reconciles_its_resource_at_once(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start(servers)
    project = project_with(tmp_path, unsure=UNSURE)
    with Client(home=server.home, autostart=False) as client:
        client.apply_resource("unsure", "k", {}, project=project)

        def parked() -> ResourceDetail | None:
            detail = client.get_resource("unsure", "k")
            waiting = detail.status == {"effect": "ambiguous"}
            return detail if waiting and detail.effects[0].status == "ambiguous" else None

        detail = wait_for(parked, timeout_s=30, what="the ambiguous effect")
        effect = detail.effects[0]
        # A retry is an event too: the next reconcile observes again (still unsure) at once.
        assert client.resolve_effect(effect.effect_id, "retry").status == "pending"

        def observed_again() -> ResourceDetail | None:
            found = parked()
            return (
                found if found and found.effects[0].attempt_count > effect.attempt_count else None
            )

        again = wait_for(
            observed_again, timeout_s=30, what="a reconcile after the retry, not in an hour"
        )
        assert again.reconcile_count > detail.reconcile_count
        assert client.resolve_effect(effect.effect_id, "applied").status == "applied"
        wait_for(
            lambda: client.get_resource("unsure", "k").status == {"effect": "applied"},
            timeout_s=30,
            what="the reconcile that adopts the settled effect",
        )
