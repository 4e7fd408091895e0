"""Fault points: parsing, hit counting, actions and the registry."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import piwf
from piwf import faults


@pytest.fixture(autouse=True)
def disarm() -> Iterator[None]:
    yield
    faults.arm("")


def test_unarmed_points_do_nothing() -> None:
    faults.arm("")
    faults.point("cmd.after_parse")
    assert faults.hits("cmd.after_parse") == 0


def test_a_point_fires_on_its_nth_hit_only() -> None:
    faults.arm("cmd.after_parse@2=raise")
    faults.point("cmd.after_parse")
    with pytest.raises(faults.FaultInjectedError):
        faults.point("cmd.after_parse")
    faults.point("cmd.after_parse")
    assert faults.hits("cmd.after_parse") == 3


def test_a_persistent_point_fires_from_its_nth_hit_on() -> None:
    faults.arm("cmd.before_commit@2+=ioerror")
    faults.point("cmd.before_commit")
    for _ in range(3):
        with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
            faults.point("cmd.before_commit")


@pytest.mark.parametrize(
    ("action", "error"),
    [("busy", sqlite3.OperationalError), ("drop", faults.FaultDropError)],
)
def test_actions_raise_their_errors(action: str, error: type[Exception]) -> None:
    faults.arm(f"backup.before_link@1={action}")
    with pytest.raises(error):
        faults.point("backup.before_link")


def test_hits_are_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "faults.log"
    monkeypatch.setenv("PIWF_FAULTS_LOG", str(log))
    faults.arm("server.after_epoch@1=delay:1")
    faults.point("server.after_epoch")
    assert log.read_text().split()[1:] == ["server.after_epoch", "1", "delay"]


@pytest.mark.parametrize("spec", ["x@0=kill", "x@1=explode", "@1=kill", "x@one=kill"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        faults.arm(spec)


def test_every_registered_point_is_placed_in_the_code() -> None:
    source = "\n".join(path.read_text() for path in Path(piwf.__file__).parent.rglob("*.py"))
    missing = [name for name in sorted(faults.POINTS) if f'faults.point("{name}")' not in source]
    assert missing == []
