"""Durable timers and retry policies against a real server, through the installed script and
the Python client.

A ``sleep`` visit commits its wake time and parks the run: no runner child, no slot, and the
server starts it again at that instant (or at its next start, if it was down). A retry policy
keeps each failed try as an attempt and waits out its back-off the same way.
"""

from __future__ import annotations

import itertools
import re
import textwrap
from pathlib import Path
from typing import Any

import psutil

from piwf.client import Client
from tests.cli.test_cli_e2e import Piwf, piwf, processes_of  # noqa: F401 (the fixture)
from tests.server.harness import wait_for

DEADLINE_S = 30.0


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def until(condition: Any, what: str, timeout_s: float = DEADLINE_S) -> Any:
    """Poll ``condition`` until it returns something truthy (the harness's bounded wait)."""
    return wait_for(condition, timeout_s, what)


def runners_of(home: Path, run_id: str) -> list[psutil.Process]:
    """Live runner children executing ``run_id`` (their title names the run)."""
    found = []
    for process in processes_of(home):
        try:
            if f"piwf runner {run_id}" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


NAP = """
    from piwf.workflow import compute, define_workflow, sleep

    workflow = define_workflow(
        name="nap",
        start_at="before",
        nodes={
            "before": compute(lambda ctx: {"n": 1}),
            "nap": sleep(3000),
            "after": compute(lambda ctx: {"woke": ctx.outputs["nap"]}),
        },
        edges=[{"from": "before", "to": "nap"}, {"from": "nap", "to": "after"}],
    )
    """


def test_a_sleeping_run_holds_no_child_and_wakes_across_a_server_restart(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "nap.py", NAP)
    started = piwf.json("run", "start", str(flow))
    run_id = started["run"]["runId"]
    with Client(home=piwf.home) as client:
        view = until(
            lambda: (v := client.run_view(run_id)).display.activity == "sleeping" and v,
            "the run to sleep",
        )
        node = view.display.current_node
        assert node is not None and (node.path, node.node_type) == ("nap", "timer")
        wake_at = view.display.available_at
        assert node.wake_at == wake_at and wake_at is not None
        assert node.started_at is not None and wake_at == node.started_at + 3000
        # The run is running (not waiting for anyone); its display says no runner executes it.
        assert (view.detail.run.status, view.display.status) == ("running", "queued")
        # The runner that parked it exits right after its last call; from then on, asleep,
        # the run holds no child and no slot.
        until(lambda: client.server_status().active_runners == 0, "the parking runner to exit")
        assert runners_of(piwf.home, run_id) == [], "a sleeping run holds no runner"
        assert client.run_view(run_id).display.activity == "sleeping"
    shown = piwf.run("run", "show", run_id)
    assert 'sleeping at node "nap" until' in shown.stdout, shown.stdout
    explained = piwf.json("run", "explain", run_id)
    assert explained["cause"] == "sleeping", explained
    stopped = piwf.run("server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert piwf.run("server", "start").returncode == 0
    waited = piwf.json("run", "wait", run_id, "--timeout", str(DEADLINE_S))
    assert waited["run"]["status"] == "completed", waited
    woke = waited["output"]["woke"]
    assert woke["wake_at_ms"] == wake_at
    assert woke["woke_at_ms"] >= wake_at
    steps = piwf.json("run", "steps", run_id)["steps"]
    assert [(step["path"], step["attempt"]) for step in steps] == [
        ("before", 1),
        ("nap", 1),
        ("after", 1),
    ]


RETRIED = """
    import pathlib, time
    from piwf.workflow import action, compute, define_workflow, idempotent_effect, retry_policy

    LOG = pathlib.Path({log!r})

    def call(ctx):
        with LOG.open("a") as log:
            log.write(f"{{time.time()}}\\n")
        raise ConnectionError("service down")

    workflow = define_workflow(
        name="retried",
        start_at="call",
        nodes={{
            "call": action(
                effect=idempotent_effect("svc.call"),
                run=call,
                retry=retry_policy(
                    max_attempts=3, backoff_ms=400, multiplier=2, retry_on=ConnectionError
                ),
            ),
            "recover": compute(lambda ctx: {{"gave_up": ctx.results["call"].error}}),
        }},
        edges=[{{"from": "call", "switch": {{"on": "$result.outcome",
                                           "cases": {{"failed": "recover"}}}}}}],
    )
    """


def test_a_retry_policy_makes_exactly_its_tries_with_its_backoff_then_routes_the_failure(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    log = tmp_path / "tries.log"
    flow = write(tmp_path / "retried.py", RETRIED.format(log=str(log)))
    started = piwf.json("run", "start", str(flow))
    run_id = started["run"]["runId"]
    with Client(home=piwf.home) as client:
        view = until(
            lambda: (v := client.run_view(run_id)).display.activity == "sleeping" and v,
            "the first back-off",
        )
        node = view.display.current_node
        assert node is not None and (node.path, node.attempt) == ("call", 2)
        assert runners_of(piwf.home, run_id) == [], "a back-off holds no runner"
        assert node.failed_tries == 1
        assert node.last_failure is not None and node.last_failure.message == "service down"
    waited = piwf.json("run", "wait", run_id, "--timeout", str(DEADLINE_S))
    assert waited["run"]["status"] == "completed", waited
    assert waited["output"] == {"gave_up": "ConnectionError: service down"}
    tries = [float(line) for line in log.read_text().split()]
    assert len(tries) == 3, "exactly max_attempts tries"
    gaps = [later - earlier for earlier, later in itertools.pairwise(tries)]
    assert gaps[0] >= 0.4 and gaps[1] >= 0.8, gaps  # 400 ms, then 400 x 2
    steps = piwf.json("run", "steps", run_id)["steps"]
    call = steps[0]
    assert (call["path"], call["outcome"], call["attempt"]) == ("call", "failed", 3)
    earlier = call["earlierTries"]
    assert [(t["attempt"], t["errorType"]) for t in earlier] == [
        (1, "ConnectionError"),
        (2, "ConnectionError"),
    ]
    assert steps[1]["path"] == "recover"
    text = piwf.run("run", "steps", run_id)
    assert "failed (3 tries)" in text.stdout, text.stdout


def test_a_sleeping_run_can_be_cancelled_and_a_resume_before_its_wake_time_sleeps_on(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = write(tmp_path / "long_nap.py", NAP.replace("sleep(3000)", "sleep(600_000)"))
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    with Client(home=piwf.home) as client:
        first = until(
            lambda: (v := client.run_view(run_id)).display.activity == "sleeping" and v,
            "the run to sleep",
        )
        client.pause_run(run_id)
        client.resume_run(run_id)  # available now: a runner wakes it early, it sleeps again
        again = until(
            lambda: (
                (v := client.run_view(run_id)).display.activity == "sleeping"
                and v.revision > first.revision + 2
                and v
            ),
            "the run to sleep again after its resume",
        )
        assert again.display.available_at == first.display.available_at, "the same wake time"
    cancelled = piwf.json("run", "cancel", run_id)
    assert cancelled["run"]["status"] == "cancelled", cancelled
    steps = piwf.json("run", "steps", run_id)["steps"]
    assert [step["path"] for step in steps] == ["before"]


def test_run_show_says_a_run_waits_out_a_retry_back_off_and_why(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A back-off long enough for any machine: the show must find it, then a cancel ends it."""
    log = tmp_path / "tries.log"
    flow = write(
        tmp_path / "retried.py",
        RETRIED.format(log=str(log)).replace(
            "backoff_ms=400", "backoff_ms=600_000, max_backoff_ms=600_000"
        ),
    )
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    retrying = re.compile(
        r'waiting to retry node "call" \(visit 1, try 2\) until [^;]+; '
        r"try 1 failed: ConnectionError: service down"
    )
    until(lambda: retrying.search(piwf.run("run", "show", run_id).stdout), "run show to say retry")
    explained = piwf.run("run", "explain", run_id).stdout
    assert "ConnectionError: service down" in explained, explained
    assert piwf.json("run", "cancel", run_id)["run"]["status"] == "cancelled"
    assert len(log.read_text().splitlines()) == 1, "one try, then the back-off"


HOPELESS = """
    from piwf.workflow import compute, define_workflow, retry_policy

    def dive(depth):
        if depth == 0:
            raise ValueError("no luck " * 1000)
        return dive(depth - 1)  # {pad}

    workflow = define_workflow(
        name="hopeless",
        start_at="try_it",
        nodes={{
            "try_it": compute(
                lambda ctx: dive(40),
                retry=retry_policy(max_attempts=100, backoff_ms=0, max_backoff_ms=0),
            ),
        }},
        edges=[],
    )
    """


def test_a_step_with_a_hundred_large_failed_tries_still_shows(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Each try's record is about 20 KiB (a 4 KiB message, a 16 KiB traceback): all 99 earlier
    # ones would not fit in one answer, so a step carries the latest that fit and the count.
    flow = write(tmp_path / "hopeless.py", HOPELESS.format(pad="_" * 600))
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    waited = piwf.json("run", "wait", run_id, "--timeout", str(DEADLINE_S), exit_code=1)
    assert waited["run"]["status"] == "failed", waited
    step = piwf.json("run", "steps", run_id)["steps"][0]
    assert (step["path"], step["attempt"], step["earlierTriesTotal"]) == ("try_it", 100, 99)
    kept = [t["attempt"] for t in step["earlierTries"]]
    assert kept and kept == list(range(100 - len(kept), 100)), kept  # the latest, oldest first
    shown = piwf.json("run", "show", run_id)
    assert shown["steps"]["steps"][0]["earlierTriesTotal"] == 99
    text = piwf.run("run", "steps", run_id)
    assert text.returncode == 0 and "failed (100 tries)" in text.stdout, text
